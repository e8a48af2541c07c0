#pragma once
// Finds and opens libnccl at run time (never at import, never at build time). No CUDA headers:
// compiled into every Linux build, CPU-only ones too.
//
// Search order (the first candidate that loads, has every symbol and is new enough wins):
//  1. PYCOLLECTIVE_NCCL_LIBRARY: a file, or a folder holding libnccl.so.2. When set it is the
//     only candidate: an explicit choice never silently falls back to another library.
//  2. The lib folders of the nvidia-nccl-cu13 / nvidia-nccl-cu12 wheels, found by the Python
//     side (importlib) and passed in with setWheelDirs().
//  3. libnccl.so.2 through the system loader (LD_LIBRARY_PATH, ld.so.cache).
// If none works, NcclUnavailable lists every candidate with the loader's error text.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dynlib.h"
#include "cuda/nccl_api.h"

namespace pycollective {
namespace nccl {

struct Candidate {
  std::string path;    // what dlopen is given
  std::string origin;  // "PYCOLLECTIVE_NCCL_LIBRARY", "nvidia-nccl-cu12 wheel", "system loader"
};

class Library {
 public:
  // The candidates in search order. `env` is PYCOLLECTIVE_NCCL_LIBRARY's value ("" = unset);
  // wheelDirs are (folder, origin) pairs.
  static std::vector<Candidate> searchOrder(
      const std::string& env, const std::vector<std::pair<std::string, std::string>>& wheelDirs);

  // Tries the candidates in order; throws NcclUnavailable naming each one and why it failed.
  static std::unique_ptr<Library> open(const std::vector<Candidate>& candidates);

  const Api& api() const { return api_; }
  int version() const { return version_; }
  std::string versionString() const;
  // The file that was loaded (resolved by the loader) and the candidate's origin.
  const std::string& path() const { return path_; }
  const std::string& origin() const { return origin_; }

 private:
  Library() = default;
  // Resolves every symbol and checks the version; "" on success, else why not.
  std::string bind();

  DynamicLibrary lib_;
  Api api_{};
  int version_ = 0;
  std::string path_, origin_;
};

// "2.21.5" from an ncclGetVersion code (both the pre-2.9 and the current encoding).
std::string versionString(int code);

// The wheel folders the Python side found (call before first use; later calls only matter
// while the library is not loaded yet).
void setWheelDirs(std::vector<std::pair<std::string, std::string>> dirs);

// The process's NCCL: opened on first call with the search order above, then kept for the life
// of the process (unloading NCCL under live communicators is never safe, so this is the one
// process-wide object here). A failure is not remembered: fixing the environment and calling
// again retries. Throws NcclUnavailable.
const Library& library();

// True when library() would succeed now (loads it as a side effect); never throws.
bool available();

}  // namespace nccl
}  // namespace pycollective

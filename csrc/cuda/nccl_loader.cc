#include "cuda/nccl_loader.h"

#include <sys/stat.h>

#include <mutex>
#include <sstream>

#include "core/error.h"
#include "core/knobs.h"

namespace pycollective {
namespace nccl {

namespace {

constexpr const char* kSoname = "libnccl.so.2";

bool isDirectory(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string joinPath(const std::string& dir, const std::string& file) {
  if (dir.empty() || dir.back() == '/') return dir + file;
  return dir + "/" + file;
}

template <typename Fn>
bool resolve(const DynamicLibrary& lib, const char* name, Fn* slot, std::string* missing) {
  std::string error;
  void* sym = lib.symbol(name, &error);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *slot = reinterpret_cast<Fn>(sym);
  return true;
}

std::mutex& libraryMutex() {
  static std::mutex mu;
  return mu;
}

struct ProcessState {
  std::vector<std::pair<std::string, std::string>> wheelDirs;
  std::unique_ptr<Library> library;  // never reset once set
};

ProcessState& state() {
  static ProcessState* s = new ProcessState();  // outlives every communicator
  return *s;
}

}  // namespace

std::string versionString(int code) {
  int major, minor, patch;
  if (code >= 20900) {
    major = code / 10000;
    minor = (code % 10000) / 100;
    patch = code % 100;
  } else {
    major = code / 1000;
    minor = (code % 1000) / 100;
    patch = code % 100;
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::vector<Candidate> Library::searchOrder(
    const std::string& env, const std::vector<std::pair<std::string, std::string>>& wheelDirs) {
  std::vector<Candidate> out;
  if (!env.empty()) {
    out.push_back({isDirectory(env) ? joinPath(env, kSoname) : env, "PYCOLLECTIVE_NCCL_LIBRARY"});
    return out;
  }
  for (const auto& [dir, origin] : wheelDirs) out.push_back({joinPath(dir, kSoname), origin});
  out.push_back({kSoname, "system loader"});
  return out;
}

std::string Library::bind() {
  std::string missing;
  Api& a = api_;
  resolve(lib_, "ncclGetVersion", &a.getVersion, &missing);
  resolve(lib_, "ncclGetUniqueId", &a.getUniqueId, &missing);
  resolve(lib_, "ncclCommInitRankConfig", &a.commInitRankConfig, &missing);
  resolve(lib_, "ncclCommFinalize", &a.commFinalize, &missing);
  resolve(lib_, "ncclCommDestroy", &a.commDestroy, &missing);
  resolve(lib_, "ncclCommAbort", &a.commAbort, &missing);
  resolve(lib_, "ncclCommGetAsyncError", &a.commGetAsyncError, &missing);
  resolve(lib_, "ncclGetErrorString", &a.getErrorString, &missing);
  resolve(lib_, "ncclGetLastError", &a.getLastError, &missing);
  resolve(lib_, "ncclCommCount", &a.commCount, &missing);
  resolve(lib_, "ncclCommCuDevice", &a.commCuDevice, &missing);
  resolve(lib_, "ncclCommUserRank", &a.commUserRank, &missing);
  resolve(lib_, "ncclAllReduce", &a.allReduce, &missing);
  resolve(lib_, "ncclBroadcast", &a.broadcast, &missing);
  resolve(lib_, "ncclReduce", &a.reduce, &missing);
  resolve(lib_, "ncclAllGather", &a.allGather, &missing);
  resolve(lib_, "ncclReduceScatter", &a.reduceScatter, &missing);
  resolve(lib_, "ncclGroupStart", &a.groupStart, &missing);
  resolve(lib_, "ncclGroupEnd", &a.groupEnd, &missing);
  if (!missing.empty()) {
    std::string hint;
    if (a.getVersion != nullptr && a.getVersion(&version_) == kSuccess)
      hint = " (it reports NCCL " + nccl::versionString(version_) + ")";
    return "loaded, but it lacks " + missing + hint + ": not NCCL, or NCCL older than " +
           nccl::versionString(kMinVersion);
  }
  const Result r = a.getVersion(&version_);
  if (r != kSuccess) return "loaded, but ncclGetVersion failed with code " + std::to_string(r);
  if (version_ < kMinVersion)
    return "loaded NCCL " + nccl::versionString(version_) + ", older than the minimum " +
           nccl::versionString(kMinVersion);
  return "";
}

std::unique_ptr<Library> Library::open(const std::vector<Candidate>& candidates) {
  std::ostringstream tried;
  for (const Candidate& c : candidates) {
    std::string error;
    DynamicLibrary lib = DynamicLibrary::open(c.path, &error);
    if (!lib.loaded()) {
      tried << "\n  " << c.path << " (" << c.origin << "): " << error;
      continue;
    }
    std::unique_ptr<Library> l(new Library());
    l->lib_ = std::move(lib);
    const std::string why = l->bind();
    if (!why.empty()) {
      tried << "\n  " << c.path << " (" << c.origin << "): " << why;
      continue;
    }
    l->path_ = l->lib_.resolvedPath("ncclGetVersion");
    l->origin_ = c.origin;
    return l;
  }
  throw NcclUnavailable(
      "NCCL is not available; tried, in order:" + tried.str() +
      "\nInstall it with `pip install nvidia-nccl-cu12` (or -cu13, matching your CUDA; the "
      "pycollective[cuda12] / [cuda13] extras do this), or set PYCOLLECTIVE_NCCL_LIBRARY to the "
      "path of libnccl.so.2 (NCCL >= " +
      nccl::versionString(kMinVersion) + ").");
}

std::string Library::versionString() const {
  return nccl::versionString(version_);
}

void setWheelDirs(std::vector<std::pair<std::string, std::string>> dirs) {
  std::lock_guard<std::mutex> lock(libraryMutex());
  state().wheelDirs = std::move(dirs);
}

const Library& library() {
  std::lock_guard<std::mutex> lock(libraryMutex());
  ProcessState& s = state();
  if (!s.library)
    s.library = Library::open(Library::searchOrder(knobs::text(knobs::kNcclLibrary), s.wheelDirs));
  return *s.library;
}

bool available() {
  try {
    library();
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace nccl
}  // namespace pycollective

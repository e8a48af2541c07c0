#include "transport/cross_memory.h"

#include <errno.h>
#include <sys/types.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/uio.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace pycollective {
namespace cross_memory {

std::string letSiblingsRead(const char* scopeFile) {
#ifdef __linux__
  char scope = '0';
  if (FILE* f = std::fopen(scopeFile, "r")) {
    if (std::fread(&scope, 1, 1, f) != 1) scope = '0';
    std::fclose(f);
  } else {
    return "";  // no Yama: nothing restricts siblings beyond the user
  }
  if (scope == '0') return "";
  // Scope 2 and 3 refuse anyway (2 but to CAP_SYS_PTRACE), whatever this process allows.
  if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
    return std::string("Yama's ptrace_scope is ") + scope +
           " and PR_SET_PTRACER_ANY failed: " + std::strerror(errno);
  return std::string("Yama's ptrace_scope is ") + scope +
         ": this process lets its user's processes read it (PR_SET_PTRACER_ANY)";
#else
  (void)scopeFile;
  return "";
#endif
}

int read(int pid, const void* remote, void* local, size_t bytes) {
#ifdef __linux__
  // One call moves at most what its iovec says and may stop short (a read that crosses into
  // an unmapped page, or a signal): the rest follows in further calls.
  constexpr size_t kMaxBytesPerCall = size_t(1) << 30;
  auto* to = static_cast<char*>(local);
  auto* from = static_cast<const char*>(remote);
  while (bytes > 0) {
    const size_t want = std::min(bytes, kMaxBytesPerCall);
    iovec dst{to, want};
    iovec src{const_cast<char*>(from), want};
    const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid), &dst, 1, &src, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    to += got;
    from += got;
    bytes -= static_cast<size_t>(got);
  }
  return 0;
#else
  (void)pid, (void)remote, (void)local, (void)bytes;
  return ENOSYS;
#endif
}

}  // namespace cross_memory
}  // namespace pycollective

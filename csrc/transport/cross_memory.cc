#include "transport/cross_memory.h"

#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>

namespace pycollective {
namespace cross_memory {

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

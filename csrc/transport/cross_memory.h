#pragma once
// Reads from another process's memory (Linux cross-memory attach, process_vm_readv): one copy
// from a peer's buffer into this process's, where a shared segment takes two (into the segment
// and out of it). The kernel allows it between processes of one user that may trace each other
// (no Yama restriction, no seccomp filter against it, the same pid namespace); a host's ranks
// agree on it before any of them relies on it (HostSegment::membersReadEachOther).
#include <cstddef>

namespace pycollective {
namespace cross_memory {

// Copies `bytes` from address `remote` of process `pid` into `local`. Returns 0, or the errno
// of the first read that failed (EPERM: not allowed; ESRCH: no such process; EFAULT: an address
// outside either process's mappings; ENOSYS: no such call).
int read(int pid, const void* remote, void* local, size_t bytes);

}  // namespace cross_memory
}  // namespace pycollective

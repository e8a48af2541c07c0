#pragma once
// Reads from another process's memory (Linux cross-memory attach, process_vm_readv): one copy
// from a peer's buffer into this process's, where a shared segment takes two (into the segment
// and out of it). The kernel allows it between processes of one user that may trace each other
// (Yama at ptrace_scope 0, or 1 with letSiblingsRead; no seccomp filter against it; the same
// pid namespace); a host's ranks agree on it before any of them relies on it
// (HostSegment::membersReadEachOther).
#include <cstddef>
#include <string>

namespace pycollective {
namespace cross_memory {

// Where Yama restricts tracing to a process's descendants (ptrace_scope 1, Ubuntu's default),
// no rank may read a sibling: this process then lets any process of its user trace it
// (PR_SET_PTRACER_ANY), as Open MPI's and MPICH's cross-memory transports do. The
// narrower PR_SET_PTRACER <pid> names one process alone, and a rank in two groups of two
// would take its first peer's right away with the second's. Returns what it did or why not,
// for the log; `scopeFile` is Yama's setting (a test names another file).
std::string letSiblingsRead(const char* scopeFile = "/proc/sys/kernel/yama/ptrace_scope");

// Copies `bytes` from address `remote` of process `pid` into `local`. Returns 0, or the errno
// of the first read that failed (EPERM: not allowed; ESRCH: no such process; EFAULT: an address
// outside either process's mappings; ENOSYS: no such call).
int read(int pid, const void* remote, void* local, size_t bytes);

}  // namespace cross_memory
}  // namespace pycollective

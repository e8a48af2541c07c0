#pragma once
// What the shared-memory transports (shm.cc: one segment per pair of ranks; host_segment.cc:
// one segment per host) both need: telling whether the process on the other side still lives,
// passing an abort's reason through the segment, and checking the segment's authentication.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pycollective {
namespace shm {

constexpr size_t kDigestBytes = 32;
constexpr size_t kReasonBytes = 1024;  // an abort's reason, e.g. a header mismatch with both calls

// This process's start time (clock ticks since boot, /proc/self/stat); 0 if unknown. Stored in
// the segment beside the pid, so that a peer can tell a reused pid from the process it knew.
uint64_t ownStartTicks();

// Whether `pid` names the peer process as seen from here. Not so when the peer lives in another
// pid namespace (containers sharing /dev/shm): its pid then means nothing here, and watching it
// would report a live peer as dead.
bool pidNamesPeer(pid_t pid, uint64_t startTicks);

// Whether the process with this pid and start time has died (exited, a zombie not yet reaped,
// or gone with its pid reused since).
bool processDied(pid_t pid, uint64_t startTicks);

// reason[] in a segment holds at most kReasonBytes - 1 characters, NUL-terminated; a longer
// reason is cut and ends in "...".
void storeReason(char* dst, const std::string& reason) noexcept;
std::string loadReason(const char* src);

// Constant time, so that a forged digest learns nothing from how long the refusal took.
bool sameDigest(const unsigned char* a, const unsigned char* b);

// "what: strerror(err)"
std::string sysError(const std::string& what, int err);

}  // namespace shm
}  // namespace pycollective

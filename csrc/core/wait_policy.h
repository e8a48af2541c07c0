#pragma once
// How a rank spends the time while it waits for a peer's store or message: spin briefly (small
// messages arrive within microseconds), then yield (the peer may need this core), then sleep in
// pauses that grow to 1 ms. Communicator::waitAll and the host segment's wait (transport/
// host_segment.cc) both follow it; waitAll also sleeps on doorbells and sockets where it can.
#include <algorithm>
#include <chrono>

#include "core/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pycollective {

// One round of a spinning wait.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// How long to spin before yielding when `ranksOnHost` ranks share this host. More ranks than
// cores: the peer a rank waits for is often parked on this very core, and spinning only delays
// it. Yield at once (as Open MPI does when oversubscribed): 4 ranks on 2 cores, a prepared
// 8-byte allreduce timed after a barrier went from 54-76 us with a 5 us spin to 23-24 us.
inline double spinSecondsFor(int ranksOnHost) {
  return ranksOnHost > hostCores() ? 0.0 : 5e-6;
}

// How long a wait that polls shared memory (no doorbell, no socket) yields before it sleeps: a
// sleeping shm receiver wakes late, and a stream of large messages then runs at the pace of the
// sleeps (measured: a 64 MiB allreduce 3x slower with a shorter yield).
constexpr double kPollingYieldSeconds = 2e-3;

// The sleep after `idleSeconds` of waiting: growing with the wait, at most 1 ms.
inline std::chrono::microseconds sleepPause(double idleSeconds) {
  return std::chrono::microseconds(std::min<long>(1000, static_cast<long>(idleSeconds * 1e4)));
}

}  // namespace pycollective

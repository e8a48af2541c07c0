#include "core/core_distance.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace pycollective {

namespace {

bool pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

// The whole measurement takes milliseconds; past this it is abandoned (-1).
constexpr auto kGiveUpAfter = std::chrono::seconds(2);

}  // namespace

double cacheLineRoundTripNs(int cpuA, int cpuB, int rounds, int batches) {
  // On one CPU the two spinning threads would take turns by the scheduler's slices: milliseconds
  // a round trip, seconds a measurement, and nothing learned about the caches.
  if (rounds < 1 || batches < 1 || cpuA < 0 || cpuB < 0 || cpuA >= CPU_SETSIZE ||
      cpuB >= CPU_SETSIZE || cpuA == cpuB)
    return -1;
  // The line both threads write, alone on its line and the next (adjacent-line prefetch). Shared
  // with the partner, which outlives this call when it never got its CPU (detached below).
  struct alignas(128) Shared {
    std::atomic<long> ball{0};
    std::atomic<int> pinned{0};  // 1 once the partner is pinned; -1 if it could not be
  };
  const auto shared = std::make_shared<Shared>();
  std::atomic<long>& ball = shared->ball;
  std::atomic<int>& pinned = shared->pinned;
  std::vector<double> perBatch;
  std::thread partner([shared, cpuB] {
    std::atomic<long>& ball = shared->ball;
    std::atomic<int>& pinned = shared->pinned;
    if (!pinTo(cpuB)) {
      pinned.store(-1);
      return;
    }
    pinned.fetch_add(1);
    // Odd values are the partner's to answer, even ones the caller's; -2 ends.
    for (long v;;) {
      while ((v = ball.load(std::memory_order_acquire)) % 2 == 0 && v != -2) {
      }
      if (v == -2) return;
      // Answer only the value read: a caller that gave up has stored -2 over it meanwhile.
      ball.compare_exchange_strong(v, v + 1, std::memory_order_acq_rel);
    }
  });
  bool gaveUp = false;
  cpu_set_t before;
  const bool saved = sched_getaffinity(0, sizeof(before), &before) == 0;
  if (pinTo(cpuA)) {
    // A partner that never gets its CPU (a busy real-time task there) must not hang the caller,
    // neither before it says it is pinned nor in a round trip; in a round trip the clock is
    // read only after many idle spins, so a normal one is not slowed.
    const auto deadline = std::chrono::steady_clock::now() + kGiveUpAfter;
    while (pinned.load() == 0 && !gaveUp) {
      std::this_thread::yield();
      gaveUp = std::chrono::steady_clock::now() > deadline;
    }
    long v = 0;
    for (int b = 0; b < batches && !gaveUp && pinned.load() > 0; ++b) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < rounds && !gaveUp; ++i) {
        ball.store(v + 1, std::memory_order_release);
        for (unsigned spins = 1; ball.load(std::memory_order_acquire) != v + 2; ++spins)
          if (spins % 4096 == 0 && std::chrono::steady_clock::now() > deadline) {
            gaveUp = true;
            break;
          }
        v += 2;
      }
      if (gaveUp) break;
      perBatch.push_back(
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
              .count() /
          rounds);
    }
  }
  ball.store(-2, std::memory_order_release);
  // A partner that never ran cannot be joined without waiting for its CPU: it ends by itself
  // when it runs, on the -2 just stored.
  if (gaveUp)
    partner.detach();
  else
    partner.join();
  if (saved) sched_setaffinity(0, sizeof(before), &before);
  if (perBatch.empty() || gaveUp) return -1;
  std::nth_element(perBatch.begin(), perBatch.begin() + perBatch.size() / 2, perBatch.end());
  return perBatch[perBatch.size() / 2];
}

}  // namespace pycollective

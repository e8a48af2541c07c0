#include "transport/peer_distance.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace pycollective {

namespace {

#if defined(__x86_64__)
// Time-stamp counter ticks per nanosecond, measured once against the steady clock over 2 ms.
// A load of tens of nanoseconds is below what two readings of the steady clock resolve.
double ticksPerNanosecond() {
  static const double ratio = [] {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t c0 = __rdtsc();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2)) {
    }
    const uint64_t c1 = __rdtsc();
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    return ns > 0 ? static_cast<double>(c1 - c0) / ns : 0.0;
  }();
  return ratio;
}
#endif

}  // namespace

std::atomic<double> PeerDistance::lastOfProcess_{0};

PeerDistance::PeerDistance(int deciding) : deciding_(std::clamp(deciding, 0, kWindow - 1)) {
#if defined(__x86_64__)
  ticksPerNanosecond();
#endif
}

uint64_t PeerDistance::load(const std::atomic<uint64_t>& counter, uint64_t seen) {
#if defined(__x86_64__)
  // The fences keep the load between the two readings of the counter.
  _mm_lfence();
  const uint64_t start = __rdtsc();
  _mm_lfence();
  const uint64_t value = counter.load(std::memory_order_acquire);
  _mm_lfence();
  const uint64_t end = __rdtsc();
  if (value != seen) {
    const double perNs = ticksPerNanosecond();
    if (perNs > 0) addSample(static_cast<double>(end - start) / perNs);
  }
  return value;
#else
  (void)seen;
  return counter.load(std::memory_order_acquire);  // no streaming stores to choose
#endif
}

void PeerDistance::addSample(double ns) {
  window_[filled_++] = ns;
  if (filled_ < kWindow) return;
  std::nth_element(window_, window_ + deciding_, window_ + kWindow);
  decided_ = window_[deciding_];
  lastOfProcess_.store(decided_, std::memory_order_relaxed);
  filled_ = 0;
}

}  // namespace pycollective

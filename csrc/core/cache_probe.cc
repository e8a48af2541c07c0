#include "core/cache_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/knobs.h"
#include "core/logging.h"

namespace pycollective {

namespace {

constexpr size_t kReferenceBytes = size_t(64) << 20;  // surely past the cache on both VMs
constexpr size_t kSmallestLine = size_t(1) << 20;
constexpr size_t kLargestLine = size_t(32) << 20;
constexpr double kInCacheSpeedup = 1.5;

// Bytes read + written per second by a pass of dst[i] = src[i] ^ key over a working set of
// `ws` bytes (half source, half destination), best of three timings of repeated passes. Plain
// stores on purpose: the collectives' reductions write so, where a bulk copy may stream.
double passRate(uint64_t* base, size_t ws) {
  const size_t words = ws / 2 / sizeof(uint64_t);
  const uint64_t* src = base;
  uint64_t* dst = base + words;
  volatile uint64_t key = 0x5a;
  const uint64_t k = key;
  const size_t passes = std::max<size_t>(2, (size_t(32) << 20) / ws);
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    for (size_t i = 0; i < words; ++i) dst[i] = src[i] ^ k;  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t p = 0; p < passes; ++p)
      for (size_t i = 0; i < words; ++i) dst[i] = src[i] ^ k;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, static_cast<double>(ws) * passes / s);
  }
  return best;
}

size_t measure() {
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[kReferenceBytes / sizeof(uint64_t)]);
  std::memset(buffer.get(), 1, kReferenceBytes);  // fault the pages in before any timing
  const double reference = passRate(buffer.get(), kReferenceBytes);
  size_t line = kSmallestLine;
  for (size_t ws = 2 * kSmallestLine; ws <= kLargestLine; ws *= 2) {
    if (passRate(buffer.get(), ws) < kInCacheSpeedup * reference) break;
    line = ws;
  }
  PC_INFO(kColl, "cache model: working sets up to ", line >> 20,
          " MiB count as in cache (a 64 MiB pass ran at ", reference / 1e9, " GB/s)");
  return line;
}

}  // namespace

size_t cacheResidentBytes() {
  static const size_t bytes = [] {
    const long long set = knobs::integer(knobs::kCacheBytes);
    PC_CHECK(set >= 0, "PYCOLLECTIVE_CACHE_BYTES must be 0 (measure) or positive, got ", set);
    return set > 0 ? static_cast<size_t>(set) : measure();
  }();
  return bytes;
}

}  // namespace pycollective

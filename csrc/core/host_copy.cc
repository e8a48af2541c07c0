#include "core/host_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace pycollective {

#if defined(__x86_64__)
namespace {

// glibc switches to `rep movsb` at 2112 bytes (x86_rep_movsb_threshold) and leaves it for
// larger copies somewhere past the L2 size; the collapse was measured from 4 KiB to 256 KiB and
// not at 512 KiB. The window is taken wider on both sides: the loop below is close to memcpy.
constexpr size_t kMinBytes = 2048;
constexpr size_t kMaxBytes = 1 << 20;
// Measured at 64 KiB: every distance from 1 to 31 bytes ran at 3 GB/s, 32-72 at 37-49 GB/s (48
// lost half at 256 KiB). Up to 63 leaves a margin.
constexpr uintptr_t kBadDistance = 64;
constexpr uintptr_t kPageMask = 4095;

}  // namespace
#endif

bool rangesOverlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return (x > y ? x - y : y - x) < bytes;
}

bool hostCopyAvoidsMemcpy(const void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  const uintptr_t distance =
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & kPageMask;
  return bytes >= kMinBytes && bytes < kMaxBytes && distance != 0 && distance < kBadDistance;
#else
  (void)dst, (void)src, (void)bytes;
  return false;
#endif
}

void hostCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;  // an empty buffer's pointer may be null
#if defined(__x86_64__)
  if (hostCopyAvoidsMemcpy(dst, src, bytes)) {
    // Overlapping ranges are not a copy the library makes, but the loop below would read bytes
    // it had already overwritten: leave them to memmove rather than corrupt them.
    if (rangesOverlap(dst, src, bytes)) {
      std::memmove(dst, src, bytes);
      return;
    }
    auto* d = static_cast<char*>(dst);
    auto* s = static_cast<const char*>(src);
    // Eight loads before eight stores (SSE2, baseline x86-64): 40-50 GB/s in cache here, where
    // four-and-four reached only half that.
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
      __m128i v[8];
      for (int k = 0; k < 8; ++k)
        v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16 * k));
      for (int k = 0; k < 8; ++k)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16 * k), v[k]);
    }
    std::memcpy(d + i, s + i, bytes - i);  // under 128 bytes: vector moves, no rep movsb
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace pycollective

#include "core/stream_copy.h"

#include <cstdint>
#include <cstring>

#include "core/host_copy.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace pycollective {

void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  // Below this, memcpy into the cache is as good (the host segment streams slots from 2 KiB:
  // transport/host_segment.h).
  constexpr size_t kMinBytes = 1024;
  if (bytes < kMinBytes) {
    hostCopy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  // Align the destination to a cache line: SSE2 streaming stores need 16 bytes (SSE2 is
  // baseline x86-64), and a line written in part around the cache is merged in memory with the
  // rest of it, slower than an ordinary store.
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t vectors = bytes / 64;
  for (size_t i = 0; i < vectors; ++i, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes % 64);
  // Streaming stores are weakly ordered: make them visible before anyone is told we are done.
  _mm_sfence();
#else
  hostCopy(dst, src, bytes);
#endif
}

}  // namespace pycollective

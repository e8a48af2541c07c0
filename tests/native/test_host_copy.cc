// hostCopy (core/host_copy.h): the library's bulk host copy, which leaves glibc's memcpy for a
// SIMD loop where `rep movsb` collapses (destination 1-31 bytes above the source modulo the page;
// the window takes 1-63).
// Checks that both routes copy exactly the bytes asked for, at every distance of the window and
// around it, for sizes on both sides of the loop's 128-byte step and of the window's bounds; and
// that streamCopy (core/stream_copy.h: non-temporal stores in whole cache lines, ordinary ones
// around them) does too, at every alignment of the destination within a line.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/host_copy.h"
#include "core/stream_copy.h"
#include "expect.h"

#if defined(__x86_64__)
#define PC_X86 1
#else
#define PC_X86 0
#endif

using namespace pycollective;

namespace {

constexpr size_t kGuard = 256;  // bytes either side of the destination that must stay untouched

using CopyFn = void (*)(void*, const void*, size_t);

void checkCopy(size_t bytes, size_t srcOffset, size_t distance, CopyFn copy = hostCopy) {
  // The source at `srcOffset` into a page; the destination `distance` bytes above it (mod page).
  std::vector<uint8_t> srcBuf(bytes + 8192), dstBuf(bytes + 8192 + 2 * kGuard);
  uint8_t* src = srcBuf.data() +
                 ((4096 - reinterpret_cast<uintptr_t>(srcBuf.data()) % 4096) % 4096) + srcOffset;
  const uintptr_t base = reinterpret_cast<uintptr_t>(dstBuf.data()) + kGuard;
  const uintptr_t want = (reinterpret_cast<uintptr_t>(src) + distance) % 4096;
  uint8_t* dst = reinterpret_cast<uint8_t*>(base + ((want - base % 4096 + 4096) % 4096));
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (auto& b : dstBuf) b = 0xA5;
  copy(dst, src, bytes);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += dst[i] != src[i];
  size_t touched = 0;
  for (size_t i = 1; i <= kGuard; ++i) touched += (dst[-static_cast<ptrdiff_t>(i)] != 0xA5);
  for (size_t i = 0; i < kGuard; ++i) touched += (dst[bytes + i] != 0xA5);
  EXPECT(wrong == 0 && touched == 0,
         "%s: %zu bytes, source at page offset %zu, distance %zu: %zu wrong, %zu guard bytes "
         "written",
         copy == hostCopy ? "hostCopy" : "streamCopy", bytes, srcOffset, distance, wrong, touched);
}

}  // namespace

int main() {
  const size_t sizes[] = {0, 1, 127, 128, 129, 2047, 2048, 2049, 4096 + 13, 65536, 300000};
  for (size_t bytes : sizes)
    for (size_t distance = 0; distance <= 80; distance += (distance < 70 ? 1 : 10))
      for (size_t srcOffset : {size_t{0}, size_t{16}, size_t{4000}})
        checkCopy(bytes, srcOffset, distance);

  // Streaming: destinations at every offset within a cache line, sizes around whole lines.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4096 + 13},
                       size_t{4096 + 64}, size_t{65536}, size_t{300000}})
    for (size_t distance = 0; distance < 64; ++distance)
      for (size_t srcOffset : {size_t{0}, size_t{8}, size_t{4000}})
        checkCopy(bytes, srcOffset, distance, streamCopy);

  // Overlapping ranges inside the window (no copy the library makes) come out as memmove's.
  for (size_t shift : {size_t{8}, size_t{16}, size_t{40}}) {
    std::vector<uint8_t> buf(65536 + 64), want(65536 + 64);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = want[i] = static_cast<uint8_t>(i * 7 + 1);
    hostCopy(buf.data() + shift, buf.data(), 65536);
    std::memmove(want.data() + shift, want.data(), 65536);
    EXPECT(buf == want, "overlapping copy %zu bytes up differs from memmove", shift);
  }

  // The window itself: the loop where rep movsb collapses, memcpy everywhere else.
  alignas(4096) static uint8_t page[3 * 4096];
  EXPECT(hostCopyAvoidsMemcpy(page + 16, page, 65536) == static_cast<bool>(PC_X86),
         "16 bytes above, 64 KiB");
  EXPECT(!hostCopyAvoidsMemcpy(page, page, 65536), "same page offset");
  EXPECT(!hostCopyAvoidsMemcpy(page + 64, page, 65536), "64 bytes above");
  EXPECT(!hostCopyAvoidsMemcpy(page, page + 16, 65536), "16 bytes below");
  EXPECT(!hostCopyAvoidsMemcpy(page + 16, page, 1024), "below glibc's rep movsb threshold");
  EXPECT(!hostCopyAvoidsMemcpy(page + 16, page, 4 << 20), "past the window's top");

  std::printf("host_copy: %d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}

#include "reduce/wire_codec.h"

#include <algorithm>

#include "core/error.h"

namespace pycollective {

namespace {

// Work in pieces that stay in L1, so a round trip through 16 bits costs one pass over memory.
constexpr size_t kPiece = 1024;

DType halfType(WireFormat format) {
  return format == WireFormat::kBf16 ? DType::kBFloat16 : DType::kFloat16;
}

// This CPU's conversion kernels (reduce.h): F16C for float16 where the CPU has it.
void encodePiece(WireFormat format, uint16_t* dst, const float* src, size_t n) {
  lookupNarrow(halfType(format))(dst, src, n);
}

void decodePiece(WireFormat format, float* dst, const uint16_t* src, size_t n) {
  lookupWiden(halfType(format))(dst, src, n);
}

// dst = decode(encode(src)) for n <= kPiece elements; dst may alias src.
void roundPiece(WireFormat format, float* dst, const float* src, size_t n) {
  uint16_t bits[kPiece];
  encodePiece(format, bits, src, n);
  decodePiece(format, dst, bits, n);
}

// dst = A OP B piece by piece, each operand's piece made by its loader (load(buffer, start, n))
// into a buffer that stays in L1.
template <typename LoadA, typename LoadB>
void reducePieces(ReduceFn reduce, float* dst, size_t count, LoadA loadA, LoadB loadB) {
  float a[kPiece], b[kPiece];
  for (size_t i = 0; i < count; i += kPiece) {
    const size_t n = std::min(kPiece, count - i);
    loadA(a, i, n);
    loadB(b, i, n);
    reduce(dst + i, a, b, n);
  }
}

void checkCompressed(WireFormat format) {
  PC_ASSERT(format == WireFormat::kBf16 || format == WireFormat::kFp16,
            "a wire codec call needs a 16-bit format, got ", wireFormatName(format));
}

}  // namespace

const char* wireFormatName(WireFormat format) {
  switch (format) {
    case WireFormat::kNative: return "native";
    case WireFormat::kBf16: return "bf16";
    case WireFormat::kFp16: return "fp16";
  }
  return "?";
}

void encodeWire(WireFormat format, uint16_t* dst, const float* src, size_t count) {
  checkCompressed(format);
  encodePiece(format, dst, src, count);
}

void decodeWire(WireFormat format, float* dst, const uint16_t* src, size_t count) {
  checkCompressed(format);
  decodePiece(format, dst, src, count);
}

void decodeReduce(WireFormat format, ReduceFn reduce, float* dst, const float* accum,
                  const uint16_t* incoming, size_t count) {
  checkCompressed(format);
  reducePieces(
      reduce, dst, count,
      [&](float* mine, size_t i, size_t n) { roundPiece(format, mine, accum + i, n); },
      [&](float* theirs, size_t i, size_t n) { decodePiece(format, theirs, incoming + i, n); });
}

void reduceRounded(WireFormat format, ReduceFn reduce, float* dst, const float* a, const float* b,
                   size_t count) {
  checkCompressed(format);
  reducePieces(
      reduce, dst, count,
      [&](float* first, size_t i, size_t n) { roundPiece(format, first, a + i, n); },
      [&](float* second, size_t i, size_t n) { roundPiece(format, second, b + i, n); });
}

void roundToWire(WireFormat format, float* data, size_t count) {
  checkCompressed(format);
  for (size_t i = 0; i < count; i += kPiece) {
    const size_t n = std::min(kPiece, count - i);
    roundPiece(format, data + i, data + i, n);
  }
}

}  // namespace pycollective

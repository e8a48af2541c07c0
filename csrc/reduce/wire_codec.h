#pragma once
// Compressed wire formats: float32 values cross network links as 16 bits (bfloat16 or float16)
// and are accumulated in float32 on arrival. The algorithms never see this: Exchange encodes what
// it sends over a network link and decodes what it receives (algorithms/exchange.h).
//
// Two rules keep every rank's result identical although some values crossed the wire rounded
// and others did not:
//  - A reduction of data from a network link, and a reduction an algorithm does itself
//    (Exchange::reduceLocal), round both operands to the wire format first (a received one
//    already is) and accumulate in float32: both ends of a butterfly (halving-doubling) then
//    add the same two numbers. (Reductions inside shared-memory links stay exact: those run
//    on one rank only, for a value that rank alone computes.)
//  - The call's output is rounded to the wire format at the end on every rank, so a value kept
//    in float32 by its owner equals the copy its peers received.
#include <cstddef>
#include <cstdint>

#include "reduce/reduce.h"

namespace pycollective {

enum class WireFormat : uint8_t {
  kNative = 0,  // the call's own dtype, unchanged
  kBf16 = 1,
  kFp16 = 2,
};
constexpr int kNumWireFormats = 3;

// "native", "bf16", "fp16"
const char* wireFormatName(WireFormat format);

// Bytes one float32 element takes on the wire in `format` (4 for kNative).
inline size_t wireElementSize(WireFormat format) {
  return format == WireFormat::kNative ? 4 : 2;
}

// dst[i] = the 16-bit encoding of src[i] (round to nearest even; overflow gives infinity).
void encodeWire(WireFormat format, uint16_t* dst, const float* src, size_t count);
// dst[i] = the float32 value of src[i] (exact).
void decodeWire(WireFormat format, float* dst, const uint16_t* src, size_t count);
// dst[i] = round(accum[i]) OP decode(incoming[i]); dst may alias accum.
void decodeReduce(WireFormat format, ReduceFn reduce, float* dst, const float* accum,
                  const uint16_t* incoming, size_t count);
// dst[i] = round(a[i]) OP round(b[i]); dst may alias a or b.
void reduceRounded(WireFormat format, ReduceFn reduce, float* dst, const float* a, const float* b,
                   size_t count);
// data[i] = decode(encode(data[i])): the value a peer receives for it.
void roundToWire(WireFormat format, float* data, size_t count);

}  // namespace pycollective

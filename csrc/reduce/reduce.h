#pragma once
// Elementwise reduction kernels for CPU memory: one kernel per dtype x op, chosen once per
// collective. The SIMD level (generic, AVX2, AVX-512) is picked at run time from the CPU, so one
// build runs everywhere. Results do not depend on the SIMD level or on how work is split across
// threads: every kernel is elementwise, so the same inputs give the same bits.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pycollective {

// dst[i] = a[i] OP b[i] for i < count. dst may alias a or b exactly (never a partial overlap).
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// dst = src over `bytes`: hostCopy (core/host_copy.h) for host buffers; device buffers use
// DeviceOps::copyFn().
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

// float32 arrays to 16-bit ones and back (round to nearest even, see half.h), for the
// compressed wire formats: the kernels of this CPU's SIMD level (F16C for float16 when present).
using NarrowFn = void (*)(uint16_t* dst, const float* src, size_t count);
using WidenFn = void (*)(float* dst, const uint16_t* src, size_t count);
// dtype: kBFloat16 or kFloat16.
NarrowFn lookupNarrow(DType dtype);
WidenFn lookupWiden(DType dtype);

// Looked up once per collective, never per element. kAvg returns the kSum kernel (the caller
// scales once at the end). Integer dtype with kAvg -> throws InvalidType ("avg is not defined for
// int32: use sum and divide, or convert to a floating type").
//
// Semantics: integer sum/prod wrap around (two's complement, like numpy); min/max are exact.
// Floating min/max propagate NaN like numpy's np.minimum/np.maximum (if either input is NaN the
// result is NaN); min(-0.0, +0.0) returns b. fp16/bf16 compute in float and round once.
ReduceFn lookupReduce(DType dtype, ReduceOp op);

// data[i] *= factor, for floating dtypes (fp16/bf16 through float, rounding once). Integer
// dtype -> InvalidType.
void scaleInPlace(void* data, size_t count, DType dtype, double factor);

// Name of the kernel set chosen at run time: "avx512", "avx2" or "generic". The environment
// variable PYCOLLECTIVE_SIMD=generic|avx2|avx512, read once at first use, overrides the choice
// (for tests); a level this CPU lacks falls back to the best supported one, with a warning.
const char* simdLevel();

// Applies fn over [0,count) split into pieces of at least minParallelBytes run on the shared
// reduction thread pool (at most `threads` pieces, the caller's thread takes one piece).
// threads<=1 or a small count runs inline.
void reduceParallel(ReduceFn fn, void* dst, const void* a, const void* b, size_t count,
                    size_t elemSize, int threads);

}  // namespace pycollective

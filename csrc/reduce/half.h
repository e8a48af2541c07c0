#pragma once
// float16 (IEEE binary16) and bfloat16 <-> float conversions on uint16_t bit patterns.
//
// Every function here is `static inline` on purpose: this header is compiled into the generic,
// AVX2 and AVX-512 kernel files with different -m flags. With ordinary `inline` (external linkage)
// the linker keeps one copy per function, possibly the AVX-512 one, and the generic kernels would
// then execute AVX-512 instructions on a CPU without them. Internal linkage keeps each file's copy.
//
// Rounding is round-to-nearest-even everywhere, subnormals are kept (never flushed), overflow
// gives infinity, and a NaN stays a NaN with its sign (narrowing quiets it; bf16 -> float keeps
// the bits exactly).
//
// Speed (GCC 12, -O3, fp16 sum of two arrays; measured on the AMD EPYC build host):
//  - `_Float16` casts compile to scalar vcvtph2ps/vcvtps2ph that GCC 12 does not vectorize
//    without AVX512-FP16: ~1.2 ns/element.
//  - The portable bit-manipulation functions below do vectorize but are compute-bound:
//    ~0.7-1.0 ns/element.
//  - F16C vector conversions (8 elements per instruction): ~0.08 ns/element in cache, i.e.
//    memory-bound. So the array converters use F16C when the file is compiled with it, and the
//    portable scalar functions, which GCC auto-vectorizes, everywhere else.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace pycollective {
namespace detail {

static inline float bitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

static inline uint32_t floatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Branch-free select. Written with masks rather than `?:` because GCC 12 leaves some ternaries in
// these functions as branches, and a branch inside the loop body stops auto-vectorization.
static inline uint32_t selectBits(bool cond, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

}  // namespace detail

// ---- bfloat16: the top half of a float ----

static inline float bf16ToFloat(uint16_t h) {
  return detail::bitsToFloat(static_cast<uint32_t>(h) << 16);
}

static inline uint16_t floatToBf16(float f) {
  const uint32_t bits = detail::floatToBits(f);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even. A carry out of the
  // mantissa bumps the exponent, which is also right for overflow to infinity.
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  // Truncating a NaN could clear every mantissa bit (NaN -> inf); force the quiet bit instead.
  const uint32_t quietNan = (bits >> 16) | 0x0040u;
  const bool isNan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(detail::selectBits(isNan, quietNan, rounded));
}

// ---- float16, portable ----
// The scaling technique of Marat Dukhan's FP16 library: let the FPU do the exponent rebias and the
// rounding, which keeps the code branch-free and exact for normals, subnormals, inf and NaN. It
// needs round-to-nearest mode, and its multiplications by powers of two are exact, so FMA
// contraction (-ffp-contract=fast under -std=gnu++17) cannot change a result.

static inline float fp16ToFloatPortable(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t twoW = w + w;  // exponent and mantissa, sign shifted out
  // Normal (and inf/NaN): put exponent+mantissa into a float's fields, then rescale the exponent
  // bias from 15 to 127 with a multiplication; inf/NaN land on exponent 255 by construction.
  const float normalized = detail::bitsToFloat((twoW >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: mantissa * 2^-24, computed as (0.5 + mantissa * 2^-24) - 0.5 exactly.
  const float subnormal = detail::bitsToFloat((twoW >> 17) | (126u << 23)) - 0.5f;
  const bool isSubnormal = twoW < (1u << 27);
  const uint32_t magnitude = detail::selectBits(isSubnormal, detail::floatToBits(subnormal),
                                                detail::floatToBits(normalized));
  return detail::bitsToFloat(sign | magnitude);
}

static inline uint16_t floatToFp16Portable(float f) {
  // Scaling up by 2^112 overflows exactly the values that must become infinity; scaling back by
  // 2^-110 leaves the rest where adding `bias` below rounds them at fp16's precision.
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = detail::floatToBits(f);
  const uint32_t shl1W = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1W & 0xFF000000u;
  // Below fp16's normal range every value gets the same bias: fp16 subnormals are fixed-point.
  bias = detail::selectBits(bias < 0x71000000u, 0x71000000u, bias);
  // The addition rounds away all bits below fp16's last mantissa bit (nearest, ties to even).
  base = detail::bitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = detail::floatToBits(base);
  const uint32_t expBits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissaBits = bits & 0x00000FFFu;  // a carry into the exponent is intended
  const uint32_t nonSign = expBits + mantissaBits;
  const bool isNan = shl1W > 0xFF000000u;
  return static_cast<uint16_t>((sign >> 16) | detail::selectBits(isNan, 0x7E00u, nonSign));
}

// ---- float16, best available for this file's target ----

static inline float fp16ToFloat(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return fp16ToFloatPortable(h);
#endif
}

static inline uint16_t floatToFp16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);  // not MXCSR: always nearest-even
#else
  return floatToFp16Portable(f);
#endif
}

// ---- array converters, the form the kernels use ----

static inline void fp16ToFloatN(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16ToFloat(src[i]);
}

static inline void floatToFp16N(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = floatToFp16(src[i]);
}

static inline void bf16ToFloatN(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16ToFloat(src[i]);
}

static inline void floatToBf16N(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = floatToBf16(src[i]);
}

}  // namespace pycollective

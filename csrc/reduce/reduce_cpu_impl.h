#pragma once
// The CPU kernels, dtype x op, written once as plain loops that GCC -O3 auto-vectorizes.
//
// This header is compiled three times, by reduce_cpu_{generic,avx2,avx512}.cc, each with its own
// -m flags and with PC_REDUCE_ISA_NS naming the namespace that keeps the three builds apart.
// Included without PC_REDUCE_ISA_NS (by reduce_dispatch.cc) it only declares the table and the
// three functions that fill it, so the dispatcher itself contains no SIMD code.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "reduce/reduce.h"

namespace pycollective {
namespace detail {

// data[i] *= factor over [0, count).
using ScaleFn = void (*)(void* data, size_t count, double factor);

// Columns of KernelTable::reduce are ReduceOp values kSum..kMax. kAvg has no column: it is the
// kSum kernel followed by one scale, done by the caller.
constexpr int kNumKernelOps = 4;
static_assert(static_cast<int>(ReduceOp::kSum) == 0 && static_cast<int>(ReduceOp::kMax) == 3,
              "KernelTable columns follow ReduceOp kSum..kMax");

struct KernelTable {
  ReduceFn reduce[kNumDTypes][kNumKernelOps];
  ScaleFn scale[kNumDTypes];  // nullptr for integer dtypes
  // float32 <-> 16-bit arrays, index 0 bfloat16, 1 float16 (compressed wire formats).
  NarrowFn narrow[2];
  WidenFn widen[2];
};

namespace generic {
void fillKernelTable(KernelTable* table);
}
namespace avx2 {
void fillKernelTable(KernelTable* table);
}
namespace avx512 {
void fillKernelTable(KernelTable* table);
}

}  // namespace detail
}  // namespace pycollective

#if defined(PC_REDUCE_ISA_NS)

#include "reduce/half.h"

namespace pycollective {
namespace detail {
namespace PC_REDUCE_ISA_NS {
// Internal linkage for every kernel, for the same reason as in half.h: the three builds of these
// templates must never be merged by the linker. This also keeps std:: templates out of the
// kernels, since an out-of-line std:: helper instantiated here would be shared across builds.
namespace {

// Integer sum/prod wrap around like numpy. Signed overflow is undefined in C++, so they compute in
// the unsigned type of the same width and convert back (modular since GCC always, C++20 by rule).
template <typename T, bool = std::is_integral<T>::value>
struct ArithType {
  using type = T;
};
template <typename T>
struct ArithType<T, true> {
  using type = typename std::make_unsigned<T>::type;
};

template <typename T>
inline bool isNan(T x) {
  if constexpr (std::is_floating_point<T>::value) {
    return x != x;
  } else {
    return false;  // so min/max below are the plain integer comparisons
  }
}

struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    using A = typename ArithType<T>::type;
    return static_cast<T>(static_cast<A>(a) + static_cast<A>(b));
  }
};

struct ProdOp {
  template <typename T>
  static T apply(T a, T b) {
    using A = typename ArithType<T>::type;
    return static_cast<T>(static_cast<A>(a) * static_cast<A>(b));
  }
};

// NaN propagates like numpy's np.minimum/np.maximum: `a < b` is false whenever b is NaN, so b
// (the NaN) is returned; a NaN `a` is caught by isNan(a). Ties (including -0.0 vs +0.0) return b.
// `|` rather than `||` keeps the condition a single select, which vectorizes to compare+blend.
struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    return ((a < b) | isNan(a)) ? a : b;
  }
};

struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    return ((a > b) | isNan(a)) ? a : b;
  }
};

// Four loops, one per aliasing case, so that every __restrict below is true: the pointers
// declared __restrict never refer to memory that is written through another pointer. (Two
// read-only __restrict pointers may point to the same data; restrict only constrains writes.)
template <typename T, typename Op>
void loopDistinct(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void loopIntoA(T* __restrict inout, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = Op::apply(inout[i], b[i]);
}

template <typename T, typename Op>
void loopIntoB(const T* __restrict a, T* __restrict inout, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = Op::apply(a[i], inout[i]);
}

template <typename T, typename Op>
void loopSelf(T* inout, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = Op::apply(inout[i], inout[i]);
}

template <typename T, typename Op>
void reduceKernel(void* dst, const void* a, const void* b, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (d == x && d == y) {
    loopSelf<T, Op>(d, count);
  } else if (d == x) {
    loopIntoA<T, Op>(d, y, count);  // the common in-place case: inout = inout OP incoming
  } else if (d == y) {
    loopIntoB<T, Op>(x, d, count);
  } else {
    loopDistinct<T, Op>(d, x, y, count);
  }
}

// fp16/bf16: convert a block of each input to float, reduce in float, round once on the way back.
// Float is wide enough that this single rounding is the correctly rounded result of the exact
// sum or product: float has 24 significant bits, at least 2p+2 for fp16 (p=11) and bf16 (p=8),
// which makes double rounding innocuous for + and *. Each block is fully read before it is
// written, so dst may alias a or b exactly.
struct Fp16Format {
  static void toFloat(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
    fp16ToFloatN(dst, src, n);
  }
  static void fromFloat(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
    floatToFp16N(dst, src, n);
  }
};

struct Bf16Format {
  static void toFloat(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
    bf16ToFloatN(dst, src, n);
  }
  static void fromFloat(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
    floatToBf16N(dst, src, n);
  }
};

// 2 x 1 KiB of float staging stays in L1 next to the streamed inputs.
constexpr size_t kHalfBlock = 256;

template <typename Format, typename Op>
void halfKernel(void* dst, const void* a, const void* b, size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  alignas(64) float fx[kHalfBlock];
  alignas(64) float fy[kHalfBlock];
  for (size_t start = 0; start < count; start += kHalfBlock) {
    const size_t n = count - start < kHalfBlock ? count - start : kHalfBlock;
    Format::toFloat(fx, x + start, n);
    Format::toFloat(fy, y + start, n);
    loopIntoA<float, Op>(fx, fy, n);
    Format::fromFloat(d + start, fx, n);
  }
}

// float32 scales in double: x * (1/n) then one rounding is closer to x / n than a float product.
void scaleFloat(void* data, size_t count, double factor) {
  float* p = static_cast<float*>(data);
  for (size_t i = 0; i < count; ++i) {
    p[i] = static_cast<float>(static_cast<double>(p[i]) * factor);
  }
}

void scaleDouble(void* data, size_t count, double factor) {
  double* p = static_cast<double*>(data);
  for (size_t i = 0; i < count; ++i) p[i] *= factor;
}

template <typename Format>
void scaleHalf(void* data, size_t count, double factor) {
  uint16_t* p = static_cast<uint16_t*>(data);
  const float f = static_cast<float>(factor);
  alignas(64) float block[kHalfBlock];
  for (size_t start = 0; start < count; start += kHalfBlock) {
    const size_t n = count - start < kHalfBlock ? count - start : kHalfBlock;
    Format::toFloat(block, p + start, n);
    for (size_t i = 0; i < n; ++i) block[i] *= f;
    Format::fromFloat(p + start, block, n);
  }
}

template <typename Op>
ReduceFn kernelFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return &halfKernel<Fp16Format, Op>;
    case DType::kBFloat16: return &halfKernel<Bf16Format, Op>;
    case DType::kFloat32: return &reduceKernel<float, Op>;
    case DType::kFloat64: return &reduceKernel<double, Op>;
    case DType::kInt8: return &reduceKernel<int8_t, Op>;
    case DType::kUInt8: return &reduceKernel<uint8_t, Op>;
    case DType::kInt32: return &reduceKernel<int32_t, Op>;
    case DType::kInt64: return &reduceKernel<int64_t, Op>;
  }
  return nullptr;
}

ScaleFn scaleFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return &scaleHalf<Fp16Format>;
    case DType::kBFloat16: return &scaleHalf<Bf16Format>;
    case DType::kFloat32: return &scaleFloat;
    case DType::kFloat64: return &scaleDouble;
    default: return nullptr;  // integers cannot be scaled in place
  }
}

void narrowBf16(uint16_t* dst, const float* src, size_t n) {
  floatToBf16N(dst, src, n);
}
void narrowFp16(uint16_t* dst, const float* src, size_t n) {
  floatToFp16N(dst, src, n);
}
void widenBf16(float* dst, const uint16_t* src, size_t n) {
  bf16ToFloatN(dst, src, n);
}
void widenFp16(float* dst, const uint16_t* src, size_t n) {
  fp16ToFloatN(dst, src, n);
}

}  // namespace

void fillKernelTable(KernelTable* table) {
  table->narrow[0] = &narrowBf16;
  table->narrow[1] = &narrowFp16;
  table->widen[0] = &widenBf16;
  table->widen[1] = &widenFp16;
  for (int d = 0; d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    table->reduce[d][static_cast<int>(ReduceOp::kSum)] = kernelFor<SumOp>(dtype);
    table->reduce[d][static_cast<int>(ReduceOp::kProd)] = kernelFor<ProdOp>(dtype);
    table->reduce[d][static_cast<int>(ReduceOp::kMin)] = kernelFor<MinOp>(dtype);
    table->reduce[d][static_cast<int>(ReduceOp::kMax)] = kernelFor<MaxOp>(dtype);
    table->scale[d] = scaleFor(dtype);
  }
}

}  // namespace PC_REDUCE_ISA_NS
}  // namespace detail
}  // namespace pycollective

#endif  // PC_REDUCE_ISA_NS

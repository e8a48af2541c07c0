// CUDA reduction kernels, one per dtype x op, with the CPU table's semantics (reduce/reduce.h):
//  - integer sum/prod wrap around (computed in the unsigned type of the same width);
//  - floating min/max propagate NaN like np.minimum/np.maximum; ties (-0.0 vs +0.0) return b;
//  - fp16/bf16 compute in float and round once (to nearest even), so results are bitwise equal
//    to the CPU kernels'; min/max select one of the two inputs' bits unchanged;
//  - avg is the sum kernel; the caller scales once at the end (scale kernels below).
//
// Every kernel is memory-bound, so the one thing that matters is moving bytes well: 16-byte
// vector loads and stores (one Pack of 16/sizeof(T) elements per thread per iteration), a
// grid-stride loop over a grid sized to fill every SM once, and no shared memory. Pointers that
// share their misalignment modulo 16 (the usual case: segments at the same element offset of
// 256-byte-aligned cudaMalloc buffers) peel a short head and then run vectorized; pointers
// with different misalignments take the scalar loop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"

namespace pycollective {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kVectorBytes = 16;

// ---- element operations ----

template <typename T>
struct Unsigned {
  using type = T;
};
template <>
struct Unsigned<int8_t> {
  using type = uint8_t;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = uint64_t;
};

template <typename T>
__device__ __forceinline__ float toFloat(T x);
template <>
__device__ __forceinline__ float toFloat<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float x);
template <>
__device__ __forceinline__ __half fromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
constexpr bool kIsHalf = std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value;

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (kIsHalf<T>) {
      return fromFloat<T>(toFloat(a) + toFloat(b));
    } else if constexpr (std::is_integral<T>::value) {
      using U = typename Unsigned<T>::type;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (kIsHalf<T>) {
      return fromFloat<T>(toFloat(a) * toFloat(b));
    } else if constexpr (std::is_integral<T>::value) {
      using U = typename Unsigned<T>::type;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};

// `a` wins when it is smaller or NaN; otherwise b (so a NaN b propagates, ties return b).
struct MinOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (kIsHalf<T>) {
      const float x = toFloat(a), y = toFloat(b);
      return ((x < y) | (x != x)) ? a : b;
    } else if constexpr (std::is_floating_point<T>::value) {
      return ((a < b) | (a != a)) ? a : b;
    } else {
      return a < b ? a : b;
    }
  }
};

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (kIsHalf<T>) {
      const float x = toFloat(a), y = toFloat(b);
      return ((x > y) | (x != x)) ? a : b;
    } else if constexpr (std::is_floating_point<T>::value) {
      return ((a > b) | (a != a)) ? a : b;
    } else {
      return a > b ? a : b;
    }
  }
};

// x * factor, rounded once, as the CPU's scale kernels: float32 through double, fp16/bf16
// through float, float64 directly. `b` is unused (scale runs through the binary kernel).
template <typename T>
struct ScaleOp {
  double factor;
  __device__ __forceinline__ T operator()(T a, T) const {
    if constexpr (kIsHalf<T>) {
      return fromFloat<T>(toFloat(a) * static_cast<float>(factor));
    } else if constexpr (std::is_same<T, float>::value) {
      return static_cast<float>(static_cast<double>(a) * factor);
    } else {
      return a * factor;
    }
  }
};

// ---- the one kernel shape: dst = f(a, b) elementwise ----

template <typename T>
struct alignas(kVectorBytes) Pack {
  static constexpr int kSize = kVectorBytes / sizeof(T);
  T v[kSize];
};

// Elements [0, head) and [head + packs * kSize, count) are scalar; the packs in between start
// at a 16-byte boundary of all three pointers. No __restrict__: dst may alias a or b exactly,
// and every element is read before it is written by the same thread.
template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    elementwiseKernel(T* dst, const T* a, const T* b, size_t head, size_t packs, size_t count,
                      F f) {
  using P = Pack<T>;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const P* pa = reinterpret_cast<const P*>(a + head);
  const P* pb = reinterpret_cast<const P*>(b + head);
  P* pd = reinterpret_cast<P*>(dst + head);
  for (size_t i = tid; i < packs; i += stride) {
    const P x = pa[i];
    const P y = pb[i];
    P z;
#pragma unroll
    for (int k = 0; k < P::kSize; ++k) z.v[k] = f(x.v[k], y.v[k]);
    pd[i] = z;
  }
  if (tid < head) dst[tid] = f(a[tid], b[tid]);
  const size_t tail = head + packs * P::kSize + tid;
  if (tid < P::kSize && tail < count) dst[tail] = f(a[tail], b[tail]);
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreads)
    scalarKernel(T* dst, const T* a, const T* b, size_t count, F f) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    dst[i] = f(a[i], b[i]);
}

// Blocks that fill every SM of the current device once (resident blocks per SM x SMs).
int maxBlocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};
  int device = 0;
  PC_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 0 && device < kMaxDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0, threadsPerSm = 0;
  PC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PC_CUDA_CHECK(
      cudaDeviceGetAttribute(&threadsPerSm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const int blocks = sms * (threadsPerSm / kThreads > 0 ? threadsPerSm / kThreads : 1);
  if (device >= 0 && device < kMaxDevices) cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

int gridFor(size_t work) {
  const size_t wanted = (work + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(maxBlocks());
  return static_cast<int>(wanted < 1 ? 1 : (wanted < cap ? wanted : cap));
}

template <typename T, typename F>
void launch(void* dstv, const void* av, const void* bv, size_t count, F f, cudaStream_t stream) {
  if (count == 0) return;
  T* dst = static_cast<T*>(dstv);
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  constexpr size_t kPack = Pack<T>::kSize;
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) % kVectorBytes;
  const bool sameMisalignment = reinterpret_cast<uintptr_t>(a) % kVectorBytes == mis &&
                                reinterpret_cast<uintptr_t>(b) % kVectorBytes == mis &&
                                mis % sizeof(T) == 0;
  if (sameMisalignment) {
    size_t head = mis == 0 ? 0 : (kVectorBytes - mis) / sizeof(T);
    if (head > count) head = count;
    const size_t packs = (count - head) / kPack;
    const size_t scalarWork = head > kPack ? head : kPack;
    elementwiseKernel<T, F>
        <<<gridFor(packs > scalarWork ? packs : scalarWork), kThreads, 0, stream>>>(
            dst, a, b, head, packs, count, f);
  } else {
    scalarKernel<T, F><<<gridFor(count), kThreads, 0, stream>>>(dst, a, b, count, f);
  }
  PC_CUDA_CHECK(cudaGetLastError());
}

// ---- dtype x op dispatch ----

template <typename Op>
void launchTyped(DType dtype, void* dst, const void* a, const void* b, size_t count,
                 cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16: return launch<__half>(dst, a, b, count, Op{}, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(dst, a, b, count, Op{}, stream);
    case DType::kFloat32: return launch<float>(dst, a, b, count, Op{}, stream);
    case DType::kFloat64: return launch<double>(dst, a, b, count, Op{}, stream);
    case DType::kInt8: return launch<int8_t>(dst, a, b, count, Op{}, stream);
    case DType::kUInt8: return launch<uint8_t>(dst, a, b, count, Op{}, stream);
    case DType::kInt32: return launch<int32_t>(dst, a, b, count, Op{}, stream);
    case DType::kInt64: return launch<int64_t>(dst, a, b, count, Op{}, stream);
  }
  PC_CHECK(false, "unknown dtype value ", static_cast<int>(dtype));
}

// Validates like lookupReduce and maps kAvg onto kSum.
ReduceOp kernelOp(DType dtype, ReduceOp op) {
  const int d = static_cast<int>(dtype), o = static_cast<int>(op);
  PC_CHECK(d >= 0 && d < kNumDTypes, "unknown dtype value ", d);
  PC_CHECK(o >= 0 && o < kNumReduceOps, "unknown reduce op value ", o);
  if (op == ReduceOp::kAvg) {
    if (!isFloating(dtype))
      throw InvalidType(makeMessage("avg is not defined for ", dtypeName(dtype),
                                    ": use sum and divide, or convert to a floating type"));
    return ReduceOp::kSum;
  }
  return op;
}

template <typename T, typename Op>
void synchronousReduce(void* dst, const void* a, const void* b, size_t count) {
  if (count == 0) return;
  launch<T>(dst, a, b, count, Op{}, cudaStreamPerThread);
  PC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

template <typename Op>
ReduceFn synchronousFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return &synchronousReduce<__half, Op>;
    case DType::kBFloat16: return &synchronousReduce<__nv_bfloat16, Op>;
    case DType::kFloat32: return &synchronousReduce<float, Op>;
    case DType::kFloat64: return &synchronousReduce<double, Op>;
    case DType::kInt8: return &synchronousReduce<int8_t, Op>;
    case DType::kUInt8: return &synchronousReduce<uint8_t, Op>;
    case DType::kInt32: return &synchronousReduce<int32_t, Op>;
    case DType::kInt64: return &synchronousReduce<int64_t, Op>;
  }
  return nullptr;
}

}  // namespace

void launchReduce(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op,
                  cudaStream_t stream) {
  switch (kernelOp(dtype, op)) {
    case ReduceOp::kSum: return launchTyped<SumOp>(dtype, dst, a, b, count, stream);
    case ReduceOp::kProd: return launchTyped<ProdOp>(dtype, dst, a, b, count, stream);
    case ReduceOp::kMin: return launchTyped<MinOp>(dtype, dst, a, b, count, stream);
    case ReduceOp::kMax: return launchTyped<MaxOp>(dtype, dst, a, b, count, stream);
    default: break;
  }
  PC_ASSERT(false, "no device kernel for ", opName(op));
}

void launchScale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat16:
      return launch<__half>(data, data, data, count, ScaleOp<__half>{factor}, stream);
    case DType::kBFloat16:
      return launch<__nv_bfloat16>(data, data, data, count, ScaleOp<__nv_bfloat16>{factor}, stream);
    case DType::kFloat32:
      return launch<float>(data, data, data, count, ScaleOp<float>{factor}, stream);
    case DType::kFloat64:
      return launch<double>(data, data, data, count, ScaleOp<double>{factor}, stream);
    default:
      throw InvalidType(makeMessage("cannot scale ", dtypeName(dtype),
                                    " in place: scaling (as for avg) needs a floating type"));
  }
}

ReduceFn synchronousReduceFn(DType dtype, ReduceOp op) {
  ReduceFn fn = nullptr;
  switch (kernelOp(dtype, op)) {
    case ReduceOp::kSum: fn = synchronousFor<SumOp>(dtype); break;
    case ReduceOp::kProd: fn = synchronousFor<ProdOp>(dtype); break;
    case ReduceOp::kMin: fn = synchronousFor<MinOp>(dtype); break;
    case ReduceOp::kMax: fn = synchronousFor<MaxOp>(dtype); break;
    default: break;
  }
  PC_ASSERT(fn != nullptr, "no device ", opName(op), " kernel for ", dtypeName(dtype));
  return fn;
}

}  // namespace cuda
}  // namespace pycollective

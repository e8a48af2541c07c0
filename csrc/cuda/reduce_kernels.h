#pragma once
// The CUDA reduction kernels (reduce_kernels.cu): the CPU table's dtype x op with the same
// semantics (reduce/reduce.h), grid-stride loops over 16-byte vectors. Internal to csrc/cuda/;
// everything else reaches them through DeviceOps.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"
#include "reduce/reduce.h"

namespace pycollective {
namespace cuda {

// Enqueues dst = a OP b over `count` elements on `stream` (kAvg enqueues the sum; the caller
// scales). dst may alias a or b exactly. Throws InvalidType for an integer kAvg.
void launchReduce(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op,
                  cudaStream_t stream);

// Enqueues data[i] *= factor (floating dtypes; InvalidType otherwise).
void launchScale(void* data, size_t count, DType dtype, double factor, cudaStream_t stream);

// A ReduceFn that launches on the calling thread's per-thread stream of its current device and
// returns once the kernel finished (the contract of DeviceOps::reduceFn).
ReduceFn synchronousReduceFn(DType dtype, ReduceOp op);

}  // namespace cuda
}  // namespace pycollective

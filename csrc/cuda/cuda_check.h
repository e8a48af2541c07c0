#pragma once
// PC_CUDA_CHECK(call): a failing CUDA runtime call becomes a CudaError that names the call, the
// error code and cudaGetErrorString's text, with file:line. This header includes the CUDA
// runtime API, so only files under csrc/cuda/ that are compiled in CUDA builds include it.
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace pycollective {
namespace cuda {

[[noreturn]] void throwCudaError(cudaError_t error, const char* call, const char* file, int line);

}  // namespace cuda
}  // namespace pycollective

#define PC_CUDA_CHECK(call)                                                            \
  do {                                                                                 \
    const cudaError_t pc_cuda_error_ = (call);                                         \
    if (pc_cuda_error_ != cudaSuccess)                                                 \
      ::pycollective::cuda::throwCudaError(pc_cuda_error_, #call, __FILE__, __LINE__); \
  } while (0)

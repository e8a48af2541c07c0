#pragma once
// DeviceOps: the small interface through which code outside csrc/cuda/ touches device memory.
// It includes no CUDA header (streams and events are opaque pointers), so the exchange, the
// algorithms and the NCCL communicator use it without #ifdef. A CUDA build links
// device_ops.cc, whose deviceOps() returns the CUDA implementation; a CPU-only build links
// device_ops_none.cc, whose deviceOps() returns nullptr. CMake picks one of the two files.
//
// Two kinds of operation:
//  - Collective-call operations (copyFn, reduceFn, scale) run on the calling thread's current
//    device and its per-thread stream and have finished when they return. A collective over
//    device buffers starts with beginCall(device, stream), which makes the device current and
//    waits for the work already queued on the caller's stream (the array's current stream), so
//    inputs are ready; when the collective returns, its results are complete. That is what lets
//    the in-process links hand a buffer back to its owner the moment a copy or reduce returns.
//  - Stream operations (*Async) only enqueue on the stream given (benchmarks, array-level API).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "reduce/reduce.h"

namespace pycollective {
namespace cuda {

using Stream = void*;  // cudaStream_t
using Event = void*;   // cudaEvent_t

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;

  // "CUDA runtime 13.0, driver 13.0, 1 device(s)"
  virtual std::string describe() = 0;
  virtual int deviceCount() = 0;
  // Device ordinal of memory at p, or -1 for host memory (pageable, pinned or unknown to CUDA).
  virtual int pointerDevice(const void* p) = 0;
  virtual void setDevice(int device) = 0;
  virtual int currentDevice() = 0;

  // ---- collective-call operations (synchronous, current device, per-thread stream) ----
  // Returns the device that was current before, which endCall() makes current again (CuPy and
  // PyTorch keep their own idea of the current device: a call must not change it).
  virtual int beginCall(int device, Stream stream) = 0;
  virtual void endCall(int previousDevice) noexcept = 0;
  // Lets kernels running on each of `devices` read and write the others' memory (the in-process
  // links reduce straight out of a peer's buffer). Throws CudaError when a pair cannot.
  virtual void enablePeerAccess(const std::vector<int>& devices) = 0;
  // dst = src over `bytes`, any combination of host and device memory.
  virtual CopyFn copyFn() = 0;
  // The kernel for dtype x op with ReduceFn's signature. Same semantics as lookupReduce (integer
  // wrap, NaN-propagating min/max, fp16/bf16 through float rounded once, kAvg -> kSum kernel,
  // integer kAvg -> InvalidType).
  virtual ReduceFn reduceFn(DType dtype, ReduceOp op) = 0;
  // data[i] *= factor (floating dtypes only; as scaleInPlace).
  virtual void scale(void* data, size_t count, DType dtype, double factor) = 0;

  // ---- stream operations (asynchronous) ----
  virtual void reduceAsync(void* dst, const void* a, const void* b, size_t count, DType dtype,
                           ReduceOp op, Stream stream) = 0;
  virtual void scaleAsync(void* data, size_t count, DType dtype, double factor, Stream stream) = 0;
  virtual void copyAsync(void* dst, const void* src, size_t bytes, Stream stream) = 0;
  virtual void streamSynchronize(Stream stream) = 0;

  // ---- memory and events ----
  virtual void* alloc(size_t bytes, int device) = 0;
  virtual void free(void* p, int device) noexcept = 0;
  virtual Event createEvent(int device) = 0;
  virtual void recordEvent(Event event, Stream stream, int device) = 0;
  // True once the work recorded before the event finished (cudaEventQuery); throws CudaError
  // when that work failed.
  virtual bool eventDone(Event event) = 0;
  virtual void destroyEvent(Event event, int device) noexcept = 0;
};

// The CUDA implementation in a CUDA build, nullptr in a CPU-only build.
DeviceOps* deviceOps();

// deviceOps(), or a CudaError saying that `what` needs a CUDA build.
inline DeviceOps& requireDeviceOps(const char* what) {
  DeviceOps* ops = deviceOps();
  if (ops == nullptr)
    throw CudaError(makeMessage(what,
                                " needs CUDA, but this build of pycollective has none "
                                "(built with PYCOLLECTIVE_CUDA=OFF, or AUTO without nvcc). "
                                "Rebuild with PYCOLLECTIVE_CUDA=ON and the CUDA toolkit on PATH."));
  return *ops;
}

// Device memory owned by one object (RAII over DeviceOps::alloc/free).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device)
      : ptr_(requireDeviceOps("device memory").alloc(bytes, device)),
        bytes_(bytes),
        device_(device) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_), device_(o.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = o.bytes_;
      device_ = o.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  void reset() noexcept {
    if (ptr_ != nullptr) {
      if (DeviceOps* ops = deviceOps()) ops->free(ptr_, device_);
      ptr_ = nullptr;
    }
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

}  // namespace cuda
}  // namespace pycollective

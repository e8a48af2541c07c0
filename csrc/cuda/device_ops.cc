// DeviceOps over the CUDA runtime (linked statically: a wheel needs only the driver). Compiled
// in CUDA builds only; CPU-only builds link device_ops_none.cc instead.
#include "cuda/device_ops.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"

namespace pycollective {
namespace cuda {

void throwCudaError(cudaError_t error, const char* call, const char* file, int line) {
  // Clears a non-sticky error so that the next call does not report it again.
  cudaGetLastError();
  throw CudaError(makeMessage("CUDA error ", cudaGetErrorName(error), " (",
                              cudaGetErrorString(error), ") in ", call, " at ", file, ":", line));
}

namespace {

cudaStream_t asStream(Stream s) {
  return static_cast<cudaStream_t>(s);
}

// Makes `device` current for a scope and restores the previous one (the current device is
// per-thread state that callers such as CuPy and PyTorch rely on).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    PC_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) PC_CUDA_CHECK(cudaSetDevice(device));
    changed_ = device != previous_;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Synchronous copy on the per-thread stream: any mix of host and device memory (UVA infers the
// direction), peer copies between devices included.
void synchronousCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  PC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread));
  PC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

class CudaDeviceOps final : public DeviceOps {
 public:
  std::string describe() override {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    auto version = [](int v) {
      return v == 0 ? std::string("none")
                    : std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
    };
    return "CUDA runtime " + version(runtime) + ", driver " + version(driver) + ", " +
           std::to_string(deviceCount()) + " device(s)";
  }

  int deviceCount() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // no driver or no device: zero devices, not an error
      return 0;
    }
    return n;
  }

  int pointerDevice(const void* p) override {
    if (p == nullptr) return -1;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return attr.device;
    return -1;
  }

  void setDevice(int device) override { PC_CUDA_CHECK(cudaSetDevice(device)); }

  int currentDevice() override {
    int device = 0;
    PC_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }

  int beginCall(int device, Stream stream) override {
    int previous = 0;
    PC_CUDA_CHECK(cudaGetDevice(&previous));
    PC_CUDA_CHECK(cudaSetDevice(device));
    PC_CUDA_CHECK(cudaStreamSynchronize(asStream(stream)));
    return previous;
  }

  void endCall(int previousDevice) noexcept override {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != previousDevice)
      cudaSetDevice(previousDevice);
    cudaGetLastError();
  }

  void enablePeerAccess(const std::vector<int>& devices) override {
    std::lock_guard<std::mutex> lock(peerMu_);
    for (int from : devices)
      for (int to : devices) {
        if (from == to || peersEnabled_.count({from, to}) != 0) continue;
        int can = 0;
        PC_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
        if (!can)
          throw CudaError(makeMessage(
              "device ", from, " cannot access the memory of device ", to,
              " (no peer-to-peer path between them), which in-process replicas on different "
              "devices need; use algo=\"nccl\", or put the replicas on one device"));
        DeviceGuard guard(from);
        const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
        } else {
          PC_CUDA_CHECK(err);
        }
        peersEnabled_.insert({from, to});
      }
  }

  CopyFn copyFn() override { return &synchronousCopy; }

  ReduceFn reduceFn(DType dtype, ReduceOp op) override { return synchronousReduceFn(dtype, op); }

  void scale(void* data, size_t count, DType dtype, double factor) override {
    if (count == 0) return;
    launchScale(data, count, dtype, factor, cudaStreamPerThread);
    PC_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  }

  void reduceAsync(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op,
                   Stream stream) override {
    launchReduce(dst, a, b, count, dtype, op, asStream(stream));
  }

  void scaleAsync(void* data, size_t count, DType dtype, double factor, Stream stream) override {
    launchScale(data, count, dtype, factor, asStream(stream));
  }

  void copyAsync(void* dst, const void* src, size_t bytes, Stream stream) override {
    if (bytes == 0) return;
    PC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, asStream(stream)));
  }

  void streamSynchronize(Stream stream) override {
    PC_CUDA_CHECK(cudaStreamSynchronize(asStream(stream)));
  }

  void* alloc(size_t bytes, int device) override {
    DeviceGuard guard(device);
    void* p = nullptr;
    PC_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    return p;
  }

  void free(void* p, int device) noexcept override {
    if (p == nullptr) return;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) {
      cudaGetLastError();
      return;  // the runtime is gone (process exit): the driver reclaims the memory
    }
    cudaSetDevice(device);
    cudaFree(p);
    cudaSetDevice(previous);
    cudaGetLastError();
  }

  Event createEvent(int device) override {
    DeviceGuard guard(device);
    cudaEvent_t e = nullptr;
    PC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void recordEvent(Event event, Stream stream, int device) override {
    DeviceGuard guard(device);
    PC_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), asStream(stream)));
  }

  bool eventDone(Event event) override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    PC_CUDA_CHECK(err);
    return true;
  }

  void destroyEvent(Event event, int device) noexcept override {
    if (event == nullptr) return;
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
    cudaGetLastError();
  }

 private:
  std::mutex peerMu_;
  std::set<std::pair<int, int>> peersEnabled_;
};

}  // namespace

DeviceOps* deviceOps() {
  // Never destroyed: communicators freeing device memory from static destructors may still
  // call it during interpreter shutdown.
  static CudaDeviceOps* ops = new CudaDeviceOps();
  return ops;
}

}  // namespace cuda
}  // namespace pycollective

// The device-buffer path of the algorithms, checked without a GPU.
//
// This program links the whole core with a fake DeviceOps instead of the CUDA one. The fake's
// "device memory" is a memfd arena mapped twice: the addresses handed to the algorithms are a
// PROT_NONE mapping, so any host access to a device buffer (a std::memcpy or a CPU reduction
// that should have gone through DeviceOps) dies with SIGSEGV; the fake's own copy/reduce/scale
// reach the same bytes through a second, read-write mapping. Every algorithm x collective x
// dtype x op x size then runs on device buffers and must equal, byte for byte, the same call on
// host buffers. What this cannot check is CUDA itself: the kernels, streams and the CUDA
// runtime calls are verified on a GPU by tests/test_cuda.py (bench/gpu_check.sh).
//
// Built and run by tests/native/run_device_path.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/chunking.h"
#include "core/error.h"
#include "cuda/device_ops.h"
#include "local/local_group.h"
#include "reduce/reduce.h"

using namespace pycollective;

namespace {

// ---- the fake device ----

constexpr size_t kArenaBytes = size_t(1) << 30;
constexpr size_t kTestRegion = kArenaBytes / 2;  // the test's own buffers live above this
char* gDevice = nullptr;                         // PROT_NONE view: what algorithms see
char* gMirror = nullptr;                         // read-write view of the same pages
std::atomic<size_t> gNext{0};    // DeviceOps::alloc (communicators' scratch), below kTestRegion
size_t gCaseNext = kTestRegion;  // the current case's buffers, reset per case
std::atomic<long> gCopies{0}, gReduces{0}, gScales{0}, gBegins{0}, gEnds{0};

bool onDevice(const void* p) {
  auto c = static_cast<const char*>(p);
  return c >= gDevice && c < gDevice + kArenaBytes;
}

void* tr(void* p) {
  return onDevice(p) ? gMirror + (static_cast<char*>(p) - gDevice) : p;
}
const void* tr(const void* p) {
  return tr(const_cast<void*>(p));
}

void fakeCopy(void* dst, const void* src, size_t bytes) {
  ++gCopies;
  std::memmove(tr(dst), tr(src), bytes);
}

template <int D, int O>
void fakeReduce(void* dst, const void* a, const void* b, size_t count) {
  ++gReduces;
  static const ReduceFn fn = lookupReduce(static_cast<DType>(D), static_cast<ReduceOp>(O));
  fn(tr(dst), tr(a), tr(b), count);
}

template <int D>
ReduceFn forOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return &fakeReduce<D, 0>;
    case ReduceOp::kProd: return &fakeReduce<D, 1>;
    case ReduceOp::kMin: return &fakeReduce<D, 2>;
    case ReduceOp::kMax: return &fakeReduce<D, 3>;
    case ReduceOp::kAvg: return &fakeReduce<D, 4>;
  }
  return nullptr;
}

class FakeDeviceOps final : public cuda::DeviceOps {
 public:
  std::string describe() override { return "fake device (memfd, PROT_NONE view)"; }
  int deviceCount() override { return 1; }
  int pointerDevice(const void* p) override { return onDevice(p) ? 0 : -1; }
  void setDevice(int) override {}
  int currentDevice() override { return 0; }
  int beginCall(int device, cuda::Stream) override {
    if (device != 0) throw CudaError("fake device: no device " + std::to_string(device));
    ++gBegins;
    return 0;
  }
  void endCall(int) noexcept override { ++gEnds; }
  void enablePeerAccess(const std::vector<int>&) override {}
  CopyFn copyFn() override { return &fakeCopy; }
  ReduceFn reduceFn(DType dtype, ReduceOp op) override {
    lookupReduce(dtype, op);  // the same validation (integer avg -> InvalidType)
    switch (dtype) {
      case DType::kFloat16: return forOp<0>(op);
      case DType::kBFloat16: return forOp<1>(op);
      case DType::kFloat32: return forOp<2>(op);
      case DType::kFloat64: return forOp<3>(op);
      case DType::kInt8: return forOp<4>(op);
      case DType::kUInt8: return forOp<5>(op);
      case DType::kInt32: return forOp<6>(op);
      case DType::kInt64: return forOp<7>(op);
    }
    return nullptr;
  }
  void scale(void* data, size_t count, DType dtype, double factor) override {
    ++gScales;
    scaleInPlace(tr(data), count, dtype, factor);
  }
  void reduceAsync(void*, const void*, const void*, size_t, DType, ReduceOp,
                   cuda::Stream) override {
    throw CudaError("fake device: no streams");
  }
  void scaleAsync(void*, size_t, DType, double, cuda::Stream) override {
    throw CudaError("fake device: no streams");
  }
  void copyAsync(void*, const void*, size_t, cuda::Stream) override {
    throw CudaError("fake device: no streams");
  }
  void streamSynchronize(cuda::Stream) override {}
  void* alloc(size_t bytes, int) override {
    size_t at = gNext.fetch_add((bytes + 255) / 256 * 256 + 256);
    if (at + bytes > kTestRegion) throw CudaError("fake device: out of memory");
    return gDevice + at;
  }
  void free(void*, int) noexcept override {}
  cuda::Event createEvent(int) override { return nullptr; }
  void recordEvent(cuda::Event, cuda::Stream, int) override {}
  bool eventDone(cuda::Event) override { return true; }
  void destroyEvent(cuda::Event, int) noexcept override {}
};

// A buffer for one case (cudaMalloc-like 256-byte alignment; freed by the next case).
char* caseBuffer(size_t bytes) {
  char* p = gDevice + gCaseNext;
  gCaseNext += (bytes + 255) / 256 * 256 + 256;
  if (gCaseNext > kArenaBytes) throw CudaError("fake device: test region exhausted");
  return p;
}

// ---- the checks ----

int gChecks = 0, gFailures = 0;

void fail(const std::string& what) {
  ++gFailures;
  if (gFailures <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
}

std::vector<char> randomBytes(DType dtype, ReduceOp op, size_t count, std::mt19937& rng) {
  std::vector<char> out(count * elementSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    char* p = out.data() + i * elementSize(dtype);
    // Small values, so products stay finite.
    const int v = static_cast<int>(rng() % 5) - 2;
    const double f = (op == ReduceOp::kProd ? 0.75 : 0.5) + (rng() % 1000) / 1000.0;
    const uint16_t h16 = uint16_t(0x3800 + rng() % 0x0800);  // fp16 in [0.5, 2)
    const uint16_t b16 = uint16_t(0x3F00 + rng() % 0x0100);  // bf16 in [0.5, 2)
    const float f32 = float(v >= 0 ? f : -f);
    const double f64 = v >= 0 ? f : -f;
    const int8_t i8 = int8_t(rng());
    const uint8_t u8 = uint8_t(rng());
    const int32_t i32 = int32_t(rng());
    const int64_t i64 = int64_t(rng()) << 20 | rng();
    switch (dtype) {
      case DType::kFloat16: std::memcpy(p, &h16, 2); break;
      case DType::kBFloat16: std::memcpy(p, &b16, 2); break;
      case DType::kFloat32: std::memcpy(p, &f32, 4); break;
      case DType::kFloat64: std::memcpy(p, &f64, 8); break;
      case DType::kInt8: std::memcpy(p, &i8, 1); break;
      case DType::kUInt8: std::memcpy(p, &u8, 1); break;
      case DType::kInt32: std::memcpy(p, &i32, 4); break;
      case DType::kInt64: std::memcpy(p, &i64, 8); break;
    }
  }
  return out;
}

size_t outCount(CollectiveKind kind, size_t count, int n, int rank) {
  switch (kind) {
    case CollectiveKind::kReduceScatter: return Chunks(count, n).size(rank);
    case CollectiveKind::kAllgather: return count * n;
    default: return count;
  }
}

void runCase(LocalGroup& g, int n, const std::string& algo, CollectiveKind kind, DType dtype,
             ReduceOp op, size_t count, std::mt19937& rng, const std::string& label) {
  const size_t es = elementSize(dtype);
  const int root = n - 1;
  std::vector<std::vector<char>> in(n), hostOut(n);
  std::vector<char*> devIn(n), devOut(n);
  std::vector<CollectiveArgs> host(n), dev(n);
  gCaseNext = kTestRegion;
  for (int r = 0; r < n; ++r) {
    in[r] = randomBytes(dtype, op, count, rng);
    const size_t oc = outCount(kind, count, n, r);
    hostOut[r].assign(oc * es + 1, 0);
    devIn[r] = caseBuffer(count * es + 1);
    devOut[r] = caseBuffer(oc * es + 1);
    if (count > 0) std::memcpy(tr(devIn[r]), in[r].data(), count * es);
    std::memset(tr(devOut[r]), 0, oc * es);
    CollectiveArgs a;
    a.kind = kind;
    a.count = count;
    a.dtype = dtype;
    a.op = op;
    a.root = root;
    a.timeoutSeconds = 30;
    host[r] = a;
    host[r].in = in[r].data();
    host[r].out = hostOut[r].data();
    dev[r] = a;
    dev[r].in = devIn[r];
    dev[r].out = devOut[r];
    dev[r].device = 0;
  }
  // In place for allreduce on odd counts: the aliasing paths (out == in) too.
  if (kind == CollectiveKind::kAllreduce && count % 2 == 1) {
    for (int r = 0; r < n; ++r) {
      hostOut[r] = in[r];
      hostOut[r].push_back(0);
      host[r].in = host[r].out = hostOut[r].data();
      dev[r].out = devIn[r];
      devOut[r] = devIn[r];
    }
  }
  try {
    // "auto" may run small host calls inline (on one thread), which device buffers never do;
    // 16-bit floats round differently in another summation order, so the host reference runs
    // the algorithm auto picks for the device call.
    std::string hostAlgo = algo;
    if (algo == "auto") {
      const std::string why = g.explain(dev[0]);
      hostAlgo = why.substr(0, why.find(' '));
    }
    g.run(host, hostAlgo);
    g.run(dev, algo);
  } catch (const std::exception& e) {
    fail(label + ": " + e.what());
    return;
  }
  for (int r = 0; r < n; ++r) {
    if (kind == CollectiveKind::kReduce && r != root) continue;
    ++gChecks;
    const size_t bytes = outCount(kind, count, n, r) * es;
    if (std::memcmp(tr(devOut[r]), hostOut[r].data(), bytes) != 0)
      fail(label + ": replica " + std::to_string(r) + " differs from the host result");
  }
}

}  // namespace

namespace pycollective {
namespace cuda {
DeviceOps* deviceOps() {
  static FakeDeviceOps ops;
  return &ops;
}
}  // namespace cuda
}  // namespace pycollective

int main() {
  const int fd = memfd_create("pycollective-fake-device", 0);
  if (fd < 0 || ftruncate(fd, kArenaBytes) != 0) {
    std::perror("memfd");
    return 2;
  }
  gDevice = static_cast<char*>(mmap(nullptr, kArenaBytes, PROT_NONE, MAP_SHARED, fd, 0));
  gMirror =
      static_cast<char*>(mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (gDevice == MAP_FAILED || gMirror == MAP_FAILED) {
    std::perror("mmap");
    return 2;
  }
  setenv("PYCOLLECTIVE_SEGMENT_BYTES", "40", 1);  // many segments per chunk
  setenv("PYCOLLECTIVE_DEVICE_SEGMENT_BYTES", "40", 1);

  const std::vector<std::string> algos = {"ring",          "halving_doubling", "hierarchical",
                                          "reduce_to_one", "direct",           "auto"};
  const std::vector<CollectiveKind> kinds = {
      CollectiveKind::kAllreduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllgather,
      CollectiveKind::kBroadcast, CollectiveKind::kReduce};
  const std::vector<DType> dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32,
                                     DType::kFloat64, DType::kInt8,     DType::kUInt8,
                                     DType::kInt32,   DType::kInt64};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin,
                                     ReduceOp::kMax, ReduceOp::kAvg};
  std::mt19937 rng(1234);
  for (int n : {1, 2, 3, 4, 5}) {
    LocalGroup g(n, 30, n % 2 == 0 ? 2 : 0);
    for (const auto& algo : algos)
      for (CollectiveKind kind : kinds) {
        if (algo == "hierarchical" && kind != CollectiveKind::kAllreduce) continue;
        if (algo == "halving_doubling" && kind == CollectiveKind::kReduceScatter && (n & (n - 1)))
          continue;
        for (DType dtype : dtypes)
          for (ReduceOp op : ops) {
            const bool reduces = kind == CollectiveKind::kAllreduce ||
                                 kind == CollectiveKind::kReduce ||
                                 kind == CollectiveKind::kReduceScatter;
            if (!reduces && op != ReduceOp::kSum) continue;
            if (op == ReduceOp::kAvg && !isFloating(dtype)) continue;
            for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(131), size_t(1009)}) {
              const std::string label = algo + " " + collectiveName(kind) +
                                        " n=" + std::to_string(n) + " " + dtypeName(dtype) + " " +
                                        opName(op) + " count=" + std::to_string(count);
              runCase(g, n, algo, kind, dtype, op, count, rng, label);
            }
          }
      }
    gNext = 0;  // every buffer of this group size is dead: reuse the arena
  }
  // Integer avg on device buffers is refused like on host buffers.
  {
    LocalGroup g(2, 30, 0);
    std::vector<CollectiveArgs> args(2);
    for (auto& a : args) {
      a.count = 4;
      a.dtype = DType::kInt32;
      a.op = ReduceOp::kAvg;
      a.in = a.out = caseBuffer(16);
      a.device = 0;
    }
    ++gChecks;
    try {
      g.run(args, "ring");
      fail("integer avg on device buffers was accepted");
    } catch (const InvalidType&) {
    }
  }
  std::printf(
      "device path: %d checks, %d failures (device ops: %ld copies, %ld reductions, "
      "%ld scales, %ld calls)\n",
      gChecks, gFailures, gCopies.load(), gReduces.load(), gScales.load(), gBegins.load());
  if (gBegins != gEnds) fail("beginCall without endCall: " + std::to_string(gBegins - gEnds));
  return gFailures == 0 && gReduces > 0 && gCopies > 0 && gScales > 0 ? 0 : 1;
}

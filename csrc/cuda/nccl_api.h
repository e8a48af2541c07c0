#pragma once
// Our own minimal declarations of the NCCL C API. nccl.h is never included and NCCL is never
// linked: the library is opened at run time (nccl_loader.cc), so building needs neither NCCL nor
// any CUDA header. Streams and communicators are opaque pointers; the enums carry NCCL's
// numbering (stable since NCCL 2.0, ncclAvg/ncclBfloat16 since 2.10, ncclInProgress since 2.14).
//
// The minimum version is 2.14: it has every function below, including the non-blocking
// communicator configuration that lets a watchdog bound init and abort a hung collective.
#include <cstddef>

namespace pycollective {
namespace nccl {

struct OpaqueComm;
using Comm = OpaqueComm*;  // ncclComm_t
using Stream = void*;      // cudaStream_t

constexpr int kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {                    // ncclUniqueId, passed by value like NCCL's
  char internal[kUniqueIdBytes];
};

enum Result : int {  // ncclResult_t
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};
constexpr int kNumResults = 8;

enum DataType : int {  // ncclDataType_t
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

enum RedOp : int {  // ncclRedOp_t: note max before min
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kAvg = 4,
};

// ncclConfig_t as of NCCL 2.14 (the fields after `blocking` came later). NCCL reads `size` and
// `version` and takes its defaults for every field a caller's older struct does not have.
struct ConfigV21400 {
  size_t size = sizeof(ConfigV21400);
  unsigned int magic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic
  unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0)
  int blocking = 1;
};

// NCCL_VERSION(major, minor, patch) for NCCL >= 2.9.
constexpr int versionCode(int major, int minor, int patch) {
  return major * 10000 + minor * 100 + patch;
}
constexpr int kMinVersion = versionCode(2, 14, 0);

// The functions pycollective calls, resolved with dlsym by name.
struct Api {
  Result (*getVersion)(int* version);
  Result (*getUniqueId)(UniqueId* id);
  Result (*commInitRankConfig)(Comm* comm, int nranks, UniqueId id, int rank, ConfigV21400* config);
  Result (*commFinalize)(Comm comm);
  Result (*commDestroy)(Comm comm);
  Result (*commAbort)(Comm comm);
  Result (*commGetAsyncError)(Comm comm, Result* asyncError);
  const char* (*getErrorString)(Result result);
  const char* (*getLastError)(Comm comm);
  Result (*commCount)(Comm comm, int* count);
  Result (*commCuDevice)(Comm comm, int* device);
  Result (*commUserRank)(Comm comm, int* rank);
  Result (*allReduce)(const void* send, void* recv, size_t count, DataType type, RedOp op,
                      Comm comm, Stream stream);
  Result (*broadcast)(const void* send, void* recv, size_t count, DataType type, int root,
                      Comm comm, Stream stream);
  Result (*reduce)(const void* send, void* recv, size_t count, DataType type, RedOp op, int root,
                   Comm comm, Stream stream);
  Result (*allGather)(const void* send, void* recv, size_t sendCount, DataType type, Comm comm,
                      Stream stream);
  Result (*reduceScatter)(const void* send, void* recv, size_t recvCount, DataType type, RedOp op,
                          Comm comm, Stream stream);
  Result (*groupStart)();
  Result (*groupEnd)();
};

}  // namespace nccl
}  // namespace pycollective

// A stand-in libnccl.so.2 for test_nccl_watchdog: every call succeeds at once and nothing runs.
// Completion is the fake DeviceOps' business (its events), so the test decides when a
// collective "finishes". With FAKE_NCCL_NO_COMM set, init reports success but hands back no
// communicator (what a broken or stand-in library can do). The signatures are nccl_api.h's, the
// ones pycollective calls through.
#include <cstdlib>

#include "cuda/nccl_api.h"

using namespace pycollective::nccl;

namespace {
int communicator;  // what init hands back: any address will do
}

extern "C" {

Result ncclGetVersion(int* version) {
  *version = 22105;  // 2.21.5
  return kSuccess;
}

Result ncclGetUniqueId(UniqueId* id) {
  for (int i = 0; i < kUniqueIdBytes; ++i) id->internal[i] = static_cast<char>(i);
  return kSuccess;
}

Result ncclCommInitRankConfig(Comm* comm, int, UniqueId, int, ConfigV21400*) {
  *comm = std::getenv("FAKE_NCCL_NO_COMM") ? nullptr : reinterpret_cast<Comm>(&communicator);
  return kSuccess;
}

Result ncclCommGetAsyncError(Comm, Result* state) {
  *state = kSuccess;  // never an asynchronous error
  return kSuccess;
}

const char* ncclGetErrorString(Result) {
  return "fake NCCL";
}
const char* ncclGetLastError(Comm) {
  return "";
}
Result ncclCommFinalize(Comm) {
  return kSuccess;
}
Result ncclCommDestroy(Comm) {
  return kSuccess;
}
Result ncclCommAbort(Comm) {
  return kSuccess;
}
Result ncclCommCount(Comm, int* count) {
  *count = 1;
  return kSuccess;
}
Result ncclCommCuDevice(Comm, int* device) {
  *device = 0;
  return kSuccess;
}
Result ncclCommUserRank(Comm, int* rank) {
  *rank = 0;
  return kSuccess;
}
Result ncclAllReduce(const void*, void*, size_t, DataType, RedOp, Comm, Stream) {
  return kSuccess;
}
Result ncclBroadcast(const void*, void*, size_t, DataType, int, Comm, Stream) {
  return kSuccess;
}
Result ncclReduce(const void*, void*, size_t, DataType, RedOp, int, Comm, Stream) {
  return kSuccess;
}
Result ncclAllGather(const void*, void*, size_t, DataType, Comm, Stream) {
  return kSuccess;
}
Result ncclReduceScatter(const void*, void*, size_t, DataType, RedOp, Comm, Stream) {
  return kSuccess;
}
Result ncclGroupStart() {
  return kSuccess;
}
Result ncclGroupEnd() {
  return kSuccess;
}

}  // extern "C"

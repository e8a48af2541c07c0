#include "local/inline_collective.h"

#include <cstring>

#include "algorithms/chunking.h"
#include "core/error.h"
#include "reduce/reduce.h"
#include "transport/frame.h"

namespace pycollective {

namespace {

void copyIfApart(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

// Scratch kept by a thread between calls, up to this size (inline calls are small unless a
// user forces algo="inline" on a large buffer, whose scratch is then freed after the call).
constexpr size_t kKeptScratchBytes = 4 << 20;

// The reduction of every replica's input, in replica order, into `acc` (not into an output:
// the outputs may alias the inputs).
const char* reduceAll(const std::vector<CollectiveArgs>& args, std::vector<char>& acc) {
  const CollectiveArgs& a = args[0];
  const size_t bytes = a.count * elementSize(a.dtype);
  const ReduceFn fn = lookupReduce(a.dtype, a.op);  // InvalidType for an integer avg
  acc.resize(bytes);
  if (args.size() == 1) {
    copyIfApart(acc.data(), a.in, bytes);
  } else {
    fn(acc.data(), args[0].in, args[1].in, a.count);
    for (size_t r = 2; r < args.size(); ++r) fn(acc.data(), acc.data(), args[r].in, a.count);
  }
  if (a.op == ReduceOp::kAvg) scaleInPlace(acc.data(), a.count, a.dtype, 1.0 / args.size());
  return acc.data();
}

}  // namespace

double inlineCost(const std::vector<CollectiveArgs>& args) {
  // One thread streaming through buffers that mostly sit in cache: ~38 GB/s of reads plus
  // writes measured for 4 x 1 MiB on a 2-vCPU EPYC VM, falling to ~20 GB/s at 4 x 4 MiB (out
  // of cache, where the threaded algorithms win). 25 GB/s puts the switch between the two.
  constexpr double kSecondsPerByte = 1.0 / 25e9;
  const CollectiveArgs& a = args[0];
  const double n = static_cast<double>(args.size());
  const double S = static_cast<double>(a.count * elementSize(a.dtype));
  switch (a.kind) {
    case CollectiveKind::kAllreduce: return 2 * n * S * kSecondsPerByte;
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter: return (n + 1) * S * kSecondsPerByte;
    case CollectiveKind::kAllgather: return (n + n * n) * S * kSecondsPerByte;
    case CollectiveKind::kBroadcast: return (n + 1) * S * kSecondsPerByte;
    default: return 0;
  }
}

void runInline(const std::vector<CollectiveArgs>& args) {
  PC_ASSERT(!args.empty(), "no replicas");
  const CollectiveArgs& a = args[0];
  PC_CHECK(a.device < 0,
           "algorithm 'inline' runs on host buffers; device tensors need another "
           "algorithm (or algo=\"nccl\")");
  const int n = static_cast<int>(args.size());
  const size_t es = elementSize(a.dtype), bytes = a.count * es;
  thread_local std::vector<char> kept;
  std::vector<char> once;
  std::vector<char>& acc = bytes <= kKeptScratchBytes ? kept : once;
  switch (a.kind) {
    case CollectiveKind::kAllreduce: {
      const char* sum = reduceAll(args, acc);
      for (const CollectiveArgs& r : args) copyIfApart(r.out, sum, bytes);
      return;
    }
    case CollectiveKind::kReduce:
      copyIfApart(args[a.root].out, reduceAll(args, acc), bytes);
      return;
    case CollectiveKind::kReduceScatter: {
      const char* sum = reduceAll(args, acc);
      Chunks chunks(a.count, n);
      for (int r = 0; r < n; ++r)
        copyIfApart(args[r].out, sum + chunks.offset(r) * es, chunks.size(r) * es);
      return;
    }
    case CollectiveKind::kAllgather:
      for (const CollectiveArgs& dst : args)
        for (int p = 0; p < n; ++p)
          copyIfApart(static_cast<char*>(dst.out) + p * bytes, args[p].in, bytes);
      return;
    case CollectiveKind::kBroadcast:
      for (const CollectiveArgs& dst : args) copyIfApart(dst.out, args[a.root].in, bytes);
      return;
    case CollectiveKind::kBarrier: return;  // one thread: everyone is already here
    case CollectiveKind::kAllreduceUpdate:
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
    case CollectiveKind::kSendRecv:
      break;  // process-group collectives (optim/allreduce_update.h, algorithms/pairwise.cc)
  }
  PC_ASSERT(false, "inline cannot run ", collectiveName(a.kind));
}

}  // namespace pycollective

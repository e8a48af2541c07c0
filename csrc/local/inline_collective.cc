#include "local/inline_collective.h"

#include <cstring>

#include "algorithms/chunking.h"
#include "core/error.h"
#include "core/host_copy.h"
#include "reduce/reduce.h"
#include "transport/frame.h"

namespace pycollective {

namespace {

void copyIfApart(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) hostCopy(dst, src, bytes);
}

// Scratch kept by a thread between calls, up to this size (inline calls are small unless a
// user forces algo="inline" on a large buffer, whose scratch is then freed after the call).
constexpr size_t kKeptScratchBytes = 4 << 20;

// Whether the reduction may be written straight into `dst` as it goes: dst is replica 0's
// input itself (each element is read before it is written) or touches no input.
bool safeDestination(const std::vector<CollectiveArgs>& args, const void* dst, size_t bytes) {
  if (dst == nullptr || (dst != args[0].in && rangesOverlap(dst, args[0].in, bytes))) return false;
  for (size_t r = 1; r < args.size(); ++r)
    if (rangesOverlap(dst, args[r].in, bytes)) return false;
  return true;
}

// The reduction of every replica's input, in replica order, into `dst` when that is safe (no
// scratch: a large scratch buffer costs its page faults on every call), else into `acc`.
const char* reduceAll(const std::vector<CollectiveArgs>& args, void* dst, std::vector<char>& acc) {
  const CollectiveArgs& a = args[0];
  const size_t bytes = a.count * elementSize(a.dtype);
  const ReduceFn fn = lookupReduce(a.dtype, a.op);  // InvalidType for an integer avg
  char* out = static_cast<char*>(dst);
  if (!safeDestination(args, dst, bytes)) {
    acc.resize(bytes);
    out = acc.data();
  }
  if (args.size() == 1) {
    copyIfApart(out, a.in, bytes);
  } else {
    fn(out, args[0].in, args[1].in, a.count);
    for (size_t r = 2; r < args.size(); ++r) fn(out, out, args[r].in, a.count);
  }
  if (a.op == ReduceOp::kAvg) scaleInPlace(out, a.count, a.dtype, 1.0 / args.size());
  return out;
}

}  // namespace

double inlineCost(const std::vector<CollectiveArgs>& args, double lineBytes) {
  // One thread streaming through buffers that mostly sit in cache: ~38 GB/s of reads plus
  // writes measured for 4 x 1 MiB on a 2-vCPU EPYC VM, falling to ~20 GB/s at 4 x 4 MiB (out
  // of cache, where the threaded algorithms win). 25 GB/s puts the switch between the two.
  // Beyond that one thread gets far less (14.5 GB/s for a 64 MiB float32 sum of two arrays
  // into a third, 2026-12-02; 2 replicas x 4 MiB inline ran at 17 GB/s, 1.4x `direct`), while
  // the threaded algorithms spread the passes over every core: charge 12 GB/s above the
  // cache.
  constexpr double kInCacheSecondsPerByte = 1.0 / 25e9;
  constexpr double kOutOfCacheSecondsPerByte = 1.0 / 12e9;
  // One thread's working set, hence smaller than the whole call's line in algorithms/
  // cache_model.h, where every core's share of L3 and its own L2 hold the buffers. Placed by
  // measurement: 12 MiB of traffic still ran at in-cache rates (3 replicas x 2 MiB inline:
  // 305 us, 41 GB/s, against `direct`'s 312), while at 8 MiB the model sent such calls to the
  // threaded algorithms, 1.26x-1.38x slower than `inline` with new outputs. On a Xeon VM whose
  // line measures 2 MiB, `inline` stayed ahead up to 8-16 MiB of traffic (8 replicas x 512
  // KiB: 346 us against `direct`'s 569; 4 x 2 MiB: 1005 against 921).
  constexpr double kSmallBytes = 12 << 20;
  // Between that and a larger line (the EPYC VM's, 32 MiB) inline still runs from cache, at
  // 0.6x-0.8x its rate below 12 MiB (23-45 GB/s from 14 to 32 MiB of traffic, 2-8 replicas):
  // priced at 12 GB/s there, it was never raced, and ran 1.2x-1.43x faster than what `auto`
  // chose at 3 x 4 MiB, 4 x 2 MiB and 7 x 1 MiB (docs/benchmarks-log.md, twenty-second session).
  // 18 GB/s: replayed on that sweep's cells of 1-64 MiB, the near ties the model would race
  // held a row within 1.15x of the fastest in every cell for any rate from 16 to 20 GB/s; 14
  // and 22 missed one each, 25 three.
  constexpr double kInLineSecondsPerByte = 1.0 / 18e9;
  const CollectiveArgs& a = args[0];
  const double n = static_cast<double>(args.size());
  const double S = static_cast<double>(a.count * elementSize(a.dtype));
  double traffic = 0;
  switch (a.kind) {
    case CollectiveKind::kAllreduce: traffic = 2 * n * S; break;
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter: traffic = (n + 1) * S; break;
    case CollectiveKind::kAllgather: traffic = (n + n * n) * S; break;
    case CollectiveKind::kBroadcast: traffic = (n + 1) * S; break;
    default: return 0;
  }
  if (traffic <= kSmallBytes) return traffic * kInCacheSecondsPerByte;
  if (traffic <= lineBytes) return traffic * kInLineSecondsPerByte;
  return traffic * kOutOfCacheSecondsPerByte;
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
      const char* sum = reduceAll(args, a.out, acc);
      for (const CollectiveArgs& r : args) copyIfApart(r.out, sum, bytes);
      return;
    }
    case CollectiveKind::kReduce:
      copyIfApart(args[a.root].out, reduceAll(args, args[a.root].out, acc), bytes);
      return;
    case CollectiveKind::kReduceScatter: {
      const char* sum = reduceAll(args, nullptr, acc);
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

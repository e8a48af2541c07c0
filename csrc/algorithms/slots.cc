// Slots: small collectives of the ranks of one host through their host segment
// (transport/host_segment.h). Every rank copies its input into its own slot, waits until every
// rank published the same call, and reads what it needs from the others' slots: one write and
// one wait, where halving-doubling takes log2(n) rounds of messages that each need the peer on
// a core. With more ranks than cores that is most of a small call's time (4 ranks on 2 cores,
// 8 bytes: docs/benchmarks-log.md, "A host-wide segment for small calls").
//
// Reductions run over the slots in rank order on every rank, so every rank's result is the same
// to the bit. Only calls whose input fits a slot run here; auto chooses it by the cost below.
#include <algorithm>

#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/params.h"
#include "transport/host_segment.h"

namespace pycollective {
namespace slots {

namespace {

// The segment's one synchronisation (a store and a wait for every member's), as a share of a
// link message's alpha: with 2 ranks the model then prefers slots to halving-doubling below
// 0.5 alpha / beta (12 KB with the shm defaults), near the measured crossing at 16 KiB where
// both took 4.8 us; with 4 ranks on 2 cores slots measured 1.5x-1.7x faster at 4-16 KiB and the
// model agrees (docs/benchmarks-log.md, "A host-wide segment for small calls").
constexpr double kSyncShareOfAlpha = 0.5;

// Bytes each group rank publishes for the call (broadcast: the root alone).
size_t publishedBytes(const CollectiveArgs& a, int groupRank) {
  const size_t bytes = a.count * elementSize(a.dtype);
  if (a.kind == CollectiveKind::kBroadcast) return groupRank == a.root ? bytes : 0;
  if (a.kind == CollectiveKind::kBarrier) return 0;
  return bytes;
}

// Publishes this rank's part of the call and waits for every rank's: returns each rank's slot.
// Every rank waits for all, whatever it reads: that is what lets a slot be written again two
// calls later (host_segment.h).
std::vector<const char*> meet(Exchange& ex, HostSegment& seg, const CollectiveArgs& a) {
  HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
  const int r = ex.rank();
  const size_t mine = publishedBytes(a, r);
  if (mine > 0) call.write(a.in, mine);
  call.publish(mine);
  std::vector<const char*> slot(ex.size());
  for (int m = 0; m < ex.size(); ++m)
    slot[m] = m == r ? static_cast<const char*>(call.payload())
                     : static_cast<const char*>(call.await(m, publishedBytes(a, m)));
  return slot;
}

class Slots : public Algorithm {
 public:
  const char* name() const override { return "slots"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    const std::string why = whyNotOnSegment(g, a);
    if (!why.empty()) return why;
    const HostSegment* seg = segmentServing(g);
    if (a.kind == CollectiveKind::kAllreduceUpdate)
      return "the fused optimizer step runs on the ring's schedule";
    const size_t bytes = a.count * elementSize(a.dtype);
    const size_t most = std::min(params::hostSlotBytes(), seg->slotBytes());
    if (bytes > most)
      return makeMessage("it runs calls of up to ", most, " bytes per rank, this call ", bytes,
                         " (PYCOLLECTIVE_HOST_SLOT_BYTES; larger allreduces: staged)");
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const LinkCost c = costOf(g, a);
    const double n = g.size();
    const double S = a.count * elementSize(a.dtype);
    // One synchronisation, whose wait for parked ranks is paid once; a copy into the slot; the
    // others' slots read (every rank reads n - 1, allgather's output written too) and reduced.
    const double sync = kSyncShareOfAlpha * c.alpha + parkedPeerWait(g);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
      case CollectiveKind::kReduce: return sync + n * S * c.beta + (n - 1) * S * c.gamma;
      case CollectiveKind::kReduceScatter: return sync + S * c.beta + (n - 1) * S / n * c.gamma;
      case CollectiveKind::kAllgather: return sync + (n + 1) * S * c.beta;
      case CollectiveKind::kBroadcast: return sync + 2 * S * c.beta;
      default: return sync;
    }
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    HostSegment* seg = segmentServing(ex.group());
    const std::vector<const char*> slot = meet(ex, *seg, a);
    const int n = ex.size(), r = ex.rank();
    const size_t es = ex.elemSize(), bytes = a.count * es;
    switch (a.kind) {
      case CollectiveKind::kAllreduce: reduceInRankOrder(ex, slot, 0, bytes, a.out); break;
      case CollectiveKind::kReduce:
        if (r == a.root) reduceInRankOrder(ex, slot, 0, bytes, a.out);
        break;
      case CollectiveKind::kReduceScatter: {
        const Chunks chunks(a.count, n);
        reduceInRankOrder(ex, slot, chunks.offset(r) * es, chunks.size(r) * es, a.out);
        break;
      }
      case CollectiveKind::kAllgather:
        for (int m = 0; m < n; ++m) ex.copy(static_cast<char*>(a.out) + m * bytes, slot[m], bytes);
        break;
      case CollectiveKind::kBroadcast: ex.copy(a.out, slot[a.root], bytes); break;
      default: break;
    }
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const Slots instance;
  return instance;
}

std::string whyNotOnSegment(const Group& g, const CollectiveArgs& a) {
  if (g.comm().hostSegment() == nullptr)
    return "this group has no host segment (its ranks are not processes of one host joined "
           "by shm, or PYCOLLECTIVE_HOST_SEGMENT=0)";
  if (segmentServing(g) == nullptr)
    return "it runs on the group of all ranks of one host (the host segment's members), not "
           "on a subgroup or across hosts";
  if (a.device >= 0) return "it runs on host buffers, not device buffers";
  if (a.wire != WireFormat::kNative) return "compressed calls are for network links";
  return "";
}

HostSegment* segmentServing(const Group& g) {
  HostSegment* seg = g.comm().hostSegment();
  if (seg == nullptr || seg->members() != g.size()) return nullptr;
  for (int i = 0; i < g.size(); ++i)
    if (seg->ranks()[i] != g.globalRank(i)) return nullptr;
  return seg;
}

void reduceInRankOrder(Exchange& ex, const std::vector<const char*>& slot, size_t offset,
                       size_t bytes, void* acc) {
  if (slot.size() == 1) {
    ex.copy(acc, slot[0] + offset, bytes);
    return;
  }
  ex.reduceLocal(acc, slot[0] + offset, slot[1] + offset, bytes);
  for (size_t m = 2; m < slot.size(); ++m) ex.reduceLocal(acc, acc, slot[m] + offset, bytes);
}

void runBarrier(Exchange& ex) {
  CollectiveArgs barrier;
  barrier.kind = CollectiveKind::kBarrier;
  meet(ex, *segmentServing(ex.group()), barrier);
}

}  // namespace slots
}  // namespace pycollective

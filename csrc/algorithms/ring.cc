// The ring: reduce-scatter then allgather in n-1 + n-1 steps. Each chunk is cut into segments;
// segment j of step s goes out as soon as segment j of step s-1 arrived, so sending, receiving
// and reducing overlap along the ring (NCCL's pipelining, gloo's "segments"). Broadcast and
// reduce run the same idea along a chain that ends (reduce) or starts (broadcast) at the root.
#include "algorithms/ring.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "algorithms/chunking.h"
#include "algorithms/link_load.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"

namespace pycollective {
namespace ring {

namespace {

// One ring step as seen by one rank: the chunk it sends right and the chunk it receives from
// the left (copied, or reduced with `accum` when accum != nullptr).
struct Step {
  const char* sendBase;  // start of the buffer holding the chunk to send
  size_t sendChunk;
  char* recvBase;         // start of the full-size buffer the chunk lands in
  const char* accumBase;  // nullptr: copy; else dst = accum OP incoming (same offsets)
  size_t recvChunk;
  char* recvChunkDst = nullptr;  // override of the destination of the received chunk
  // Runs on each received segment (after its reduction) before the next step forwards it.
  const ChunkFn* onArrived = nullptr;
  // The received segment lands in one of the schedule's slots (SlotRing) instead of a
  // chunk-sized buffer: for a result consumed by onArrived and never needed again.
  bool intoSlot = false;
};

// A few segment-sized buffers that the segments of a step with `intoSlot` take in turn. A
// chunk-sized buffer would be written once and read once, then written back to memory as the
// cache evicts it: at 2 ranks and 16 MiB, 16 MiB of memory traffic per call on top of the
// all-reduce's own 48 (the fused SGD step took 1.46x-1.48x the bare ring; with the sums in
// slots that stay in cache, 1.10x-1.20x).
struct SlotRing {
  char* base = nullptr;
  size_t slotBytes = 0;
  size_t slots = 0;  // 0: no step receives into slots
};

// Slots for reduceApplyAllgather's sums: the receive into a slot runs this many segments, less
// one, ahead of their update (runPlans). 2, 4 and 8 measured alike at 2 ranks and 16 MiB
// (256 KiB segments); 4 keeps three segments in flight, and their 1 MiB stays in cache. With
// the 64 KiB segments below, 16 slots (the same 1 MiB) measured worse than 4: Adam's sharded
// step 1.34x-1.38x the bare all-reduce against 1.24x-1.31x, at 2 and 4 workers alike.
constexpr size_t kApplySlots = 4;

// reduceApplyAllgather's segments are at most this long (PYCOLLECTIVE_SEGMENT_BYTES may ask
// for shorter ones). Each segment's update reads and writes the variable and every slot of
// the rule besides the sum: Adam's 256 KiB segments touched 1 MiB each, and with three in
// flight the update ran out of this VM's 2 MiB L2. Measured (2 ranks, 16 MiB in 8 tensors,
// strategy_bench --sharded, two runs each; step / bare all-reduce): Adam 1.30x-1.32x at 256
// KiB, 1.23x-1.25x at 64-128 KiB, 1.32x-1.34x at 32 KiB; momentum 1.14x-1.15x against
// 1.06x at 64 KiB; plain SGD 1.01x-1.02x against 0.94x-0.95x.
constexpr size_t kApplySegmentBytes = 64 << 10;

// One buffer set of a coalesced schedule: its chunking, its segments per chunk and its steps.
// The plans of one schedule have the same number of steps with the same chunk indices: only
// the buffers and the chunk sizes differ.
struct Plan {
  Chunks chunks;
  size_t segments;
  std::vector<Step> steps;
};

// Runs the plans as one pipelined ring: every step of every plan, segment by segment, in the
// same order on every rank. A plan's segment j at step s goes out once its segment j of step
// s-1 arrived, so several tensors keep the pipeline full from the first to the last (one
// collective's fill and drain for all of them, not one per tensor).
//
// Units (a plan's segment) are posted diagonally: unit u of step s at tick u + s * lag, so
// step s runs `lag` units ahead of step s+1. Without slots the lag is a whole step (every
// segment of step s posted before step s+1 starts). With slots it is one less than their
// number: the receive that takes a slot is posted only after the onArrived of the unit that
// held it before has run. Every rank runs the same order, so each link carries its messages in
// the order both ends post them.
void runPlans(Exchange& ex, const std::vector<Plan>& plans, const SlotRing& slots = {}) {
  const int n = ex.size(), r = ex.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const size_t es = ex.elemSize();
  struct Unit {
    size_t plan, segment;
  };
  std::vector<Unit> units;
  for (size_t p = 0; p < plans.size(); ++p)
    for (size_t j = 0; j < plans[p].segments; ++j) units.push_back({p, j});
  const size_t perStep = units.size();
  const size_t numSteps = plans.empty() ? 0 : plans[0].steps.size();
  for (const Plan& plan : plans)
    PC_ASSERT(plan.steps.size() == numSteps, "coalesced ring plans with different step counts");
  const size_t lag = slots.slots > 0 ? slots.slots - 1 : perStep;
  std::vector<RequestPtr> recvs(numSteps * perStep), sends(numSteps * perStep);
  std::vector<const char*> landed(numSteps * perStep);  // where each received segment lands
  const size_t ticks = numSteps == 0 ? 0 : (numSteps - 1) * lag + perStep;
  for (size_t tick = 0; tick < ticks; ++tick) {
    // The steps with a unit at this tick: u = tick - s * lag must lie in [0, perStep).
    const size_t firstStep = lag == 0 || tick < perStep ? 0 : (tick - perStep) / lag + 1;
    const size_t endStep = lag == 0 ? numSteps : std::min(numSteps, tick / lag + 1);
    for (size_t s = firstStep; s < endStep; ++s) {
      const size_t u = tick - s * lag;
      const size_t k = s * perStep + u;
      const Plan& plan = plans[units[u].plan];
      const Chunks& chunks = plan.chunks;
      const size_t m = plan.segments, j = units[u].segment;
      const Step& st = plan.steps[s];
      // The chunk sent at step s is the one received at step s-1 (same segment).
      if (s > 0) {
        ex.wait(recvs[k - perStep]);
        const Step& prev = plan.steps[s - 1];
        Chunks prevSeg(chunks.size(prev.recvChunk), m);
        if (prev.onArrived != nullptr && prevSeg.size(j) > 0)
          (*prev.onArrived)(landed[k - perStep], chunks.offset(prev.recvChunk) + prevSeg.offset(j),
                            prevSeg.size(j));
      }
      Chunks sendSeg(chunks.size(st.sendChunk), m);
      sends[k] =
          ex.send(right, st.sendBase + (chunks.offset(st.sendChunk) + sendSeg.offset(j)) * es,
                  sendSeg.size(j) * es);
      // A send may still be reading the region this step receives into (an in-place
      // allreduce overwrites in the allgather what it sent in the reduce-scatter): let it
      // finish first.
      for (size_t t = 0; t < s; ++t)
        if (plan.steps[t].sendChunk == st.recvChunk && plan.steps[t].sendBase == st.recvBase &&
            st.recvChunkDst == nullptr && !st.intoSlot)
          ex.wait(sends[t * perStep + u]);
      Chunks recvSeg(chunks.size(st.recvChunk), m);
      size_t off = chunks.offset(st.recvChunk) + recvSeg.offset(j);
      char* dst = st.intoSlot                  ? slots.base + (u % slots.slots) * slots.slotBytes
                  : st.recvChunkDst != nullptr ? st.recvChunkDst + recvSeg.offset(j) * es
                                               : st.recvBase + off * es;
      size_t bytes = recvSeg.size(j) * es;
      PC_ASSERT(!st.intoSlot || bytes <= slots.slotBytes, "ring segment of ", bytes,
                " bytes exceeds its slot of ", slots.slotBytes);
      landed[k] = dst;
      recvs[k] = st.accumBase != nullptr ? ex.recvReduce(left, dst, st.accumBase + off * es, bytes)
                                         : ex.recv(left, dst, bytes);
    }
  }
  ex.waitAll();
}

void runSteps(Exchange& ex, const Chunks& chunks, const std::vector<Step>& steps) {
  runPlans(ex,
           {Plan{chunks, segmentsFor(chunks.size(0), ex.elemSize(), ex.segmentBytes()), steps}});
}

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// Steps of the reduce-scatter phase; rank r ends holding chunk r.
void addReduceScatterSteps(std::vector<Step>& steps, int n, int r, const char* in, char* work,
                           char* out) {
  for (int s = 0; s + 1 < n; ++s) {
    Step st{};
    st.sendBase = s == 0 ? in : work;
    st.sendChunk = mod(r - s - 1, n);
    st.recvBase = work;
    st.accumBase = in;
    st.recvChunk = mod(r - s - 2, n);
    if (s + 2 == n) st.recvChunkDst = out;  // the last step delivers chunk r
    steps.push_back(st);
  }
}

// Steps of the allgather phase; rank r starts holding chunk r of buf.
void addAllgatherSteps(std::vector<Step>& steps, int n, int r, char* buf) {
  for (int s = 0; s + 1 < n; ++s)
    steps.push_back(Step{buf, static_cast<size_t>(mod(r - s, n)), buf, nullptr,
                         static_cast<size_t>(mod(r - s - 1, n))});
}

}  // namespace

void reduceScatter(Exchange& ex, const char* in, char* work, char* out, size_t count) {
  const int n = ex.size(), r = ex.rank();
  Chunks chunks(count, n);
  if (n == 1) {
    if (out != in) ex.copy(out, in, count * ex.elemSize());
    return;
  }
  std::vector<Step> steps;
  addReduceScatterSteps(steps, n, r, in, work, out);
  runSteps(ex, chunks, steps);
}

void allgather(Exchange& ex, char* buf, size_t count) {
  const int n = ex.size();
  if (n == 1) return;
  std::vector<Step> steps;
  addAllgatherSteps(steps, n, ex.rank(), buf);
  runSteps(ex, Chunks(count, n), steps);
}

void allreduce(Exchange& ex, const char* in, char* out, size_t count) {
  const int n = ex.size(), r = ex.rank();
  Chunks chunks(count, n);
  if (n == 1) {
    if (out != in) ex.copy(out, in, count * ex.elemSize());
    return;
  }
  std::vector<Step> steps;
  addReduceScatterSteps(steps, n, r, in, out, out + chunks.offset(r) * ex.elemSize());
  // Compressed: each segment of this rank's finished chunk is rounded to the wire format before
  // the allgather sends it, so every rank ends with the same, rounded, values.
  const ChunkFn round = [&ex](const char* finished, size_t, size_t count) {
    ex.roundToWire(const_cast<char*>(finished), count);
  };
  if (ex.compressed()) steps.back().onArrived = &round;
  addAllgatherSteps(steps, n, r, out);
  runSteps(ex, chunks, steps);
}

void reduceApplyAllgather(Exchange& ex, const std::vector<ApplyBuffers>& tensors) {
  const int n = ex.size(), r = ex.rank();
  if (n == 1) {
    for (const ApplyBuffers& t : tensors)
      if (t.count > 0) (*t.apply)(t.in, 0, t.count);
    return;
  }
  const size_t es = ex.elemSize();
  std::vector<Plan> plans;
  size_t largestSegment = 1;  // elements
  for (const ApplyBuffers& t : tensors) {
    PC_ASSERT(!t.gather.empty(), "reduceApplyAllgather needs a buffer to gather");
    Plan plan{Chunks(t.count, n), 0, {}};
    plan.segments =
        segmentsFor(plan.chunks.size(0), es, std::min(ex.segmentBytes(), kApplySegmentBytes));
    largestSegment = std::max(largestSegment, Chunks(plan.chunks.size(0), plan.segments).size(0));
    addReduceScatterSteps(plan.steps, n, r, t.in, t.work, /*out=*/nullptr);
    // Every segment of this rank's chunk is applied as it arrives, before the allgather's
    // first step sends that segment of gather[0] on: the state crosses the ring once, already
    // updated. The sum itself is needed only there, so it lands in a slot.
    plan.steps.back().intoSlot = true;
    plan.steps.back().onArrived = t.apply;
    for (char* buf : t.gather) addAllgatherSteps(plan.steps, n, r, buf);
    plans.push_back(std::move(plan));
  }
  SlotRing slots;
  slots.slots = kApplySlots;
  slots.slotBytes = largestSegment * es;
  slots.base = static_cast<char*>(ex.scratch(1, slots.slots * slots.slotBytes));
  runPlans(ex, plans, slots);
}

namespace {

// Pipelined chain: position 0 starts, position n-1 ends. Every rank but the first receives
// each segment from its predecessor (copying or reducing with `accum`), and every rank but the
// last forwards it to its successor from `fwd`.
void chain(Exchange& ex, int position, int prevRank, int nextRank, const char* firstSrc, char* dst,
           const char* accum, size_t count) {
  const int n = ex.size();
  const size_t es = ex.elemSize();
  const size_t m = segmentsFor(count, es, ex.segmentBytes());
  Chunks seg(count, m);
  const bool first = position == 0, last = position == n - 1;
  std::vector<RequestPtr> recvs(m);
  if (!first)
    for (size_t j = 0; j < m; ++j) {
      size_t off = seg.offset(j) * es, bytes = seg.size(j) * es;
      recvs[j] = accum != nullptr ? ex.recvReduce(prevRank, dst + off, accum + off, bytes)
                                  : ex.recv(prevRank, dst + off, bytes);
    }
  if (!last)
    for (size_t j = 0; j < m; ++j) {
      if (!first) ex.wait(recvs[j]);
      const char* src = first ? firstSrc : dst;
      ex.send(nextRank, src + seg.offset(j) * es, seg.size(j) * es);
    }
  ex.waitAll();
}

class RingAlgorithm : public Algorithm {
 public:
  const char* name() const override { return "ring"; }

  std::string unsupported(const Group&, const CollectiveArgs&) const override { return ""; }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const int size = g.size();
    const double n = size, S = a.count * elementSize(a.dtype);
    const LinkCost c = costOf(g, a);
    // Every rank works in every step: on a crowded host each step waits for parked ranks and
    // runs at the ranks' share of the cores (shared_cores.h).
    const double crowd = crowding(g);
    const double alpha = c.alpha + parkedPeerWait(g), gamma = crowd * c.gamma;
    // Every rank sends to the next at once: the busiest host link sets the pace (link_load.h).
    const double beta = crowd * stepBeta(g, a, [size](int i) { return (i + 1) % size; });
    const double copyBeta = crowd * g.comm().localCost().beta;  // a copy within this rank's memory
    const double seg = static_cast<double>(a.segmentBytes ? a.segmentBytes : 262144);
    // Each chunk travels in segments: the pipeline hides their transfers but not one message's
    // fixed cost per segment (between threads a wake-up each: with 2 in-process replicas at
    // 16-64 MiB the ring measured 1.7-2.6x `direct`, whose model was otherwise the same).
    const double extraSegments = std::max(0.0, std::ceil(S / n / seg) - 1);
    const double segAlpha = c.alpha;  // the segments of a chunk follow their first: no wake-up
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        // + S / n: this rank's own chunk also passes from its input into its output.
        return 2 * (n - 1) * alpha + extraSegments * segAlpha + 2 * (n - 1) / n * S * beta +
               S / n * copyBeta + (n - 1) / n * S * gamma;
      case CollectiveKind::kReduceScatter:
        return (n - 1) * alpha + (n - 1) / n * S * (beta + gamma);
      case CollectiveKind::kAllgather: return (n - 1) * alpha + (n - 1) * S * beta;
      case CollectiveKind::kBroadcast:
        return (n - 1) * alpha + S * beta + (n - 2) * std::min(S, seg) * beta;
      case CollectiveKind::kReduce:
        return (n - 1) * alpha + S * (beta + gamma) + (n - 2) * std::min(S, seg) * beta;
      default: return 1e30;
    }
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    const int n = ex.size(), r = ex.rank();
    const size_t es = ex.elemSize();
    const char* in = static_cast<const char*>(a.in);
    char* out = static_cast<char*>(a.out);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        allreduce(ex, in, out, a.count);
        if (n > 1) ex.markOutputRounded();
        return;
      case CollectiveKind::kReduceScatter: {
        char* work = static_cast<char*>(ex.scratch(0, a.count * es));
        reduceScatter(ex, in, work, out, a.count);
        return;
      }
      case CollectiveKind::kAllgather: {
        char* mine = out + static_cast<size_t>(r) * a.count * es;
        if (mine != in) ex.copy(mine, in, a.count * es);
        allgather(ex, out, a.count * n);
        return;
      }
      case CollectiveKind::kBroadcast: {
        int pos = mod(r - a.root, n);
        if (pos == 0 && out != in) ex.copy(out, in, a.count * es);
        chain(ex, pos, mod(r - 1, n), mod(r + 1, n), in, out, nullptr, a.count);
        return;
      }
      case CollectiveKind::kReduce: {
        // The chain starts right after the root and ends at the root.
        int pos = mod(r - a.root - 1, n);
        if (n == 1) {
          if (out != in) ex.copy(out, in, a.count * es);
          return;
        }
        char* dst = r == a.root ? out : static_cast<char*>(ex.scratch(0, a.count * es));
        chain(ex, pos, mod(r - 1, n), mod(r + 1, n), in, dst, in, a.count);
        return;
      }
      default: PC_ASSERT(false, "ring cannot run ", collectiveName(a.kind));
    }
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const RingAlgorithm instance;
  return instance;
}

}  // namespace ring
}  // namespace pycollective

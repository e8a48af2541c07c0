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
};

// Hands segment j of the chunk `st` received to its onArrived callback.
void arrived(const Step& st, const Chunks& chunks, size_t m, size_t j, size_t es) {
  Chunks seg(chunks.size(st.recvChunk), m);
  if (seg.size(j) == 0) return;
  const char* data = st.recvChunkDst != nullptr
                         ? st.recvChunkDst + seg.offset(j) * es
                         : st.recvBase + (chunks.offset(st.recvChunk) + seg.offset(j)) * es;
  (*st.onArrived)(data, chunks.offset(st.recvChunk) + seg.offset(j), seg.size(j));
}

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
void runPlans(Exchange& ex, const std::vector<Plan>& plans) {
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
  std::vector<RequestPtr> recvs(numSteps * perStep), sends(numSteps * perStep);
  for (size_t k = 0; k < recvs.size(); ++k) {
    const size_t s = k / perStep, u = k % perStep;
    const Plan& plan = plans[units[u].plan];
    const Chunks& chunks = plan.chunks;
    const size_t m = plan.segments, j = units[u].segment;
    const Step& st = plan.steps[s];
    // The chunk sent at step s is the one received at step s-1 (same segment).
    if (s > 0) {
      ex.wait(recvs[k - perStep]);
      if (plan.steps[s - 1].onArrived != nullptr) arrived(plan.steps[s - 1], chunks, m, j, es);
    }
    Chunks sendSeg(chunks.size(st.sendChunk), m);
    sends[k] = ex.send(right, st.sendBase + (chunks.offset(st.sendChunk) + sendSeg.offset(j)) * es,
                       sendSeg.size(j) * es);
    // A send may still be reading the region this step receives into (an in-place allreduce
    // overwrites in the allgather what it sent in the reduce-scatter): let it finish first.
    for (size_t t = 0; t < s; ++t)
      if (plan.steps[t].sendChunk == st.recvChunk && plan.steps[t].sendBase == st.recvBase &&
          st.recvChunkDst == nullptr)
        ex.wait(sends[t * perStep + u]);
    Chunks recvSeg(chunks.size(st.recvChunk), m);
    size_t off = chunks.offset(st.recvChunk) + recvSeg.offset(j);
    char* dst = st.recvChunkDst != nullptr ? st.recvChunkDst + recvSeg.offset(j) * es
                                           : st.recvBase + off * es;
    size_t bytes = recvSeg.size(j) * es;
    recvs[k] = st.accumBase != nullptr ? ex.recvReduce(left, dst, st.accumBase + off * es, bytes)
                                       : ex.recv(left, dst, bytes);
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
  std::vector<Plan> plans;
  for (const ApplyBuffers& t : tensors) {
    PC_ASSERT(!t.gather.empty(), "reduceApplyAllgather needs a buffer to gather");
    Plan plan{Chunks(t.count, n), 0, {}};
    plan.segments = segmentsFor(plan.chunks.size(0), ex.elemSize(), ex.segmentBytes());
    addReduceScatterSteps(plan.steps, n, r, t.in, t.work, t.reduced);
    // Every segment of this rank's chunk is applied as it arrives, before the allgather's
    // first step sends that segment of gather[0] on: the state crosses the ring once, already
    // updated.
    plan.steps.back().onArrived = t.apply;
    for (char* buf : t.gather) addAllgatherSteps(plan.steps, n, r, buf);
    plans.push_back(std::move(plan));
  }
  runPlans(ex, plans);
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
    const double alpha = c.alpha, gamma = c.gamma;
    // Every rank sends to the next at once: the busiest host link sets the pace (link_load.h).
    const double beta = stepBeta(g, a, [size](int i) { return (i + 1) % size; });
    const double copyBeta = g.comm().localCost().beta;  // a copy within this rank's memory
    const double seg = static_cast<double>(a.segmentBytes ? a.segmentBytes : 262144);
    // Each chunk travels in segments: the pipeline hides their transfers but not one message's
    // fixed cost per segment (between threads a wake-up each: with 2 in-process replicas at
    // 16-64 MiB the ring measured 1.7-2.6x `direct`, whose model was otherwise the same).
    const double extraSegments = std::max(0.0, std::ceil(S / n / seg) - 1);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        // + S / n: this rank's own chunk also passes from its input into its output.
        return 2 * (n - 1) * alpha + extraSegments * alpha + 2 * (n - 1) / n * S * beta +
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

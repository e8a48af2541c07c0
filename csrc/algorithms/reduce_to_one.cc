// Reduce to one rank, then send the result to everyone: tf.distribute's ReductionToOneDevice.
// The root does all the reducing, one peer at a time in rank order (so the result does not
// depend on arrival order); simple and latency-light for tiny groups, a bottleneck for big ones.
#include <algorithm>
#include <cstring>

#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"

namespace pycollective {
namespace reduce_to_one {

namespace {

// dst (at root) = in_0 OP in_1 OP ... in rank order. Other ranks only send.
void reduceToRoot(Exchange& ex, const char* in, char* dst, size_t count, int root) {
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = count * ex.elemSize();
  if (r != root) {
    ex.send(root, in, bytes);
    ex.waitAll();
    return;
  }
  if (n == 1) {
    if (dst != in) ex.copy(dst, in, bytes);
    return;
  }
  // Accumulate in rank order; the root's own contribution enters at its position.
  bool first = true;
  for (int p = 0; p < n; ++p) {
    if (p == root) continue;
    if (first) {
      // The root's input is combined with the first peer's data.
      ex.recvReduce(p, dst, in, bytes);
      first = false;
    } else {
      ex.recvReduce(p, dst, dst, bytes);
    }
    ex.waitAll();  // one at a time: every reduction writes dst
  }
}

void fromRoot(Exchange& ex, char* buf, size_t bytes, int root) {
  if (ex.rank() == root) {
    for (int p = 0; p < ex.size(); ++p)
      if (p != root) ex.send(p, buf, bytes);
  } else {
    ex.recv(root, buf, bytes);
  }
  ex.waitAll();
}

class ReduceToOne : public Algorithm {
 public:
  const char* name() const override { return "reduce_to_one"; }
  std::string unsupported(const Group&, const CollectiveArgs&) const override { return ""; }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const Communicator& comm = g.comm();
    const double n = g.size(), S = a.count * elementSize(a.dtype);
    // Every peer's message passes through the root one after another: those of peers on the
    // root's host over local links, the others over the root host's one link. Each is priced as
    // an exchange; between processes they run one way (link_load.h) and measured 1.3x-2.6x
    // below this price with 2-4 ranks on 2 cores. Pricing them one way brought this algorithm
    // into auto's race and cost more than it won (docs/benchmarks-log.md, "reduce_to_one priced
    // one way between processes: tried and dropped").
    const auto& hosts = comm.hostOf();
    const int rootHost = hosts[g.globalRank(std::min(std::max(a.root, 0), g.size() - 1))];
    double remote = 0;
    for (int i = 0; i < g.size(); ++i)
      if (hosts[g.globalRank(i)] != rootHost) ++remote;
    const double local = n - 1 - remote, gamma = costOf(g, a).gamma;
    const LinkCost& lc = comm.localCost();
    const LinkCost rc = onWire(comm.remoteCost(), a);  // compressed calls send fewer bytes
    const double in =
        local * (lc.alpha + S * (lc.beta + gamma)) + remote * (rc.alpha + S * (rc.beta + gamma));
    const double outAll = local * (lc.alpha + S * lc.beta) + remote * (rc.alpha + S * rc.beta);
    // On a crowded host (shared_cores.h) each phase waits once for parked peers: the root takes
    // the messages of a phase in whatever order they come. Its own path is the critical one, so
    // the other ranks' turns on the cores cost it nothing more.
    const double wait = parkedPeerWait(g);
    switch (a.kind) {
      case CollectiveKind::kAllreduce: return in + outAll + 2 * wait;
      case CollectiveKind::kReduce: return in + wait;
      case CollectiveKind::kBroadcast: return outAll + wait;
      case CollectiveKind::kAllgather: return outAll + n * outAll + 2 * wait;
      case CollectiveKind::kReduceScatter: return in + outAll / n + 2 * wait;
      default: return 1e30;
    }
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    const int n = ex.size(), r = ex.rank(), root = a.root;
    const size_t es = ex.elemSize(), bytes = a.count * es;
    const char* in = static_cast<const char*>(a.in);
    char* out = static_cast<char*>(a.out);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        reduceToRoot(ex, in, out, a.count, root);
        fromRoot(ex, out, bytes, root);
        return;
      case CollectiveKind::kReduce: reduceToRoot(ex, in, out, a.count, root); return;
      case CollectiveKind::kBroadcast:
        if (r == root && out != in) ex.copy(out, in, bytes);
        fromRoot(ex, out, bytes, root);
        return;
      case CollectiveKind::kAllgather: {
        if (r == root) {
          for (int p = 0; p < n; ++p) {
            char* slot = out + static_cast<size_t>(p) * bytes;
            if (p == root) {
              if (slot != in) ex.copy(slot, in, bytes);
            } else {
              ex.recv(p, slot, bytes);
            }
          }
        } else {
          ex.send(root, in, bytes);
        }
        ex.waitAll();
        fromRoot(ex, out, bytes * n, root);
        return;
      }
      case CollectiveKind::kReduceScatter: {
        Chunks chunks(a.count, n);
        if (r == root) {
          char* full = static_cast<char*>(ex.scratch(0, bytes));
          reduceToRoot(ex, in, full, a.count, root);
          for (int p = 0; p < n; ++p) {
            const char* part = full + chunks.offset(p) * es;
            if (p == root)
              ex.copy(out, part, chunks.size(p) * es);
            else
              ex.send(p, part, chunks.size(p) * es);
          }
        } else {
          reduceToRoot(ex, in, nullptr, a.count, root);
          ex.recv(root, out, chunks.size(r) * es);
        }
        ex.waitAll();
        return;
      }
      default: PC_ASSERT(false, "reduce_to_one cannot run ", collectiveName(a.kind));
    }
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const ReduceToOne instance;
  return instance;
}

}  // namespace reduce_to_one
}  // namespace pycollective

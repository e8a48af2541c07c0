// Hierarchical allreduce (Horovod's split): reduce-scatter among the ranks of one host, allreduce
// of each rank's shard across hosts (every local rank drives its own cross-host ring, so all
// inter-host links work at once), allgather among the ranks of one host. Inter-host traffic is
// 1/local_size of a flat ring's. In-process replicas form groups of `hierarchicalGroupSize`
// consecutive ranks instead of hosts. Where the ranks of a host share a host segment, the
// phases inside it run through the segment (staged's), else around a ring of their links.
#include <algorithm>
#include <map>
#include <vector>

#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/link_load.h"
#include "algorithms/registry.h"
#include "algorithms/ring.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"

namespace pycollective {
namespace hierarchical {

namespace {

struct Layout {
  std::vector<std::vector<int>> groups;  // ranks per host (group ranks), in first-seen order
  std::string problem;                   // non-empty when the layout cannot be used
};

Layout layoutOf(const Group& g) {
  Layout l;
  const Communicator& comm = g.comm();
  const int n = g.size();
  if (comm.hierarchicalGroupSize() > 0) {
    int size = comm.hierarchicalGroupSize();
    if (n % size != 0) {
      l.problem =
          "group size " + std::to_string(size) + " does not divide " + std::to_string(n) + " ranks";
      return l;
    }
    for (int start = 0; start < n; start += size) {
      l.groups.emplace_back();
      for (int i = start; i < start + size; ++i) l.groups.back().push_back(i);
    }
    return l;
  }
  std::map<int, size_t> slot;
  for (int i = 0; i < n; ++i) {
    int host = comm.hostOf()[g.globalRank(i)];
    auto it = slot.find(host);
    if (it == slot.end()) {
      slot[host] = l.groups.size();
      l.groups.push_back({i});
    } else {
      l.groups[it->second].push_back(i);
    }
  }
  for (const auto& grp : l.groups)
    if (grp.size() != l.groups[0].size()) {
      std::string sizes;
      for (const auto& x : l.groups)
        sizes += (sizes.empty() ? "" : ", ") + std::to_string(x.size());
      l.problem = "hosts run different numbers of ranks (" + sizes +
                  "); it needs the same number on every host";
      return l;
    }
  return l;
}

// The global ranks of the calling rank's host (its group in `l`).
std::vector<int> hostRanks(const Group& g, const Layout& l) {
  std::vector<int> ranks;
  for (const auto& grp : l.groups)
    if (std::find(grp.begin(), grp.end(), g.rank()) != grp.end())
      for (int m : grp) ranks.push_back(g.globalRank(m));
  return ranks;
}

class Hierarchical : public Algorithm {
 public:
  const char* name() const override { return "hierarchical"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    if (a.kind != CollectiveKind::kAllreduce)
      return "it implements allreduce only; use ring, halving_doubling or reduce_to_one";
    return layoutOf(g).problem;
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    Layout l = layoutOf(g);
    const double L = l.groups[0].size(), H = l.groups.size();
    // A layout of one host or one rank per host is just a ring: leave it to the ring.
    if (L == 1 || H == 1) return 1e30;
    const LinkCost& lc = g.comm().localCost();
    const LinkCost rc = onWire(g.comm().remoteCost(), a);
    // Where each rank sends in the two kinds of step: to the next rank of its own group (the
    // local reduce-scatter and allgather), and to the rank of the same local index in the next
    // group (the cross-group rings, all at once: L of them share each host link, link_load.h).
    std::vector<int> groupOf(g.size()), indexIn(g.size());
    for (size_t gi = 0; gi < l.groups.size(); ++gi)
      for (size_t li = 0; li < l.groups[gi].size(); ++li) {
        groupOf[l.groups[gi][li]] = static_cast<int>(gi);
        indexIn[l.groups[gi][li]] = static_cast<int>(li);
      }
    const double localBeta = stepBeta(g, a, [&](int i) {
      const auto& grp = l.groups[groupOf[i]];
      return grp[(indexIn[i] + 1) % grp.size()];
    });
    const double crossBeta = stepBeta(
        g, a, [&](int i) { return l.groups[(groupOf[i] + 1) % l.groups.size()][indexIn[i]]; });
    const double S = a.count * elementSize(a.dtype);
    // Every rank works in both phases: on crowded hosts each step waits for parked ranks and
    // runs at the ranks' share of the cores (shared_cores.h), as the ring's do.
    const double crowd = crowding(g), wait = parkedPeerWait(g);
    // The two phases inside this rank's host: through its segment at staged's price, else
    // around a ring of its links. (Group needs a communicator it may use; the cost only reads
    // it.)
    const Group host(const_cast<Communicator&>(g.comm()), hostRanks(g, l));
    double local = 0;
    if (staged::segmentFor(host, a) != nullptr) {
      CollectiveArgs phase = a;
      phase.kind = CollectiveKind::kReduceScatter;
      local = staged::algorithm().cost(host, phase);
      phase.kind = CollectiveKind::kAllgather;
      phase.count = Chunks(a.count, l.groups[0].size()).size(0);
      local += staged::algorithm().cost(host, phase);
    } else {
      local = 2 * (L - 1) * (lc.alpha + wait) +
              crowd * (2 * (L - 1) / L * S * localBeta + (L - 1) / L * S * lc.gamma);
    }
    double shard = S / L;
    double cross = 2 * (H - 1) * (rc.alpha + wait) +
                   crowd * (2 * (H - 1) / H * shard * crossBeta + (H - 1) / H * shard * rc.gamma);
    return local + cross;
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    Layout l = layoutOf(ex.group());
    PC_ASSERT(l.problem.empty(), l.problem);
    const int me = ex.rank();
    const std::vector<int> local = hostRanks(ex.group(), l);
    std::vector<int> cross;
    int localIndex = -1;
    for (const auto& grp : l.groups) {
      auto it = std::find(grp.begin(), grp.end(), me);
      if (it != grp.end()) localIndex = static_cast<int>(it - grp.begin());
    }
    for (const auto& grp : l.groups) cross.push_back(ex.group().globalRank(grp[localIndex]));
    Communicator& comm = ex.group().comm();
    Exchange localEx = ex.on(Group(comm, local));
    Exchange crossEx = ex.on(Group(comm, cross));

    const size_t es = ex.elemSize();
    const char* in = static_cast<const char*>(a.in);
    char* out = static_cast<char*>(a.out);
    Chunks shards(a.count, local.size());
    char* shard = out + shards.offset(localIndex) * es;
    // Across hosts only: on one host `staged` runs the whole allreduce, and `auto` never picks
    // this algorithm there (its cost above), so its explicit calls keep the rings they had.
    // (There the segment's two phases ran 1.15x-1.19x faster than staged's allreduce with 2
    // ranks at 256 KiB-1 MiB and up to 1.25x slower at 32-64 MiB: docs/benchmarks-log.md, "Staged
    // reduce-scatter and allgather".)
    HostSegment* seg = cross.size() > 1 ? staged::segmentFor(localEx.group(), a) : nullptr;
    if (seg != nullptr)
      staged::reduceScatter(localEx, *seg, in, shard, a.count);
    else
      ring::reduceScatter(localEx, in, out, shard, a.count);
    ring::allreduce(crossEx, shard, shard, shards.size(localIndex));
    if (seg != nullptr)
      staged::allgather(localEx, *seg, shard, out, shards);
    else
      ring::allgather(localEx, out, a.count);
    // The cross-host ring rounded every shard of a compressed call where it was finished, and
    // the local allgather copied those values.
    if (cross.size() > 1) ex.markOutputRounded();
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const Hierarchical instance;
  return instance;
}

}  // namespace hierarchical
}  // namespace pycollective

#include "algorithms/link_load.h"

#include <algorithm>
#include <unordered_map>

#include "algorithms/registry.h"

namespace pycollective {

double stepBeta(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to) {
  const Communicator& comm = g.comm();
  const double remoteBeta = onWire(comm.remoteCost(), args).beta;
  const auto& hosts = comm.hostOf();
  std::unordered_map<int, int> leaving, entering;  // cross-host messages per host and direction
  for (int i = 0; i < g.size(); ++i) {
    const int j = to(i);
    if (j < 0 || j == i) continue;
    const int from = hosts[g.globalRank(i)], into = hosts[g.globalRank(j)];
    if (from == into) continue;
    ++leaving[from];
    ++entering[into];
  }
  double beta = 0;
  for (int i = 0; i < g.size(); ++i) {
    const int j = to(i);
    if (j < 0 || j == i) continue;
    const int from = hosts[g.globalRank(i)], into = hosts[g.globalRank(j)];
    const double b =
        from == into ? comm.localCost().beta : remoteBeta * std::max(leaving[from], entering[into]);
    beta = std::max(beta, b);
  }
  return beta > 0 ? beta : comm.localCost().beta;
}

double oneWaySeconds(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to,
                     double bytes, bool reduce, double crowd) {
  const Communicator& comm = g.comm();
  const double beta = stepBeta(g, args, to), gamma = costOf(g, args).gamma;
  bool sameHost = true;
  const auto& hosts = comm.hostOf();
  for (int i = 0; i < g.size() && sameHost; ++i) {
    const int j = to(i);
    sameHost = j < 0 || j == i || hosts[g.globalRank(i)] == hosts[g.globalRank(j)];
  }
  if (!sameHost || !comm.localCost().bothSidesCopy)
    return crowd * bytes * (beta + (reduce ? gamma : 0));
  const double copy = bytes * beta / 2;
  return crowd * (reduce ? std::max(copy, bytes * gamma) : copy);
}

double stepAlpha(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to) {
  const Communicator& comm = g.comm();
  const auto& hosts = comm.hostOf();
  for (int i = 0; i < g.size(); ++i) {
    const int j = to(i);
    if (j >= 0 && j != i && hosts[g.globalRank(i)] != hosts[g.globalRank(j)])
      return onWire(comm.remoteCost(), args).alpha;
  }
  return comm.localCost().alpha;
}

}  // namespace pycollective

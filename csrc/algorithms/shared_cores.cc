#include "algorithms/shared_cores.h"

#include <algorithm>
#include <unordered_map>

#include "comm/communicator.h"

namespace pycollective {

double crowding(const Group& g, const std::function<bool(int)>& active) {
  const int cores = g.comm().modelCores();
  if (cores <= 0) return 1.0;
  const auto& hosts = g.comm().hostOf();
  std::unordered_map<int, int> working;
  int most = 0;
  for (int i = 0; i < g.size(); ++i)
    if (active(i)) most = std::max(most, ++working[hosts[g.globalRank(i)]]);
  return std::max(1.0, static_cast<double>(most) / cores);
}

double crowding(const Group& g) {
  return crowding(g, [](int) { return true; });
}

double parkedPeerWait(const Group& g) {
  return crowding(g) > 1.0 ? kParkedPeerSeconds : 0.0;
}

}  // namespace pycollective

// Dissemination barrier over the group's links: in round k every rank signals rank r + 2^k and
// waits for rank r - 2^k; after ceil(log2 n) rounds every rank has heard, transitively, from
// every other. One byte per message, so it also checks that all ranks called barrier().
#include "algorithms/barrier.h"

namespace pycollective {

void runBarrier(Exchange& ex) {
  const int n = ex.size(), r = ex.rank();
  char token = 1, sink[64];
  int round = 0;
  for (int dist = 1; dist < n; dist *= 2, ++round) {
    ex.send((r + dist) % n, &token, 1);
    ex.recv((r - dist + n) % n, &sink[round % 64], 1);
    ex.waitAll();
  }
}

}  // namespace pycollective

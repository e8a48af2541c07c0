#pragma once
// The cost model's view of shared cores. Where a group's ranks on one host outnumber the cores
// the model gives that host (Communicator::modelCores), the ranks take turns on them: a step in
// which k of them work at once runs k / cores times slower, and every step waits for a peer the
// scheduler may have parked, a wake-up the link's alpha does not count. Algorithms whose steps
// keep few ranks busy (halving-doubling's fold of a third rank, reduce_to_one's root) then beat
// the ring, which needs every rank in every step: with 3 processes on 2 cores the ring measured
// 1.2x-1.35x halving-doubling and reduce_to_one at 16-256 KiB while the model priced it best.
#include <functional>

#include "algorithms/algorithm.h"

namespace pycollective {

// A step's wait for a parked peer when its host is crowded, fitted to two measured sweeps of 2-4
// processes on a 2-vCPU VM (288 cells; docs/benchmarks-log.md, "Ranks that outnumber the cores"):
// with 6-12 us (and the crowding below) the model's pick was over 1.15x the fastest in 22-23
// cells, with 4 us in 28, with 2 us in 44 as with the crowding alone; 48 with neither.
constexpr double kParkedPeerSeconds = 6e-6;

// How many times slower a step runs than on cores of its own: over hosts, the most of the
// step's working ranks (those with active(i)) on one host over that host's cores, at least 1.
double crowding(const Group& g, const std::function<bool(int)>& active);

// The same for a step in which every rank of the group works.
double crowding(const Group& g);

// kParkedPeerSeconds when some host holds more of the group's ranks than its cores, else 0:
// added once per step of the algorithm that waits for another rank.
double parkedPeerWait(const Group& g);

}  // namespace pycollective

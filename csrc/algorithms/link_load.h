#pragma once
// The cost model's view of shared host links. Ranks on one host reach other hosts through one
// network link (its NIC, each direction at 1 / remoteCost.beta bytes per second), so messages
// that leave or enter a host in the same step divide that link. Algorithms price the bandwidth
// of each step with stepBeta instead of one per-rank beta: a flat ring whose ranks are grouped
// by host crosses each host link once per direction, while a ring over interleaved hosts, the
// cross-host phase of `hierarchical` (one ring per local rank) or halving-doubling's first
// exchange puts several messages on one link at once.
#include <functional>

#include "algorithms/algorithm.h"
#include "comm/communicator.h"

namespace pycollective {

// Seconds per byte of a step in which every group rank i sends one message of the same size to
// group rank to(i) (-1: it sends nothing) while receiving from whoever sends to it. The slowest
// message sets the pace: one within a host moves at localCost.beta; one between hosts at
// remoteCost.beta times the number of messages sharing its sender's outgoing or its receiver's
// incoming host link, whichever is more.
// Calls that compress their wire format (args.wire) move fewer bytes over host links (onWire).
double stepBeta(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to);

// Seconds per message of such a step: remoteCost.alpha if any message crosses hosts.
double stepAlpha(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to);

// Seconds for the bytes of a one-way step: group rank i sends `bytes` to to(i), and its
// receivers send nothing meanwhile (halving-doubling's fold). Where every message stays on
// links whose sender and receiver both copy (LinkCost::bothSidesCopy) the two copies run on
// two cores at once, each half of what beta prices (an exchange, where each rank makes both),
// and a receiver that reduces (`reduce`) does so straight out of the link while the sender
// copies in: the slower of the two sets the pace. Measured with 3 processes on 2 cores, the
// fold of 4 MiB (in, reduced, and back) took 722 us where beta + gamma in and beta back priced
// 1467. Elsewhere the bytes cost beta, then gamma if reduced. `crowd` (shared_cores.h) scales
// it all. Latency not included (stepAlpha).
double oneWaySeconds(const Group& g, const CollectiveArgs& args, const std::function<int(int)>& to,
                     double bytes, bool reduce, double crowd);

}  // namespace pycollective

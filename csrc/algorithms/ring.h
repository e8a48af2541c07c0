#pragma once
// Ring and chain schedules, shared by the ring algorithm and by hierarchical (which runs rings
// inside and across hosts).
#include "algorithms/exchange.h"

namespace pycollective {
namespace ring {

// Reduce-scatter over the whole group: afterwards `out` (chunk `rank` of `in`, chunked over the
// group size) holds the reduction of that chunk; `work` (full size) holds partial sums and may
// be the final destination buffer of an allreduce (then out == work + offset(rank)).
void reduceScatter(Exchange& ex, const char* in, char* work, char* out, size_t count);
// Allgather over the group: `buf` (full size) holds this rank's chunk `rank`; afterwards it holds
// every chunk. Chunks come from Chunks(count, size).
void allgather(Exchange& ex, char* buf, size_t count);
// Both, pipelined as one schedule so forwarding never waits for a phase boundary.
void allreduce(Exchange& ex, const char* in, char* out, size_t count);

}  // namespace ring
}  // namespace pycollective

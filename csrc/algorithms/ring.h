#pragma once
// Ring and chain schedules, shared by the ring algorithm and by hierarchical (which runs rings
// inside and across hosts).
#include <functional>
#include <vector>

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

// apply(reduced, offset, n): elements [offset, offset + n) of the reduction, at `reduced`.
using ChunkFn = std::function<void(const char* reduced, size_t offset, size_t n)>;
// One tensor of reduceApplyAllgather: `in` (count elements) is reduced; `apply` turns each
// segment of this rank's chunk of the sum (handed over in a segment-sized scratch buffer, valid
// during the call) into chunk `rank` of every buffer in `gather` (full size, count elements
// each; every tensor of a call gathers as many buffers); `work` (full size) holds partial sums
// (unused, may be null, with two ranks). It may be gather[0], as an allreduce's output holds
// its own partial sums: the partial sums land only in other ranks' chunks, which the
// allgather overwrites, never in chunk `rank`, which `apply` reads and writes.
struct ApplyBuffers {
  const char* in;
  char* work;
  std::vector<char*> gather;
  size_t count;
  const ChunkFn* apply;
};
// An allreduce whose result is consumed where it is made (ZeRO's reduce-scatter, update,
// allgather, as one pipelined schedule): the reduce-scatter delivers this rank's chunk of each
// tensor's reduction segment by segment, `apply` updates it, then every gathered buffer is
// allgathered, so all ranks end with every chunk of every buffer. All tensors run as ONE ring
// (each chunked on its own, Chunks(count, size)), keeping the pipeline full across them. One
// rank: apply(in) for each. The sums pass through the call's scratch slot 1 (Exchange::scratch),
// which the caller must leave alone.
void reduceApplyAllgather(Exchange& ex, const std::vector<ApplyBuffers>& tensors);

}  // namespace ring
}  // namespace pycollective

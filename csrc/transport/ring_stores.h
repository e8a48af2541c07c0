#pragma once
// How a shared-memory link's sender writes pieces into its ring: ordinary stores, which leave
// the lines dirty in the sender's cache for the receiver to fetch from there, or streaming
// (non-temporal) stores, which send them to memory (core/host_copy.h, hostCopyStreaming).
//
// Which is faster depends on where the two cores sit, and that can change while a job runs. On
// the 2-vCPU EPYC VM the hypervisor moves the vCPUs between places where a cache line passes
// between them in about 50 ns and places where it takes 330-350 ns (docs/benchmarks.md, "Two
// vCPUs that drift apart"). Two ranks, 64 MiB ring all-reduce: near, ordinary stores 10.0 ms,
// streaming 14.0-14.3; far, ordinary 26-33 ms, streaming 9.0-9.6. At 1 MiB, near 0.064 against
// 0.130 ms; far 0.47 against 0.092. Ranks on different chiplets or sockets of a large server
// would sit far apart for the whole run (not measured here).
//
// The sender tells them apart by its own copy into the ring. Far, its ordinary stores wait for
// the lines the receiver last read to be taken back from the distant cache: streaming copied
// 2.3-11x faster (2 ranks, 256 KiB-64 MiB, a run per size). Near, streaming copied 0.7-0.95x as
// fast, and its cost falls on the receiver too, which then reads from memory instead of the
// shared cache. So the sender keeps a moving average of its copy rate with each kind of store,
// writes one piece in kExplorePeriod the other way to keep the other average fresh, and streams
// while streaming copies more than kStreamWhenSlower times faster.
#include <cstddef>
#include <cstdint>

namespace pycollective {

class RingStoreChoice {
 public:
  // Pieces shorter than this are written with ordinary stores and not timed: a small message
  // is read while it is still in cache, and its copy is too short to time.
  static constexpr size_t kMinTimedBytes = size_t(64) << 10;
  // Between the ratios measured near (at most 0.95) and far (at least 2.3).
  static constexpr double kStreamWhenSlower = 1.5;
  // One timed piece in this many is written the other way.
  static constexpr uint64_t kExplorePeriod = 32;

  // Whether to stream the next piece of `bytes`.
  bool streamNext(size_t bytes);
  // The piece just written: how, how long, and how many bytes.
  void record(bool streamed, size_t bytes, double seconds);

  bool streaming() const { return streaming_; }
  // Bytes per second of each kind, 0 until measured ([0] ordinary, [1] streaming).
  double rate(bool streamed) const { return rate_[streamed ? 1 : 0]; }

 private:
  double rate_[2] = {0, 0};
  uint64_t timed_ = 0;  // timed pieces so far
  bool streaming_ = false;
};

}  // namespace pycollective

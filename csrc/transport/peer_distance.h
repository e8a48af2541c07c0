#pragma once
// How far a shared-memory link's peer runs from this process, in the time a cache line the peer
// just wrote takes to arrive here, and whether that is far enough that the sender should write
// its ring pieces with streaming stores (core/stream_copy.h) instead of ordinary ones.
//
// Ordinary stores leave the lines dirty in the sender's cache, where the receiver fetches them;
// the next lap of the ring then takes them back. Between two cores that share a cache that is
// the fastest way there is. Between cores that do not (other chiplets or sockets of a large
// server; on the 2-vCPU EPYC VM, where the hypervisor places the two vCPUs now close, now far:
// docs/benchmarks-log.md, "Two vCPUs that drift apart"), every such line crosses the machine twice,
// and streaming stores, which send the lines to memory for the receiver to read from there, are
// several times faster. Two ranks, ring all-reduce, 1 MiB: near 0.064 ms with ordinary stores
// against 0.130 streaming; far 0.47 against 0.092. 64 MiB: near 10.0 against 14.0-14.3; far
// 26-33 against 9.0-9.6.
//
// The distance is measured on loads the link makes anyway: the counter of the peer's progress
// (the ring's head or tail), re-read while waiting for it. A load that brings a new value had to
// fetch the line from the peer's cache, so its time is the distance. The median of a window of
// such loads is kept: an interrupt lengthens a load, and a moment when the scheduler runs both
// processes on one core shortens it. The copy rates themselves do not tell the cases apart: with
// 4 ranks on 2 cores the sender's streaming copy ran 1.5-2x faster than its ordinary one with
// the vCPUs close, where streaming made the all-reduce 1.2x slower (the receiver then reads from
// memory instead of the shared cache).
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pycollective {

class PeerDistance {
 public:
  // Farther than this, a line from the peer's cache costs about as much as one from memory:
  // stream. Medians measured on the 2-vCPU VM: 20-50 ns near, 130-150 far.
  static constexpr double kFarNanoseconds = 80;
  // Pieces shorter than this are written with ordinary stores wherever the peer is: a short
  // message is read while still in cache. (Far, 2 ranks: 64 KiB all-reduces, pieces of 32 KiB,
  // ran 10-16 us streamed against 32-34 us not.)
  static constexpr size_t kMinStreamedBytes = size_t(16) << 10;
  // Loads are timed only while messages of at least this size pass: the fences of the timing
  // cost tens of nanoseconds a load (timed from 16 KiB up, a 2-rank all-reduce of 64 KiB ran
  // 1.10x-1.17x slower). Shorter messages are streamed or not by what the longer ones measured.
  static constexpr size_t kMinTimedBytes = size_t(64) << 10;
  // The distance is the median of the last this many timed loads: few enough to decide within
  // the first calls (2 ranks far apart, 1 MiB: 0.094-0.104 ms a call over 40 calls of a fresh
  // job, against 0.48 with ordinary stores), and robust to a few odd loads.
  static constexpr int kWindow = 8;

  // Calibrates the time-stamp counter (2 ms, once per process) when the first link is made,
  // not in the middle of its first long message. `deciding` is which of a full window's
  // samples, counted from the fastest, is the distance: the median for a link; a later one
  // where the peers may run on this very core now and then (more ranks than cores), whose
  // loads then find the line at hand and say nothing of the distance between cores.
  explicit PeerDistance(int deciding = kWindow / 2);

  // counter.load(acquire); when it differs from `seen` (the peer wrote it since this process
  // last read it), the load is timed and counts towards the distance.
  uint64_t load(const std::atomic<uint64_t>& counter, uint64_t seen);

  // The deciding sample of the last window of timed loads (the median for a link), in
  // nanoseconds. Until its first window is full, the last window any link (or host segment:
  // transport/host_segment.h) of this process completed: a link whose messages
  // are all under kMinTimedBytes never times a load, and on a host whose cores are alike its
  // peer is as far as the others' (3 ranks far apart, 128 KiB: `reduce_to_one`, whose 128 KiB
  // messages had measured the distance, ran 45 us, the ring, whose 43 KiB messages had not,
  // 89 us with ordinary stores). 0 before any window.
  double nanoseconds() const {
    return decided_ > 0 ? decided_ : lastOfProcess_.load(std::memory_order_relaxed);
  }
  // Whether the peer is far enough that what it reads should bypass the cache.
  bool far() const { return nanoseconds() > kFarNanoseconds; }
  // Whether a ring piece of `bytes` should be written with streaming stores.
  bool stream(size_t bytes) const { return bytes >= kMinStreamedBytes && far(); }

  // Counts a timed load directly (for the test).
  void addSample(double ns);

 private:
  double window_[kWindow] = {};
  int deciding_;
  int filled_ = 0;
  double decided_ = 0;
  static std::atomic<double> lastOfProcess_;  // links may progress on different threads
};

}  // namespace pycollective

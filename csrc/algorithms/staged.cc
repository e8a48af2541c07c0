// Staged: large collectives of the ranks of one host through their host segment
// (transport/host_segment.h), piece by piece: allreduce, reduce-scatter and allgather.
//
// Allreduce: each segment call carries, in every rank's slot, its next piece of input and its
// share of the previous piece reduced: every rank reduces its share of a piece from all ranks'
// slots into its next slot, and copies every rank's reduced share of the piece before into its
// output. One segment call per piece, plus one. Two ranks whose processes may read each other's
// memory (HostSegment::membersReadEachOther) skip the slots from 256 KiB to 16 MiB a rank
// (allreduceByReads): each reads the other's part of its share into the cache and reduces it
// with its own into its output, then reads the other's share from the other's output; three
// segment calls, each byte of input and of result copied once.
//
// Through the shm rings halving-doubling copies every byte it sends into a ring and out of it
// again at each step; here each byte of input is copied into the segment once (a rank's own
// share of its piece not even that: nobody else reads it) and each result byte out of it once.
// With 4 ranks on 2 cores that ran 1.4x-1.9x faster from 16 KiB to 256 MiB, with 2 ranks
// 1.1x-1.6x from 64 KiB, 1.2x slower at 16-32 KiB (docs/benchmarks-log.md, "Staged through the host
// segment" and the thirty-third session's point 2).
//
// Reduce-scatter: piece k is the k-th part of every rank's share of the input; each rank copies
// the others' parts into its slot and reduces its own share's part from every slot (its own from
// its input) straight into its output. Allgather: piece k is the k-th part of every rank's
// input, copied into its slot and from every slot into every output. One segment call a piece.
// Two ranks whose processes may read each other's memory (HostSegment::membersReadEachOther)
// skip the slots: a reduce-scatter from 256 KiB a rank reads the other's part of its share into
// the cache and reduces it (reduceScatterByReads), an allgather of parts of 16 KiB-16 MiB reads
// the other's input straight into its output (allgatherByReads); one copy a byte, two segment
// calls.
// hierarchical runs its phases inside each host with these two, in place (registry.h).
//
// Slots are reused as the segment's calls allow (a member writes a slot again two calls later,
// after every member has published the call between, which each does only after it is done
// with the slots it read): the reads of call k end before this rank publishes call k + 1.
// Shares are reduced in rank order, so every rank's output is the same to the bit.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/cache_model.h"
#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"
#include "transport/cross_memory.h"
#include "transport/host_segment.h"

namespace pycollective {
namespace staged {

namespace {

// Which calls read the other rank's buffers (allgatherByReads, reduceScatterByReads,
// allreduceByReads) where the members may: calls of 2 ranks with this many bytes a rank, each
// window measured against the pieces through the segment (docs/benchmarks-log.md, "Allgather by
// reads" and "Allreduce by reads"). Past 16 MiB the pieces' allgather and allreduce win or tie:
// they write the output past the cache (streaming stores) where the kernel's copy reads each
// line of it before writing it; a reduce-scatter reads into the cache and writes half as much.
// With 4 ranks every input is read by three ranks, each from memory past the cache, where the
// segment takes it from memory once (allgather, 4 x 64 MiB: 22.1 ms against 13.8).
struct ReadWindow {
  size_t minBytes, maxBytes;
};
// A rank's part of the output: 4 KiB lost (2.5-2.7 us against 2.2), 8 KiB tied, 16 KiB-16 MiB
// won 1.15x-1.9x, 32 MiB lost 1.14x-1.16x.
constexpr ReadWindow kAllgatherReads{size_t(16) << 10, size_t(16) << 20};
// A rank's input: 64 KiB lost 1.25x (14.0 us against 11.2), 128 KiB 1.1x; 256 KiB-16 MiB won
// 1.13x-1.5x; 32 MiB tied, 64-128 MiB lost 1.03x-1.07x. Some runs had stalled the reads by
// tens of microseconds a call (2 x 256 KiB 73-83 us against the pieces' 35-45), and the window
// started at 2 MiB for a while: the two ranks were sharing one of two cores, which each of the
// reads' three synchronisations pays for (both pinned to one core: 65 us against the pieces'
// 43-48). Bound a core each (pycollective/affinity.py), 2 x 256 KiB ran 27.7-33.1 us against
// the pieces' 34.3-40.4 in eight launches each, 2 x 1 MiB 131-175 against 159-191
// (docs/benchmarks-log.md, "Two ranks on two cores").
constexpr ReadWindow kAllreduceReads{size_t(256) << 10, size_t(16) << 20};
// A rank's input: 16-64 KiB tied or lost (some runs stalled those reads too: 20-24 us against
// 3-7); 256 KiB-256 MiB won 1.1x-1.4x (bound: 256 KiB 10.9-11.9 us against 15.2-16.6, 1 MiB
// 53-57 against 73-75, six launches each).
constexpr ReadWindow kReduceScatterReads{size_t(256) << 10, SIZE_MAX};

bool readsPeers(const HostSegment& seg, int ranks, size_t bytes, const ReadWindow& window) {
  return ranks == 2 && bytes >= window.minBytes && bytes <= window.maxBytes &&
         seg.membersReadEachOther();
}

// Copies `bytes` at `theirs` in member `from`'s process into `local` (transport/cross_memory.h).
void readFrom(Exchange& ex, const HostSegment& seg, int from, const void* theirs, void* local,
              size_t bytes) {
  const int err = cross_memory::read(seg.pidOf(from), theirs, local, bytes);
  if (err != 0)
    throw RemoteError(makeMessage(ex.group().comm().who(), " ",
                                  collectiveName(static_cast<CollectiveKind>(ex.callHeader().kind)),
                                  ": reading rank ", seg.ranks()[from], "'s buffer (pid ",
                                  seg.pidOf(from), ") failed: ", std::strerror(err),
                                  "; it exited or crashed, or the kernel stopped allowing it "
                                  "(PYCOLLECTIVE_CROSS_MEMORY=0 copies through the segment)"));
}

// What another rank reads from this one within the call -- its slot's piece and reduced
// share, the others' parts of a reduce-scatter, the output the reads' allreduce has the other
// read -- goes past the cache (streaming stores) while the members' cores are far apart
// (HostSegment::streams: other chiplets; the EPYC VM's two vCPUs now and then). Through the
// cache, each of those lines is then fetched from the writer's cache one by one across the
// chip: 2 ranks x 64 MiB ran 31-35 ms in such launches against 9.3-10 ms near, while
// halving-doubling, whose rings stream when far, held 11-12.5 ms (docs/benchmarks-log.md, "Staged
// when the cores are far apart"). Near, the cache is faster (docs/benchmarks-log.md, "Staged
// through the host segment": streaming the pieces or the reduced shares ran 1.2x-1.4x slower).
void put(Exchange& ex, bool stream, void* dst, const void* src, size_t bytes) {
  if (stream)
    ex.store(dst, src, bytes);
  else
    ex.copy(dst, src, bytes);
}

// Far apart, a reduction that another rank reads is done this many bytes at a time into
// scratch, in cache, and stored past the cache from there.
constexpr size_t kStreamedReduceBytes = size_t(64) << 10;

// slots::reduceInRankOrder into `dst`, which another rank reads within the call (put).
void reduceForOthers(Exchange& ex, bool stream, const std::vector<const char*>& operands,
                     size_t offset, size_t bytes, char* dst) {
  if (!stream) {
    slots::reduceInRankOrder(ex, operands, offset, bytes, dst);
    return;
  }
  char* chunk = static_cast<char*>(ex.scratch(0, std::min(kStreamedReduceBytes, bytes)));
  for (size_t done = 0; done < bytes; done += kStreamedReduceBytes) {
    const size_t n = std::min(kStreamedReduceBytes, bytes - done);
    slots::reduceInRankOrder(ex, operands, offset + done, n, chunk);
    ex.store(dst + done, chunk, n);
  }
}

// One segment call carrying nothing: returns once every member made it. After a read it holds
// each buffer in place until its readers are done with it.
void waitForEveryMember(Exchange& ex, HostSegment& seg) {
  HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
  call.publish(0);
  for (int m = 0; m < ex.size(); ++m)
    if (m != ex.rank()) call.await(m, 0);
}

// Allgather by reads, where the members read each other's memory: each rank publishes where its
// input lies, copies its own part, and reads every other rank's input straight into its output
// (transport/cross_memory.h), one copy a byte where the pieces take two; a second call keeps
// every input in place until the last reader is done with it. Two segment calls whatever the
// size.
void allgatherByReads(Exchange& ex, HostSegment& seg, const char* mine, char* out,
                      const Chunks& shares) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = ex.elemSize();
  char* const own = out + shares.offset(r) * es;
  {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    *static_cast<uint64_t*>(call.payload()) = reinterpret_cast<uintptr_t>(mine);
    call.publish(sizeof(uint64_t));
    if (mine != own) ex.copy(own, mine, shares.size(r) * es);
    for (int m = 1; m < n; ++m) {
      const int from = (r + m) % n;  // each rank starts with a different peer's input
      const void* theirs = reinterpret_cast<const void*>(
          *static_cast<const uint64_t*>(call.await(from, sizeof(uint64_t))));
      readFrom(ex, seg, from, theirs, out + shares.offset(from) * es, shares.size(from) * es);
    }
  }
  waitForEveryMember(ex, seg);
}

// The peer's part of this rank's share is read this many bytes at a time into scratch, where
// the reduction finds it in cache.
constexpr size_t kReadChunkBytes = size_t(256) << 10;

// This rank's share of 2 ranks' inputs (`bytes` from `at`) reduced into `dst`, in rank order:
// its own part from `in`, the other's read a chunk at a time from `peerIn` into scratch. With
// `stream` (the other reads `dst` next: put) each chunk is reduced in scratch and stored past
// the cache.
void reduceShareByReads(Exchange& ex, const HostSegment& seg, const char* in, const char* peerIn,
                        size_t at, size_t bytes, char* dst, bool stream) {
  const int r = ex.rank();
  char* chunk = static_cast<char*>(ex.scratch(0, std::min(kReadChunkBytes, bytes)));
  for (size_t done = 0; done < bytes; done += kReadChunkBytes) {
    const size_t n = std::min(kReadChunkBytes, bytes - done);
    readFrom(ex, seg, 1 - r, peerIn + at + done, chunk, n);
    const char* own = in + at + done;
    ex.reduceLocal(stream ? chunk : dst + done, r == 0 ? own : chunk, r == 0 ? chunk : own, n);
    if (stream) ex.store(dst + done, chunk, n);
  }
}

// Reduce-scatter by reads, 2 ranks: each publishes where its input lies and reduces its share
// from its own part and the other's, read into the cache (reduceShareByReads); a second call
// keeps each input in place until its reader is done. In place (`share` within `in`) the
// result goes over this rank's own part, which the other never reads.
void reduceScatterByReads(Exchange& ex, HostSegment& seg, const char* in, char* share,
                          size_t count) {
  const int r = ex.rank(), peer = 1 - r;
  const size_t es = ex.elemSize();
  const Chunks shares(count, 2);
  {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    *static_cast<uint64_t*>(call.payload()) = reinterpret_cast<uintptr_t>(in);
    call.publish(sizeof(uint64_t));
    const char* peerIn = reinterpret_cast<const char*>(
        *static_cast<const uint64_t*>(call.await(peer, sizeof(uint64_t))));
    reduceShareByReads(ex, seg, in, peerIn, shares.offset(r) * es, shares.size(r) * es, share,
                       /*stream=*/false);
  }
  waitForEveryMember(ex, seg);
}

// Allreduce by reads, 2 ranks: each publishes where its input and output lie, reads the other's
// part of its own share of the input a chunk at a time and reduces it with its own part into its
// output (in rank order), then, once the other's share is reduced too, reads that share straight
// from the other's output into its own; a third call keeps each output in place until its reader
// is done. In place (out == in) nothing is overwritten before its reader is done with it: a
// rank writes its share over its own part of its input, which the other never reads, and the
// other's share over the part the other read before it published the second call.
void allreduceByReads(Exchange& ex, HostSegment& seg, const CollectiveArgs& a) {
  const int r = ex.rank(), peer = 1 - r;
  const size_t es = ex.elemSize();
  const Chunks shares(a.count, 2);
  const size_t mineAt = shares.offset(r) * es, mineBytes = shares.size(r) * es;
  const size_t theirsAt = shares.offset(peer) * es;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  const char *peerIn = nullptr, *peerOut = nullptr;
  {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    auto* where = static_cast<uint64_t*>(call.payload());
    where[0] = reinterpret_cast<uintptr_t>(in);
    where[1] = reinterpret_cast<uintptr_t>(out);
    call.publish(2 * sizeof(uint64_t));
    const auto* theirs = static_cast<const uint64_t*>(call.await(peer, 2 * sizeof(uint64_t)));
    peerIn = reinterpret_cast<const char*>(theirs[0]);
    peerOut = reinterpret_cast<const char*>(theirs[1]);
  }
  reduceShareByReads(ex, seg, in, peerIn, mineAt, mineBytes, out + mineAt, seg.streams(mineBytes));
  waitForEveryMember(ex, seg);  // the other's share is reduced too
  readFrom(ex, seg, peer, peerOut + theirsAt, out + theirsAt, shares.size(peer) * es);
  waitForEveryMember(ex, seg);
}

// Where things lie in a slot of `slotBytes`: a reduced share of the previous piece first (room
// for the largest share, padded to a cache line), then this piece.
struct PieceLayout {
  size_t count = 0;    // elements of a whole piece
  size_t pieceAt = 0;  // byte offset of the piece in the slot
  bool fits = false;   // whether a piece of n elements and its share fit at all

  PieceLayout(size_t slotBytes, int n, size_t es) {
    count = std::max<size_t>(slotBytes / es * n / (n + 1), n);
    for (;;) {
      pieceAt = ((count + n - 1) / n * es + 63) / 64 * 64;
      fits = pieceAt + count * es <= slotBytes;
      if (fits || count <= static_cast<size_t>(n)) break;
      count -= n;
    }
  }
  size_t pieces(size_t total) const { return (total + count - 1) / count; }
  // Elements of piece k of a call of `total`.
  size_t countOf(size_t k, size_t total) const { return std::min(count, total - k * count); }
};

// Reduce-scatter's and allgather's slots: `parts` parts of `count` elements each, every part on
// its own cache lines.
struct PartLayout {
  size_t stride = 0;  // bytes from one part to the next
  size_t count = 0;   // elements of a whole part

  PartLayout(size_t slotBytes, int parts, size_t es)
      : stride(slotBytes / parts / 64 * 64), count(stride / es) {}
  // Segment calls for `total` elements a part; one at least, so that every rank checks every
  // other's call even when there is nothing to move.
  size_t pieces(size_t total) const {
    return count == 0 ? 0 : std::max<size_t>(1, (total + count - 1) / count);
  }
  // Elements of part k of `total`.
  size_t countOf(size_t k, size_t total) const {
    return k * count >= total ? 0 : std::min(count, total - k * count);
  }
};

void allreduce(Exchange& ex, HostSegment& seg, const CollectiveArgs& a) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = ex.elemSize();
  if (readsPeers(seg, n, a.count * es, kAllreduceReads)) return allreduceByReads(ex, seg, a);
  const PieceLayout layout(seg.slotBytes(), n, es);
  const size_t pieces = layout.pieces(a.count);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  // A call whose buffers leave the cache writes its output with streaming stores, which skip
  // reading each line before writing it: 2 ranks x 64 MiB 14.6-15.2 ms against 18.9, 4 ranks
  // x 16 MiB 8.5-8.6 against 10.3-10.6; in cache they cost (4 x 4 MiB 1.92-1.96 ms against
  // 1.80-1.87; docs/benchmarks-log.md, "Staged through the host segment").
  const bool pastCache = !callStaysInCache(ex.group().comm(), n, static_cast<double>(a.count * es));
  std::vector<const char*> before(n), now(n);  // every rank's slot of the last call, this one
  std::vector<const char*> operands(n);
  for (size_t k = 0; k <= pieces; ++k) {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    char* mine = static_cast<char*>(call.payload());
    const bool stream = seg.streams(layout.count * es / n);  // the others read this slot (put)
    // Piece k - 1: reduced in this call, copied out after its wait.
    const size_t prevFirst = k > 0 ? (k - 1) * layout.count : 0;
    const Chunks prevShares(k > 0 ? layout.countOf(k - 1, a.count) : 0, n);
    if (k > 0) {
      // This rank's share of it, from every rank's slot of the last call; its own part of it
      // never went to its slot.
      for (int m = 0; m < n; ++m)
        operands[m] = m == r ? in + prevFirst * es : before[m] + layout.pieceAt;
      reduceForOthers(ex, stream, operands, prevShares.offset(r) * es, prevShares.size(r) * es,
                      mine);
    }
    size_t published = layout.pieceAt;
    if (k < pieces) {
      const size_t first = k * layout.count, count = layout.countOf(k, a.count);
      const Chunks shares(count, n);
      const size_t skip = shares.offset(r) * es, skipEnd = skip + shares.size(r) * es;
      // Through the cache while the cores are near: the others read their shares of it
      // within this call, and past the cache it measured 1.1x-1.3x slower there with 2 and 4
      // ranks at 256 KiB-64 MiB (docs/benchmarks-log.md, "Staged through the host segment").
      const char* piece = in + first * es;
      char* slot = mine + layout.pieceAt;
      put(ex, stream, slot, piece, skip);
      put(ex, stream, slot + skipEnd, piece + skipEnd, count * es - skipEnd);
      published += count * es;
    }
    call.publish(published);
    for (int m = 0; m < n; ++m)
      now[m] = m == r ? mine : static_cast<const char*>(call.await(m, published));
    if (k > 0) {
      for (int m = 0; m < n; ++m) {
        char* to = out + (prevFirst + prevShares.offset(m)) * es;
        if (pastCache)
          ex.store(to, now[m], prevShares.size(m) * es);
        else
          ex.copy(to, now[m], prevShares.size(m) * es);
      }
    }
    before.swap(now);
  }
}

}  // namespace

void reduceScatter(Exchange& ex, HostSegment& seg, const char* in, char* share, size_t count) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = ex.elemSize();
  if (readsPeers(seg, n, count * es, kReduceScatterReads))
    return reduceScatterByReads(ex, seg, in, share, count);
  const PartLayout layout(seg.slotBytes(), n, es);
  const Chunks shares(count, n);
  const size_t pieces = layout.pieces(shares.size(0)), published = n * layout.stride;
  std::vector<const char*> operands(n);
  for (size_t k = 0; k < pieces; ++k) {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    char* mine = static_cast<char*>(call.payload());
    const size_t first = k * layout.count;
    // As allreduce's pieces (put): the others read their parts within this call.
    const bool stream = seg.streams(layout.stride);
    for (int m = 0; m < n; ++m)
      if (m != r)
        put(ex, stream, mine + m * layout.stride, in + (shares.offset(m) + first) * es,
            layout.countOf(k, shares.size(m)) * es);
    call.publish(published);
    for (int m = 0; m < n; ++m)
      operands[m] = m == r ? in + (shares.offset(r) + first) * es
                           : static_cast<const char*>(call.await(m, published)) + r * layout.stride;
    // In place (`share` is this rank's share of `in`: hierarchical's phase) the reduction
    // would write its first two operands' sum over its own operand before reading it, when
    // that is third or later: it then sums in this rank's own part of its slot, which nobody
    // reads, and copies the result over.
    const size_t bytes = layout.countOf(k, shares.size(r)) * es;
    char* result = share + first * es;
    const bool overwritesOwn = r >= 2 && result == operands[r];
    char* acc = overwritesOwn ? mine + r * layout.stride : result;
    slots::reduceInRankOrder(ex, operands, 0, bytes, acc);
    if (overwritesOwn) ex.copy(result, acc, bytes);
  }
}

void allgather(Exchange& ex, HostSegment& seg, const char* mine, char* out, const Chunks& shares) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = ex.elemSize();
  if (readsPeers(seg, n, shares.size(0) * es, kAllgatherReads))
    return allgatherByReads(ex, seg, mine, out, shares);
  const PartLayout layout(seg.slotBytes(), 1, es);
  const size_t pieces = layout.pieces(shares.size(0));
  char* const own = out + shares.offset(r) * es;
  // The output is n shares: past the cache it is written with streaming stores, as allreduce's.
  const bool pastCache = !callStaysInCache(
      ex.group().comm(), n, (n + 1) / 2.0 * static_cast<double>(shares.size(0) * es));
  auto place = [&](char* to, const char* from, size_t bytes) {
    if (pastCache)
      ex.store(to, from, bytes);
    else
      ex.copy(to, from, bytes);
  };
  for (size_t k = 0; k < pieces; ++k) {
    HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
    const size_t at = k * layout.count * es;
    auto bytesOf = [&](int m) { return layout.countOf(k, shares.size(m)) * es; };
    call.write(mine + at, bytesOf(r));  // the others read it within this call (put)
    call.publish(bytesOf(r));
    // This rank's own part goes straight from its input, while the others write theirs.
    if (mine != own) place(own + at, mine + at, bytesOf(r));
    for (int m = 0; m < n; ++m)
      if (m != r)
        place(out + shares.offset(m) * es + at, static_cast<const char*>(call.await(m, bytesOf(m))),
              bytesOf(m));
  }
}

HostSegment* segmentFor(const Group& g, const CollectiveArgs& a) {
  if (!slots::whyNotOnSegment(g, a).empty()) return nullptr;
  HostSegment* seg = slots::segmentServing(g);
  // A reduce-scatter's slot holds a part for every rank (an allgather's one part fits then).
  return PartLayout(seg->slotBytes(), g.size(), elementSize(a.dtype)).count > 0 ? seg : nullptr;
}

namespace {

class Staged : public Algorithm {
 public:
  const char* name() const override { return "staged"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    const std::string why = slots::whyNotOnSegment(g, a);
    if (!why.empty()) return why;
    const HostSegment* seg = slots::segmentServing(g);
    const size_t es = elementSize(a.dtype);
    bool fits = false;
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        fits = PieceLayout(seg->slotBytes(), g.size(), es).fits;
        break;
      case CollectiveKind::kReduceScatter:
        fits = PartLayout(seg->slotBytes(), g.size(), es).count > 0;
        break;
      case CollectiveKind::kAllgather: fits = PartLayout(seg->slotBytes(), 1, es).count > 0; break;
      default: return "it runs allreduce, reduce_scatter and allgather only";
    }
    if (!fits)
      return makeMessage("the host segment's slots of ", seg->slotBytes(),
                         " bytes hold no piece for ", g.size(),
                         " ranks (PYCOLLECTIVE_HOST_PIECE_BYTES)");
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const LinkCost c = costOf(g, a);
    const double n = g.size();
    const size_t es = elementSize(a.dtype);
    const double S = a.count * es;
    const HostSegment* seg = slots::segmentServing(g);
    // beta prices a byte exchanged over a link: copied into a ring by one rank and out of it by
    // the other (LinkCost::bothSidesCopy). Each segment call is priced as a message: unlike
    // slots' single call it stands between passes over a piece that cannot start before it,
    // where the links' algorithms overlap their steps in pieces. Every rank works in every
    // call, at the share of the cores the host gives it.
    double calls = 2, copied = 0, reduced = 0, copyBeta = 0;
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        copyBeta = c.beta / 2;
        if (seg != nullptr && readsPeers(*seg, g.size(), S, kAllreduceReads)) {
          // Three synchronisations, each slots' one; the other's part of this rank's share
          // read and reduced, the other's share read into the output.
          calls = 1.5;
          copied = S;
          reduced = S / 2;
          break;
        }
        if (seg != nullptr) calls = PieceLayout(seg->slotBytes(), g.size(), es).pieces(a.count) + 1;
        // A rank copies (n - 1) / n of its input into its slot, pulls as much from the others'
        // slots into its reduction (as a ring's receiver does from the ring), and copies its
        // whole output out: with 2 ranks the bytes halving-doubling moves, with 4 ranks 1.25 S
        // against its 1.5 S, at half a beta a copy, the ring's share. So priced, 2 ranks tie
        // halving-doubling in cache (measured 1.2x of it at 16-32 KiB, 0.87x-0.92x at 64 KiB-1
        // MiB) and are cheaper past it (0.66x-0.74x at 16-256 MiB); 4 ranks 0.87x of it
        // (measured 0.55x-0.70x; docs/benchmarks-log.md, "Staged through the host segment").
        copied = (2 * (n - 1) / n + 1) * S;
        reduced = (n - 1) / n * S;
        break;
      case CollectiveKind::kReduceScatter:
        copyBeta = c.beta / 4;
        if (seg != nullptr && readsPeers(*seg, g.size(), S, kReduceScatterReads)) {
          // Two synchronisations, each slots' one; the other's part of this rank's share read.
          calls = 1;
          copied = S / 2;
          reduced = S / 2;
          break;
        }
        if (seg != nullptr)
          calls =
              PartLayout(seg->slotBytes(), g.size(), es).pieces(Chunks(a.count, g.size()).size(0));
        copied = 2 * (n - 1) / n * S;  // the others' shares in, and out into the reduction
        reduced = (n - 1) / n * S;
        break;
      case CollectiveKind::kAllgather:
        copyBeta = c.beta / 4;
        if (seg != nullptr && readsPeers(*seg, g.size(), a.count * es, kAllgatherReads)) {
          // Two synchronisations priced as one message: each is slots' one (half an alpha),
          // no pass over a piece between them. As pieces (one call, 1.5 S copied), 2 ranks x
          // 32 KiB priced dearer than a ring's exchange and `auto` ran that, 1.6x slower.
          calls = 1;
          copied = n * S;  // its own input out, the others' read straight into the output
          break;
        }
        if (seg != nullptr) calls = PartLayout(seg->slotBytes(), 1, es).pieces(a.count);
        copied = (n + 1) * S;  // the input in, n inputs out
        break;
      default: return 1e30;
    }
    // Reduce-scatter's and allgather's copies are priced at a quarter of a beta: measured, one
    // took 0.24-0.4 of a beta (2 and 4 ranks, 4-64 MiB), and they ran 1.1x-2.4x faster than the
    // rings from 256 KiB, which the ring's half would price slower (docs/benchmarks-log.md, "Staged
    // reduce-scatter and allgather"). Allreduce keeps the ring's half, whose ties in cache
    // match its measured 1.2x slower at 16-32 KiB with 2 ranks.
    return calls * (c.alpha + parkedPeerWait(g)) +
           crowding(g) * (copied * copyBeta + reduced * c.gamma);
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    HostSegment& seg = *slots::segmentServing(ex.group());
    switch (a.kind) {
      case CollectiveKind::kAllreduce: allreduce(ex, seg, a); return;
      case CollectiveKind::kReduceScatter:
        reduceScatter(ex, seg, static_cast<const char*>(a.in), static_cast<char*>(a.out), a.count);
        return;
      case CollectiveKind::kAllgather:
        allgather(ex, seg, static_cast<const char*>(a.in), static_cast<char*>(a.out),
                  Chunks(ex.size() * a.count, ex.size()));
        return;
      default: PC_ASSERT(false, "staged cannot run ", collectiveName(a.kind));
    }
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const Staged instance;
  return instance;
}

}  // namespace staged
}  // namespace pycollective

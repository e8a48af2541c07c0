// Staged: a large allreduce of the ranks of one host through their host segment
// (transport/host_segment.h), piece by piece. Each segment call carries, in every rank's slot,
// its next piece of input and its share of the previous piece reduced: every rank reduces its
// share of a piece from all ranks' slots into its next slot, and copies every rank's reduced
// share of the piece before into its output. One segment call per piece, plus one.
//
// Through the shm rings halving-doubling copies every byte it sends into a ring and out of it
// again at each step; here each byte of input is copied into the segment once (a rank's own
// share of its piece not even that: nobody else reads it) and each result byte out of it once.
// With 4 ranks on 2 cores that ran 1.4x-1.9x faster from 16 KiB to 256 MiB, with 2 ranks
// 1.1x-1.6x from 64 KiB, 1.2x slower at 16-32 KiB (docs/benchmarks.md, "Staged through the host
// segment" and the thirty-third session's point 2).
//
// Slots are reused as the segment's calls allow (a member writes a slot again two calls later,
// after every member has published the call between, which each does only after it is done
// with the slots it read): the reads of call k end before this rank publishes call k + 1.
// Shares are reduced in rank order, so every rank's output is the same to the bit.
#include <algorithm>
#include <string>
#include <vector>

#include "algorithms/cache_model.h"
#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "transport/host_segment.h"

namespace pycollective {
namespace staged {

namespace {

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

class Staged : public Algorithm {
 public:
  const char* name() const override { return "staged"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    const std::string why = slots::whyNotOnSegment(g, a);
    if (!why.empty()) return why;
    if (a.kind != CollectiveKind::kAllreduce) return "it runs allreduce only";
    const HostSegment* seg = slots::segmentServing(g);
    if (!PieceLayout(seg->slotBytes(), g.size(), elementSize(a.dtype)).fits)
      return makeMessage("the host segment's slots of ", seg->slotBytes(),
                         " bytes hold no piece for ", g.size(),
                         " ranks (PYCOLLECTIVE_HOST_PIECE_BYTES)");
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const LinkCost c = costOf(g, a);
    const double n = g.size();
    const double S = a.count * elementSize(a.dtype);
    const HostSegment* seg = slots::segmentServing(g);
    const double calls =
        seg == nullptr
            ? 2
            : PieceLayout(seg->slotBytes(), g.size(), elementSize(a.dtype)).pieces(a.count) + 1;
    // beta prices a byte exchanged over a link: copied into a ring by one rank and out of it by
    // the other (LinkCost::bothSidesCopy), half a beta a copy. Here a rank copies (n - 1) / n
    // of its input into its slot, pulls as much from the others' slots into its reduction (as
    // a ring's receiver does from the ring), and copies its whole output out: with 2 ranks the
    // bytes halving-doubling moves, with 4 ranks 1.25 S against its 1.5 S. Each segment call
    // is priced as a message: unlike slots' single call it stands between passes over a piece
    // that cannot start before it, where the links' algorithms overlap their steps in pieces.
    // So priced, 2 ranks tie halving-doubling in cache (measured 1.2x of it at 16-32 KiB,
    // 0.87x-0.92x at 64 KiB-1 MiB) and are cheaper past it (0.66x-0.74x at 16-256 MiB); 4
    // ranks 0.87x of it (measured 0.55x-0.70x). Every rank works in every call, at the share of
    // the cores the host gives it (docs/benchmarks.md, "Staged through the host segment").
    const double copies = (2 * (n - 1) / n + 1) * S / 2;
    return calls * (c.alpha + parkedPeerWait(g)) +
           crowding(g) * (copies * c.beta + (n - 1) / n * S * c.gamma);
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    HostSegment& seg = *slots::segmentServing(ex.group());
    const int n = ex.size(), r = ex.rank();
    const size_t es = ex.elemSize();
    const PieceLayout layout(seg.slotBytes(), n, es);
    const size_t pieces = layout.pieces(a.count);
    const char* in = static_cast<const char*>(a.in);
    char* out = static_cast<char*>(a.out);
    // A call whose buffers leave the cache writes its output with streaming stores, which skip
    // reading each line before writing it: 2 ranks x 64 MiB 14.6-15.2 ms against 18.9, 4 ranks
    // x 16 MiB 8.5-8.6 against 10.3-10.6; in cache they cost (4 x 4 MiB 1.92-1.96 ms against
    // 1.80-1.87; docs/benchmarks.md, "Staged through the host segment").
    const bool pastCache =
        !callStaysInCache(ex.group().comm(), n, static_cast<double>(a.count * es));
    std::vector<const char*> before(n), now(n);  // every rank's slot of the last call, this one
    for (size_t k = 0; k <= pieces; ++k) {
      HostSegment::Call call(seg, ex.callHeader(), ex.deadline());
      char* mine = static_cast<char*>(call.payload());
      // Piece k - 1: reduced in this call, copied out after its wait.
      const size_t prevFirst = k > 0 ? (k - 1) * layout.count : 0;
      const Chunks prevShares(k > 0 ? layout.countOf(k - 1, a.count) : 0, n);
      if (k > 0) {
        // This rank's share of it, from every rank's slot of the last call; its own part of it
        // never went to its slot.
        const size_t at = prevShares.offset(r) * es, bytes = prevShares.size(r) * es;
        auto operand = [&](int m) {
          return m == r ? in + prevFirst * es + at : before[m] + layout.pieceAt + at;
        };
        ex.reduceLocal(mine, operand(0), operand(1), bytes);
        for (int m = 2; m < n; ++m) ex.reduceLocal(mine, mine, operand(m), bytes);
      }
      size_t published = layout.pieceAt;
      if (k < pieces) {
        const size_t first = k * layout.count, count = layout.countOf(k, a.count);
        const Chunks shares(count, n);
        const size_t skip = shares.offset(r) * es, skipEnd = skip + shares.size(r) * es;
        // Through the cache, whatever the segment's distance vote says (Call::write streams
        // slots' payloads while the cores are far): the others read their shares of it within
        // this call, and past the cache it measured 1.1x-1.3x slower with 2 and 4 ranks at
        // 256 KiB-64 MiB (docs/benchmarks.md, "Staged through the host segment").
        const char* piece = in + first * es;
        char* slot = mine + layout.pieceAt;
        ex.copy(slot, piece, skip);
        ex.copy(slot + skipEnd, piece + skipEnd, count * es - skipEnd);
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
};

}  // namespace

const Algorithm& algorithm() {
  static const Staged instance;
  return instance;
}

}  // namespace staged
}  // namespace pycollective

// Direct: for peers that share this address space (in-process replicas). Ranks swap buffer
// addresses, then rank r alone reduces chunk r, reading every peer's input once, and writes the
// result straight into every peer's output: a reduce-scatter by direct reads and an allgather by
// direct writes, each byte of input read once and each byte of output written once, which is
// the memory-traffic floor of an allreduce. (NCCL's P2P read and "two-shot" all-reduce follow
// the same idea.) Chunk r of every buffer is touched by rank r only, so in-place is safe; a
// second round of messages keeps every rank in the call until all writes into its output ended.
// An in-process allreduce hands out smaller pieces instead, each to whichever rank claims it
// first (allreduceByClaims()); each piece is still touched by one rank only.
//
// Processes of one host run it too when every rank's buffers are mapped into every rank (a call
// prepared on pycollective.shared_empty arrays, CollectiveArgs::mapped): the addresses are
// known from the preparation, and the first round carries the plan's key instead.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "algorithms/cache_model.h"
#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "core/error.h"

namespace pycollective {
namespace direct {

namespace {

struct Buffers {
  const char* in;
  char* out;
  // In-process allreduce: rank 0's counter of the pieces claimed so far (allreduceByClaims()).
  std::atomic<size_t>* claimed = nullptr;
};

// One round in which every rank sends `mine` to every peer and gets theirs (index = group
// rank; this rank's own entry is `mine`). Each of direct's synchronisations is one such round.
template <typename T>
std::vector<T> swapWithPeers(Exchange& ex, const T& mine) {
  const int n = ex.size(), r = ex.rank();
  std::vector<T> all(n);
  all[r] = mine;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    ex.send(p, &all[r], sizeof(T));
    ex.recv(p, &all[p], sizeof(T));
  }
  ex.waitAll();
  return all;
}

// Every rank's buffers, learned by an all-to-all of addresses (this is also the entry barrier:
// nobody touches a peer's memory before the peer has entered the call).
std::vector<Buffers> swapAddresses(Exchange& ex, const CollectiveArgs& a,
                                   std::atomic<size_t>* claimed) {
  return swapWithPeers(ex,
                       Buffers{static_cast<const char*>(a.in), static_cast<char*>(a.out), claimed});
}

// The entry of a call on mapped buffers: every rank's key must be this plan's. Ranks that
// prepared several calls in different orders paired different plans; their keys differ, and
// they fail here instead of reading and writing unrelated buffers.
std::vector<Buffers> enterMapped(Exchange& ex, const MappedBuffers& m) {
  const int n = ex.size(), r = ex.rank();
  PC_ASSERT(m.in.size() == size_t(n) && m.out.size() == size_t(n), "mapped buffers for ",
            m.in.size(), " ranks in a group of ", n);
  const std::vector<uint64_t> keys = swapWithPeers(ex, m.key);
  std::vector<Buffers> all(n);
  for (int p = 0; p < n; ++p) {
    if (keys[p] != m.key)
      throw ProtocolError(makeMessage(
          "rank ", ex.group().globalRank(r), ": a prepared allreduce on shared arrays met rank ",
          ex.group().globalRank(p), " running another prepared call (the ranks prepared their ",
          "calls in different orders, or ran different plans); prepare and run the same calls "
          "in the same order on every rank"));
    all[p] = {static_cast<const char*>(m.in[p]), static_cast<char*>(m.out[p])};
  }
  return all;
}

// Exit barrier: a rank returns only after every peer finished writing into its output.
void finish(Exchange& ex) {
  swapWithPeers(ex, char{1});
}

// acc = in_0 OP in_1 OP ... OP in_{n-1} over [off, off+len) elements, in rank order.
void reduceAll(Exchange& ex, const std::vector<Buffers>& all, char* acc, size_t off, size_t len) {
  const size_t es = ex.elemSize(), bytes = len * es;
  const size_t at = off * es;
  if (all.size() == 1) {
    ex.copy(acc, all[0].in + at, bytes);
    return;
  }
  ex.reduceLocal(acc, all[0].in + at, all[1].in + at, bytes);
  for (size_t p = 2; p < all.size(); ++p) ex.reduceLocal(acc, acc, all[p].in + at, bytes);
}

// Streaming stores skip reading each output line before overwriting it, which pays only when
// the buffers leave the cache anyway; below that, plain stores leave the outputs in cache for
// whoever reads them next. 2 replicas, side by side: 4 MiB 491-501 us streaming against 272-277
// plain; 64 MiB 8.4-9.5 ms against 10.1-10.2. The fixed line, not the group's measured one: on a
// Xeon VM whose line measures 2 MiB, plain stores still won at 2 x 4 MiB (666-671 us against
// 900-913) and 4 x 4 MiB (1290-1295 against 1749-1782).
bool streamsOutputs(int n, size_t bytes) {
  return !callStaysInCache(kCacheResidentBytes, n, static_cast<double>(bytes));
}

// The reduced [off, off+len) in `acc` written into every rank's output, starting with rank
// `first` (mod n): ranks that start at different outputs spread the stores.
void storeEverywhere(Exchange& ex, const std::vector<Buffers>& all, const char* acc, size_t off,
                     size_t len, size_t first, bool streamOut) {
  const size_t n = all.size(), at = off * ex.elemSize(), bytes = len * ex.elemSize();
  for (size_t k = 0; k < n; ++k) {
    char* dst = all[(first + k) % n].out + at;
    if (streamOut)
      ex.store(dst, acc, bytes);
    else
      ex.copy(dst, acc, bytes);
  }
}

// The smallest piece ranks claim, and how many pieces per rank an allreduce is cut into.
constexpr size_t kMinPieceBytes = 16 << 10;
constexpr size_t kPiecesPerRank = 8;

// An in-process allreduce, cut into pieces that the ranks claim one at a time from rank 0's
// counter: a rank that gets more of the cores does more of the work, where fixed chunks made
// every call wait for the rank the scheduler served least, and a piece (about an eighth of a
// rank's share) keeps the accumulator in cache. Medians of 20-200 calls, three runs each, fixed
// chunks against claimed pieces: 4 replicas x 256 KiB 91-117 us against 87-101, 4 x 2 MiB 327-459
// against 299-367, 8 x 1 MiB 389-499 against 374-403; 2 replicas unchanged. A piece is still
// reduced by one rank alone, reading every input in rank order, so the result is the same
// whoever reduces it, and in-place calls stay safe.
void allreduceByClaims(Exchange& ex, const std::vector<Buffers>& all, char* acc, size_t count,
                       size_t segElems) {
  const size_t es = ex.elemSize(), n = all.size();
  const size_t pieceBytes = std::min(
      segElems * es, std::max(kMinPieceBytes, count * es / (kPiecesPerRank * n)) / 64 * 64);
  const size_t piece = std::max<size_t>(1, pieceBytes / es);
  const bool streamOut = streamsOutputs(static_cast<int>(n), count * es);
  for (size_t k = all[0].claimed->fetch_add(1, std::memory_order_relaxed); k * piece < count;
       k = all[0].claimed->fetch_add(1, std::memory_order_relaxed)) {
    const size_t off = k * piece, len = std::min(piece, count - off);
    reduceAll(ex, all, acc, off, len);
    storeEverywhere(ex, all, acc, off, len, k, streamOut);
  }
}

constexpr const char* kNeedsSharedMemory =
    "it needs peers in this process (in-process replicas), or a call prepared on one host with "
    "every rank's buffers from pycollective.shared_empty";

class Direct : public Algorithm {
 public:
  const char* name() const override { return "direct"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    if (a.mapped != nullptr) return "";  // every peer's buffers are mapped here
    Group& mg = const_cast<Group&>(g);
    for (int p = 0; p < g.size(); ++p) {
      if (p == g.rank()) continue;
      if (!g.comm().hasLink(g.globalRank(p)))
        return kNeedsSharedMemory + std::string("; rank ") + std::to_string(g.globalRank(p)) +
               " has no link here";
      if (!mg.link(p).sharesMemory())
        return kNeedsSharedMemory + std::string("; rank ") + std::to_string(g.globalRank(p)) +
               " is reached over " + mg.link(p).describe();
    }
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const LinkCost c = costOf(g, a);
    const double n = g.size(), S = a.count * elementSize(a.dtype);
    // Two all-to-all rounds of tiny messages, then one read of the inputs and one write of
    // the outputs, spread over the ranks.
    const double sync = 2 * (n - 1) * c.alpha;
    // In cache the accumulator's passes cost as much as the rest: per rank it is written (S/n)
    // and read once per output (S). beta prices a byte moved, one read and one write, hence
    // (1 + 1/n) / 2 of S more per rank. Out of cache those passes hide in L1.
    const double accumulator = callStaysInCache(g.comm(), n, S) ? (1 + 1 / n) / 2 * S * c.beta : 0;
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        return sync + S * c.beta + accumulator + (n - 1) / n * S * c.gamma;
      case CollectiveKind::kReduceScatter: return sync + S / n * c.beta + (n - 1) / n * S * c.gamma;
      case CollectiveKind::kReduce: return sync + S / n * c.beta + (n - 1) / n * S * c.gamma;
      case CollectiveKind::kAllgather: return sync + n * S * c.beta;
      case CollectiveKind::kBroadcast: return sync + S * c.beta;
      default: return 1e30;
    }
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    const int n = ex.size(), r = ex.rank();
    const size_t es = ex.elemSize();
    // Rank 0's stack outlives every claim: it leaves the call only after finish().
    std::atomic<size_t> claimed{0};
    const bool offersClaims =
        r == 0 && a.kind == CollectiveKind::kAllreduce && a.mapped == nullptr && a.device < 0;
    std::vector<Buffers> all = a.mapped ? enterMapped(ex, *a.mapped)
                                        : swapAddresses(ex, a, offersClaims ? &claimed : nullptr);
    Chunks chunks(a.count, n);
    const size_t segElems = std::max<size_t>(1, ex.segmentBytes() / es);
    const size_t mine = chunks.offset(r), mineLen = chunks.size(r);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
      case CollectiveKind::kReduce:
      case CollectiveKind::kReduceScatter: {
        // Accumulate a segment in a cache-sized scratch buffer, then store it everywhere.
        char* acc = static_cast<char*>(ex.scratch(1, segElems * es));
        if (all[0].claimed != nullptr) {
          allreduceByClaims(ex, all, acc, a.count, segElems);
          break;
        }
        const bool streamOut = streamsOutputs(n, a.count * es);
        for (size_t s = 0; s < mineLen; s += segElems) {
          size_t len = std::min(segElems, mineLen - s), off = mine + s;
          reduceAll(ex, all, acc, off, len);
          if (a.kind == CollectiveKind::kReduceScatter) {
            ex.copy(static_cast<char*>(a.out) + s * es, acc, len * es);
          } else if (a.kind == CollectiveKind::kReduce) {
            ex.copy(all[a.root].out + off * es, acc, len * es);
          } else {
            storeEverywhere(ex, all, acc, off, len, r + 1, streamOut);
          }
        }
        break;
      }
      case CollectiveKind::kAllgather: {
        const size_t block = a.count * es;
        for (int p = 0; p < n; ++p)
          if (all[p].out + r * block != all[r].in)
            ex.copy(all[p].out + r * block, all[r].in, block);
        break;
      }
      case CollectiveKind::kBroadcast: {
        const char* src = all[a.root].in + mine * es;
        for (int p = 0; p < n; ++p)
          if (all[p].out + mine * es != src) ex.copy(all[p].out + mine * es, src, mineLen * es);
        break;
      }
      default: PC_ASSERT(false, "direct cannot run ", collectiveName(a.kind));
    }
    finish(ex);
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const Direct instance;
  return instance;
}

}  // namespace direct
}  // namespace pycollective

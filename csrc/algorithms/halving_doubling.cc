// Recursive halving / doubling (Rabenseifner): log2(p) exchanges of halving size reduce-scatter
// the buffer, log2(p) exchanges of doubling size gather it back. Few, large messages: the choice
// for small and medium buffers. A group that is not a power of two first folds: ranks 0..2r-1
// pair up, the even one hands its data to the odd one, which stands in for both and hands the
// result back at the end. Broadcast and reduce use binomial trees, allgather Bruck's
// dissemination (any group size, ceil(log2 n) steps).
#include <cmath>
#include <cstring>
#include <functional>

#include "algorithms/cache_model.h"
#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "algorithms/link_load.h"
#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"

namespace pycollective {
namespace halving_doubling {

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

// The power-of-two core and how real ranks map onto it.
struct Fold {
  explicit Fold(int n) : p(floorPow2(n)), rem(n - floorPow2(n)) {}
  // Core rank of real rank r, or -1 for the even member of a folded pair.
  int vrank(int r) const {
    if (r < 2 * rem) return r % 2 == 1 ? r / 2 : -1;
    return r - rem;
  }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int p, rem;
};

// Recursive halving over the core: on entry `src` holds this rank's full contribution; on exit
// `last` holds block v (blocks = Chunks(count, p)) fully reduced. Intermediate halves are
// reduced into `work` (full size, may equal src).
void halving(Exchange& ex, const Fold& f, int v, const char* src, char* work, char* last,
             size_t count) {
  const size_t es = ex.elemSize();
  Chunks blocks(count, f.p);
  int lo = 0, hi = f.p;
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    int partner = f.real(v ^ mask);
    int mid = lo + (hi - lo) / 2;
    bool keepLow = (v & mask) == 0;
    int keepLo = keepLow ? lo : mid, keepHi = keepLow ? mid : hi;
    int giveLo = keepLow ? mid : lo, giveHi = keepLow ? hi : mid;
    size_t giveOff = blocks.offset(giveLo), giveLen = blocks.offset(giveHi) - giveOff;
    size_t keepOff = blocks.offset(keepLo), keepLen = blocks.offset(keepHi) - keepOff;
    ex.send(partner, src + giveOff * es, giveLen * es);
    char* dst = mask == 1 ? last : work + keepOff * es;
    ex.recvReduce(partner, dst, src + keepOff * es, keepLen * es);
    ex.waitAll();
    src = work;
    lo = keepLo;
    hi = keepHi;
  }
}

// Recursive doubling over the core: on entry `buf` holds block v; on exit every block.
void doubling(Exchange& ex, const Fold& f, int v, char* buf, size_t count) {
  const size_t es = ex.elemSize();
  Chunks blocks(count, f.p);
  int lo = v, hi = v + 1;
  for (int mask = 1; mask < f.p; mask *= 2) {
    int partner = f.real(v ^ mask);
    int width = hi - lo;
    int theirLo = (v & mask) == 0 ? hi : lo - width;
    size_t myOff = blocks.offset(lo), myLen = blocks.offset(hi) - myOff;
    size_t thOff = blocks.offset(theirLo), thLen = blocks.offset(theirLo + width) - thOff;
    ex.send(partner, buf + myOff * es, myLen * es);
    ex.recv(partner, buf + thOff * es, thLen * es);
    ex.waitAll();
    lo = std::min(lo, theirLo);
    hi = lo + 2 * width;
  }
}

// Below this size the whole vector is exchanged log2(p) times (recursive doubling): half the
// messages of halving + doubling, which is what small buffers pay for.
constexpr size_t kWholeVectorBytes = 16 * 1024;

// Recursive doubling of the whole vector: partners swap everything and both reduce. The lower
// rank's data always comes first (a OP b on both sides), so both get the same bits even for
// min/max of -0.0 and +0.0. The partner's data lands in scratch and is reduced only after our
// own send completed: the send may still be reading `out`.
void wholeVectorDoubling(Exchange& ex, const Fold& f, int v, const char* src, char* out,
                         size_t count) {
  const size_t bytes = count * ex.elemSize();
  char* theirs = static_cast<char*>(ex.scratch(0, bytes));
  for (int mask = 1; mask < f.p; mask *= 2) {
    int partnerV = v ^ mask;
    ex.send(f.real(partnerV), src, bytes);
    ex.recv(f.real(partnerV), theirs, bytes);
    ex.waitAll();
    if (v < partnerV)
      ex.reduceLocal(out, src, theirs, bytes);
    else
      ex.reduceLocal(out, theirs, src, bytes);
    src = out;
  }
}

void allreduce(Exchange& ex, const char* in, char* out, size_t count) {
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = count * ex.elemSize();
  if (n == 1) {
    if (out != in) ex.copy(out, in, bytes);
    return;
  }
  Fold f(n);
  int v = f.vrank(r);
  if (v < 0) {  // folded away: hand the data over, get the result back
    ex.send(r + 1, in, bytes);
    ex.recv(r + 1, out, bytes);
    ex.waitAll();
    return;
  }
  const char* src = in;
  if (r < 2 * f.rem) {
    ex.recvReduce(r - 1, out, in, bytes);
    ex.waitAll();
    src = out;
  }
  if (bytes <= kWholeVectorBytes) {
    wholeVectorDoubling(ex, f, v, src, out, count);
  } else {
    Chunks blocks(count, f.p);
    halving(ex, f, v, src, out, out + blocks.offset(v) * ex.elemSize(), count);
    doubling(ex, f, v, out, count);
  }
  if (r < 2 * f.rem) {
    ex.send(r - 1, out, bytes);
    ex.waitAll();
  }
}

// Binomial tree rooted at `root`: vrank 0 is the root; in round k ranks below 2^k send to the
// rank 2^k above them.
void broadcast(Exchange& ex, const char* in, char* out, size_t count, int root) {
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = count * ex.elemSize();
  const int v = mod(r - root, n);
  if (v == 0 && out != in) ex.copy(out, in, bytes);
  for (int mask = 1; mask < n; mask *= 2) {
    if (v < mask) {
      if (v + mask < n) ex.send(mod(v + mask + root, n), out, bytes);
    } else if (v < 2 * mask) {
      ex.recv(mod(v - mask + root, n), out, bytes);
    }
    ex.waitAll();
  }
}

// Binomial reduce: the mirror image of broadcast; partial results flow towards the root.
void reduce(Exchange& ex, const char* in, char* out, size_t count, int root) {
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = count * ex.elemSize();
  const int v = mod(r - root, n);
  char* acc = v == 0 ? out : static_cast<char*>(ex.scratch(0, bytes));
  const char* have = in;  // where this rank's partial result lives
  for (int mask = 1; mask < n; mask *= 2) {
    if (v & mask) {
      ex.send(mod(v - mask + root, n), have, bytes);
      ex.waitAll();
      return;
    }
    if (v + mask < n) {
      ex.recvReduce(mod(v + mask + root, n), acc, have, bytes);
      ex.waitAll();
      have = acc;
    }
  }
  if (have != out) ex.copy(out, have, bytes);  // root of a group of one
}

// Bruck's dissemination: after round k a rank holds blocks r .. r+2^k-1 (mod n) and sends them
// to rank r-2^k. A range that wraps past the last block travels as two messages.
void allgather(Exchange& ex, const char* in, char* out, size_t count) {
  const int n = ex.size(), r = ex.rank();
  const size_t block = count * ex.elemSize();
  if (out + static_cast<size_t>(r) * block != in) ex.copy(out + r * block, in, block);
  auto transfer = [&](int peer, int first, int num, bool sending) {
    int tail = std::min(num, n - first);  // blocks before the wrap
    char* a = out + static_cast<size_t>(first) * block;
    if (sending) {
      ex.send(peer, a, tail * block);
      ex.send(peer, out, (num - tail) * block);
    } else {
      ex.recv(peer, a, tail * block);
      ex.recv(peer, out, (num - tail) * block);
    }
  };
  for (int have = 1; have < n; have *= 2) {
    int num = std::min(have, n - have);
    transfer(mod(r - have, n), r, num, true);
    transfer(mod(r + have, n), mod(r + have, n), num, false);
    ex.waitAll();
  }
}

class HalvingDoubling : public Algorithm {
 public:
  const char* name() const override { return "halving_doubling"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    if (a.kind == CollectiveKind::kReduceScatter && floorPow2(g.size()) != g.size())
      return "its reduce_scatter needs a power-of-two group size (this group has " +
             std::to_string(g.size()) + " ranks); use ring or reduce_to_one";
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    const LinkCost c = costOf(g, a);
    const int n = g.size();
    const double S = a.count * elementSize(a.dtype);
    const Fold f(n);
    const double p = f.p;
    const double rounds = std::ceil(std::log2(std::max(1, n)));
    // On a crowded host (shared_cores.h) every step waits for parked ranks, and a step runs at
    // the share of the cores its working ranks get: the core's p ranks, or the 2 * rem ranks
    // of the fold. With 3 ranks on 2 cores neither crowds, where the ring's 3 ranks do.
    const double wait = parkedPeerWait(g);
    const double crowdCore = crowding(g, [&f](int r) { return f.vrank(r) >= 0; });
    const double crowdFold = crowding(g, [&f](int r) { return r < 2 * f.rem; });
    const double alpha = c.alpha + wait, gamma = crowdCore * c.gamma;
    // The exchanges at each distance of the power-of-two core, priced by the host links they
    // load (link_load.h): the largest, at distance p/2, crosses hosts when ranks are grouped by
    // host. exchange(mask, bytesAtMask) sums alpha + bytes * beta over the distances, where
    // bytesAtMask(mask) is what one rank sends at that distance.
    auto exchanges = [&](const std::function<double(int)>& bytesAtMask) {
      double t = 0;
      for (int mask = f.p / 2; mask >= 1; mask /= 2) {
        auto partner = [&f, mask](int r) {
          const int v = f.vrank(r);
          return v < 0 ? -1 : f.real(v ^ mask);
        };
        t += stepAlpha(g, a, partner) + wait +
             bytesAtMask(mask) * crowdCore * stepBeta(g, a, partner);
      }
      return t;
    };
    // The fold: the even rank of each pair hands its data in (reduced on arrival) and gets the
    // result back, one way each time.
    auto folded = [&f](int r) { return r < 2 * f.rem && r % 2 == 0 ? r + 1 : -1; };
    auto unfolded = [&f](int r) { return r < 2 * f.rem && r % 2 == 1 ? r - 1 : -1; };
    const double fold = f.rem > 0 ? 2 * (stepAlpha(g, a, folded) + wait) +
                                        oneWaySeconds(g, a, folded, S, true, crowdFold) +
                                        oneWaySeconds(g, a, unfolded, S, false, crowdFold)
                                  : 0;
    const double L = log2Floor(n);
    switch (a.kind) {
      case CollectiveKind::kAllreduce:
        if (S <= kWholeVectorBytes) return exchanges([S](int) { return S; }) + L * S * gamma + fold;
        // Halving sends S * mask / p at each distance, doubling the same back. + S / p, once
        // the call's buffers leave the cache: this rank's own part also passes from its input
        // into its output, which no message counts (`direct` has no such pass: with 2
        // in-process replicas at 16-64 MiB it measured 1.5-1.7x faster, where the models tied).
        // In cache that pass is cheap and `direct` pays for its accumulator instead (4 MiB:
        // halving-doubling 198-201 us, `direct` 272-277).
        return 2 * exchanges([S, p](int mask) { return S * mask / p; }) +
               (callStaysInCache(g.comm(), n, S) ? 0
                                                 : S / p * crowdCore * g.comm().localCost().beta) +
               (p - 1) / p * S * gamma + fold;
      case CollectiveKind::kReduceScatter:
        return exchanges([S, p](int mask) { return S * mask / p; }) + (p - 1) / p * S * gamma;
      case CollectiveKind::kAllgather: return rounds * alpha + (n - 1) * S * crowdCore * c.beta;
      case CollectiveKind::kBroadcast: return rounds * (alpha + S * crowdCore * c.beta);
      case CollectiveKind::kReduce: return rounds * (alpha + S * crowdCore * (c.beta + c.gamma));
      default: return 1e30;
    }
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    const char* in = static_cast<const char*>(a.in);
    char* out = static_cast<char*>(a.out);
    switch (a.kind) {
      case CollectiveKind::kAllreduce: allreduce(ex, in, out, a.count); return;
      case CollectiveKind::kReduceScatter: {
        if (ex.size() == 1) {
          ex.copy(out, in, a.count * ex.elemSize());
          return;
        }
        Fold f(ex.size());
        char* work = static_cast<char*>(ex.scratch(0, a.count * ex.elemSize()));
        halving(ex, f, ex.rank(), in, work, out, a.count);
        return;
      }
      case CollectiveKind::kAllgather: allgather(ex, in, out, a.count); return;
      case CollectiveKind::kBroadcast: broadcast(ex, in, out, a.count, a.root); return;
      case CollectiveKind::kReduce: reduce(ex, in, out, a.count, a.root); return;
      default: PC_ASSERT(false, "halving_doubling cannot run ", collectiveName(a.kind));
    }
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const HalvingDoubling instance;
  return instance;
}

}  // namespace halving_doubling
}  // namespace pycollective

// Pairwise exchange: alltoall, gather, scatter and send/recv as one schedule. Every rank posts
// its message for each peer and its receive from each peer, in the order of the classic
// pairwise algorithm (step k: send to rank + k, receive from rank - k), so that at any moment
// the ranks' first messages go to distinct peers instead of all hitting rank 0. Each message
// goes straight from the caller's buffer to the peer's buffer (no staging, no reduction);
// gather, scatter and send/recv are the same exchange with most counts zero, and zero-byte
// messages are skipped on both ends. Sizes are checked per message: a receiver expecting
// another byte count than the sender sent fails with a ProtocolError naming both ranks.
#include <string>

#include "algorithms/exchange.h"
#include "algorithms/registry.h"
#include "core/error.h"

namespace pycollective {
namespace pairwise {

namespace {

class Pairwise : public Algorithm {
 public:
  const char* name() const override { return "pairwise"; }

  std::string unsupported(const Group& g, const CollectiveArgs& a) const override {
    if (a.kind == CollectiveKind::kSendRecv && g.size() != 2)
      return "send/recv runs in a group of two ranks, this one has " + std::to_string(g.size());
    if (a.device >= 0) return "it moves host memory only (device buffers go through NCCL)";
    return "";
  }

  double cost(const Group& g, const CollectiveArgs& a) const override {
    // One message per peer; `count` is the largest per-peer block (bytes per message).
    const LinkCost c = costOf(g, a);
    const double n = g.size(), S = a.count * elementSize(a.dtype);
    return (n - 1) * (c.alpha + S * c.beta);
  }

  void run(Exchange& ex, const CollectiveArgs& a) const override {
    const int n = ex.size(), r = ex.rank();
    const size_t es = ex.elemSize();
    const PeerBuffer* peers = a.peers;
    PC_CHECK(peers != nullptr, ex.group().comm().who(), " ", collectiveName(a.kind),
             " was called without per-peer buffers");
    const PeerBuffer& self = peers[r];
    PC_CHECK(self.sendCount == self.recvCount, ex.group().comm().who(), " ", collectiveName(a.kind),
             ": this rank sends ", self.sendCount, " elements to itself but expects ",
             self.recvCount);
    for (int k = 1; k < n; ++k) {
      const int to = (r + k) % n, from = (r - k + n) % n;
      ex.send(to, peers[to].send, peers[to].sendCount * es);
      ex.recv(from, peers[from].recv, peers[from].recvCount * es);
    }
    // The local block moves while the messages are on their way.
    if (self.sendCount > 0 && self.recv != self.send)
      ex.copy(self.recv, self.send, self.sendCount * es);
    ex.waitAll();
  }
};

}  // namespace

const Algorithm& algorithm() {
  static const Pairwise instance;
  return instance;
}

}  // namespace pairwise
}  // namespace pycollective

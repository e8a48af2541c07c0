#include "transport/inproc.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "core/error.h"

namespace pycollective {

namespace {
struct PostedSend {
  const void* data;
  size_t bytes;
  FrameHeader header;
  RequestPtr request;
};
}  // namespace

// One direction between two ranks.
struct InprocChannel {
  std::mutex mu;
  std::deque<PostedSend> sends;
  std::string failure;  // non-empty once either end aborted
};

namespace {

class InprocLink : public Link {
 public:
  InprocLink(int rank, int peer, std::shared_ptr<InprocChannel> out,
             std::shared_ptr<InprocChannel> in, std::shared_ptr<Notifier> mine,
             std::shared_ptr<Notifier> theirs)
      : rank_(rank),
        peer_(peer),
        out_(std::move(out)),
        in_(std::move(in)),
        mine_(std::move(mine)),
        theirs_(std::move(theirs)) {}

  RequestPtr postSend(const void* data, size_t bytes, const FrameHeader& header) override {
    auto req = std::make_shared<Request>();
    {
      std::lock_guard<std::mutex> lock(out_->mu);
      if (!out_->failure.empty()) throw RemoteError(out_->failure);
      out_->sends.push_back({data, bytes, header, req});
    }
    pendingSends_.push_back(req);
    theirs_->ring();
    return req;
  }

  RequestPtr postRecv(const RecvSpec& spec, const FrameHeader& expected) override {
    auto req = std::make_shared<Request>();
    recvs_.push_back({spec, expected, req});
    return req;
  }

  bool progress() override {
    bool moved = false;
    while (!recvs_.empty()) {
      PostedSend send;
      {
        std::lock_guard<std::mutex> lock(in_->mu);
        if (!in_->failure.empty()) throw RemoteError(in_->failure);
        if (in_->sends.empty()) break;
        send = in_->sends.front();
        in_->sends.pop_front();
      }
      PendingRecv recv = std::move(recvs_.front());
      recvs_.pop_front();
      consume(send, recv);
      moved = true;
    }
    while (!pendingSends_.empty() && pendingSends_.front()->done.load(std::memory_order_acquire))
      pendingSends_.pop_front();
    if (!pendingSends_.empty()) {
      std::lock_guard<std::mutex> lock(out_->mu);
      if (!out_->failure.empty()) throw RemoteError(out_->failure);
    }
    return moved;
  }

  void abort(const std::string& reason) noexcept override {
    std::string why = "rank " + std::to_string(rank_) + " aborted: " + reason;
    for (auto* ch : {out_.get(), in_.get()}) {
      std::lock_guard<std::mutex> lock(ch->mu);
      if (ch->failure.empty()) ch->failure = why;
    }
    mine_->ring();
    theirs_->ring();
  }

  std::string describe() const override { return "inproc -> rank " + std::to_string(peer_); }
  Notifier* notifier() override { return mine_.get(); }
  bool sharesMemory() const override { return true; }

 private:
  struct PendingRecv {
    RecvSpec spec;
    FrameHeader expected;
    RequestPtr request;
  };

  void consume(const PostedSend& send, const PendingRecv& recv) {
    FrameHeader got = send.header;
    got.bytes = send.bytes;
    std::string msg = frameError(rank_, peer_, recv.expected, got, recv.spec.bytes);
    if (!msg.empty()) {
      abort(msg);
      throw ProtocolError(msg);
    }
    applyPayload(recv.spec, send.data);
    send.request->done.store(true, std::memory_order_release);
    recv.request->done.store(true, std::memory_order_release);
    theirs_->ring();
  }

  int rank_, peer_;
  std::shared_ptr<InprocChannel> out_, in_;
  std::shared_ptr<Notifier> mine_, theirs_;
  std::deque<PendingRecv> recvs_;
  std::deque<RequestPtr> pendingSends_;
};

}  // namespace

InprocFabric::InprocFabric(int size) : size_(size) {
  PC_CHECK(size >= 1, "an in-process group needs at least one replica, got ", size);
  channels_.resize(static_cast<size_t>(size) * size);
  for (auto& ch : channels_) ch = std::make_shared<InprocChannel>();
  for (int r = 0; r < size; ++r) notifiers_.push_back(std::make_shared<Notifier>());
}

InprocFabric::~InprocFabric() = default;

std::vector<std::unique_ptr<Link>> InprocFabric::links(int rank) {
  std::vector<std::unique_ptr<Link>> out(size_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank) continue;
    out[peer] = std::make_unique<InprocLink>(rank, peer, channels_[rank * size_ + peer],
                                             channels_[peer * size_ + rank], notifiers_[rank],
                                             notifiers_[peer]);
  }
  return out;
}

}  // namespace pycollective

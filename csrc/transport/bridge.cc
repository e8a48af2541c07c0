#include "transport/bridge.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace pycollective {

BridgeEnd::BridgeEnd(int rank, int peer, std::string via)
    : rank_(rank), peer_(peer), via_(std::move(via)) {}

bool BridgeEnd::takeOutgoing(double timeoutSeconds, std::string& header, std::string& payload) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                    [&] { return !outbox_.empty() || !failure_.empty(); }))
    return false;
  if (!failure_.empty()) return false;
  Outgoing out = outbox_.front();
  outbox_.pop_front();
  lock.unlock();
  header.assign(reinterpret_cast<const char*>(&out.header), sizeof(FrameHeader));
  payload.assign(out.data, out.bytes);
  // The payload is copied: the caller's buffer is free again, so the send is complete.
  out.request->done.store(true, std::memory_order_release);
  notifier_.ring();
  return true;
}

void BridgeEnd::deliver(const std::string& header, std::string payload) {
  PC_CHECK(header.size() == sizeof(FrameHeader), "rank ", peer_, " sent a frame header of ",
           header.size(), " bytes over ", via_, "; expected ", sizeof(FrameHeader));
  Incoming in;
  std::memcpy(&in.header, header.data(), sizeof(FrameHeader));
  in.payload = std::move(payload);
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(in));
  }
  notifier_.ring();
}

void BridgeEnd::fail(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = reason;
  }
  cv_.notify_all();
  notifier_.ring();
}

bool BridgeEnd::failed() {
  std::lock_guard<std::mutex> lock(mu_);
  return !failure_.empty();
}

std::string BridgeEnd::failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

class BridgeLink : public Link {
 public:
  explicit BridgeLink(std::shared_ptr<BridgeEnd> end) : end_(std::move(end)) {}

  RequestPtr postSend(const void* data, size_t bytes, const FrameHeader& header) override {
    auto req = std::make_shared<Request>();
    {
      std::lock_guard<std::mutex> lock(end_->mu_);
      if (!end_->failure_.empty()) throw RemoteError(end_->failure_);
      end_->outbox_.push_back({header, static_cast<const char*>(data), bytes, req});
    }
    end_->cv_.notify_all();
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
      BridgeEnd::Incoming in;
      {
        std::lock_guard<std::mutex> lock(end_->mu_);
        if (!end_->failure_.empty()) throw RemoteError(end_->failure_);
        if (end_->inbox_.empty()) break;
        in = std::move(end_->inbox_.front());
        end_->inbox_.pop_front();
      }
      Pending r = std::move(recvs_.front());
      recvs_.pop_front();
      consume(in, r);
      moved = true;
    }
    if (end_->failed()) throw RemoteError(end_->failure());
    return moved;
  }

  void abort(const std::string& reason) noexcept override {
    try {
      end_->fail("rank " + std::to_string(end_->rank_) + " aborted: " + reason);
    } catch (...) {
    }
  }

  bool isNetwork() const override { return true; }

  std::string describe() const override {
    return end_->via_ + " -> rank " + std::to_string(end_->peer_);
  }
  Notifier* notifier() override { return &end_->notifier_; }

 private:
  struct Pending {
    RecvSpec spec;
    FrameHeader expected;
    RequestPtr request;
  };

  void consume(const BridgeEnd::Incoming& in, const Pending& r) {
    FrameHeader got = in.header;
    got.bytes = in.payload.size();
    std::string msg = frameError(end_->rank_, end_->peer_, r.expected, got, r.spec.bytes);
    if (!msg.empty()) {
      end_->fail(msg);
      throw ProtocolError(msg);
    }
    applyPayload(r.spec, in.payload.data());
    r.request->done.store(true, std::memory_order_release);
  }

  std::shared_ptr<BridgeEnd> end_;
  std::deque<Pending> recvs_;
};

std::unique_ptr<Link> makeBridgeLink(std::shared_ptr<BridgeEnd> end) {
  return std::make_unique<BridgeLink>(std::move(end));
}

}  // namespace pycollective

#pragma once
// A link whose bytes are carried by someone else: the native side queues outgoing frames and
// matches incoming ones exactly like the other transports (headers checked, receives copied or
// reduced), while a "pump" outside (Python threads driving a gRPC stream, for the portable
// grpc transport) takes frames out and hands frames in. The pump never holds up a collective's
// thread: taking and delivering only touch two queues under a mutex.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/notifier.h"

namespace pycollective {

// State shared by the link (inside a Communicator) and its pump.
class BridgeEnd {
 public:
  BridgeEnd(int rank, int peer, std::string via);

  // Pump side. takeOutgoing waits up to timeoutSeconds for the next frame posted by the link and
  // copies it out (header bytes, payload bytes); the send then counts as complete. Returns
  // false on timeout or once the end failed/closed (check failed()).
  bool takeOutgoing(double timeoutSeconds, std::string& header, std::string& payload);
  // Hands in one frame received from the peer (copied).
  void deliver(const std::string& header, std::string payload);
  // The carrier broke or the peer left: every pending and future request fails with `reason`.
  void fail(const std::string& reason);
  bool failed();
  std::string failure();

 private:
  friend class BridgeLink;
  struct Outgoing {
    FrameHeader header;
    const char* data;
    size_t bytes;
    RequestPtr request;
  };
  struct Incoming {
    FrameHeader header;
    std::string payload;
  };

  int rank_, peer_;
  std::string via_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Outgoing> outbox_;
  std::deque<Incoming> inbox_;
  std::string failure_;
  Notifier notifier_;
};

// The Link half; owns nothing but a reference to the shared end.
std::unique_ptr<Link> makeBridgeLink(std::shared_ptr<BridgeEnd> end);

}  // namespace pycollective

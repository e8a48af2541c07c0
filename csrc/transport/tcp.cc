// Frames over a nonblocking socket: a FrameHeader, then the payload. Sends go out with
// sendmsg() straight from the caller's buffer; copying receives land straight in the
// destination; reducing receives go through a staging buffer and are reduced as bytes arrive,
// so the network transfer and the reduction overlap.
#include "transport/tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace pycollective {

namespace {

class TcpLink : public Link {
 public:
  explicit TcpLink(const TcpLinkOptions& o)
      : fd_(o.fd),
        rank_(o.rank),
        peer_(o.peer),
        address_(o.peerAddress),
        staging_(std::max<size_t>(o.stagingBytes, 64)) {
    PC_CHECK(fd_ >= 0, "tcp link to rank ", peer_, " needs a connected socket");
    int flags = fcntl(fd_, F_GETFL, 0);
    PC_CHECK(flags >= 0 && fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == 0,
             "cannot make the socket to rank ", peer_, " nonblocking: ", std::strerror(errno));
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // small frames go out now
  }

  ~TcpLink() override {
    if (fd_ >= 0) ::close(fd_);
  }

  RequestPtr postSend(const void* data, size_t bytes, const FrameHeader& header) override {
    failIfBroken();
    auto req = std::make_shared<Request>();
    sends_.push_back({header, static_cast<const char*>(data), bytes, 0, req});
    return req;
  }

  RequestPtr postRecv(const RecvSpec& spec, const FrameHeader& expected) override {
    failIfBroken();
    auto req = std::make_shared<Request>();
    recvs_.push_back({spec, expected, {}, 0, 0, req});
    return req;
  }

  bool progress() override {
    failIfBroken();
    bool moved = false;
    moved |= pushSends();
    moved |= pullRecvs();
    return moved;
  }

  // May run on another thread (a failure elsewhere, the coordinator's abort broadcast) while
  // the owner is inside progress(): only the flag, the reason and shutdown() are touched.
  void abort(const std::string& reason) noexcept override {
    markBroken("rank " + std::to_string(rank_) + " aborted: " + reason);
    // The peer sees the connection close at once and stops waiting for this rank.
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }

  bool isNetwork() const override { return true; }

  std::string describe() const override {
    return "tcp " + address_ + " -> rank " + std::to_string(peer_);
  }

  int pollFd() const override { return fd_; }
  short pollEvents() const override {
    short ev = 0;
    if (!recvs_.empty()) ev |= POLLIN;
    if (!sends_.empty()) ev |= POLLOUT;
    return ev;
  }

 private:
  struct PendingSend {
    FrameHeader header;
    const char* data;
    size_t bytes;
    size_t done;  // bytes of header + payload written
    RequestPtr request;
  };
  struct PendingRecv {
    RecvSpec spec;
    FrameHeader expected;
    FrameHeader got;
    size_t headerDone;
    size_t payloadDone;  // bytes of payload consumed (copied or reduced)
    RequestPtr request;
  };

  void markBroken(const std::string& why) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.empty()) broken_ = why;
    } catch (...) {
    }
    isBroken_.store(true);
  }

  void failIfBroken() {
    if (!isBroken_.load()) return;
    std::lock_guard<std::mutex> lock(mu_);
    throw RemoteError(broken_);
  }

  [[noreturn]] void peerGone(const std::string& what) {
    markBroken("rank " + std::to_string(peer_) + " closed its connection (" + what +
               ") while rank " + std::to_string(rank_) + " was talking to it over " + describe() +
               ": it exited, crashed or aborted");
    failIfBroken();
    throw InternalError("unreachable");
  }

  bool pushSends() {
    bool moved = false;
    while (!sends_.empty()) {
      PendingSend& s = sends_.front();
      const size_t total = sizeof(FrameHeader) + s.bytes;
      iovec iov[2];
      int n = 0;
      if (s.done < sizeof(FrameHeader)) {
        iov[n].iov_base = reinterpret_cast<char*>(&s.header) + s.done;
        iov[n].iov_len = sizeof(FrameHeader) - s.done;
        ++n;
      }
      size_t payloadDone = s.done > sizeof(FrameHeader) ? s.done - sizeof(FrameHeader) : 0;
      if (s.bytes > payloadDone) {
        iov[n].iov_base = const_cast<char*>(s.data) + payloadDone;
        iov[n].iov_len = s.bytes - payloadDone;
        ++n;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = n;
      ssize_t w = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (errno == EINTR) continue;
        peerGone(std::strerror(errno));
      }
      moved = true;
      s.done += static_cast<size_t>(w);
      if (s.done == total) {
        s.request->done.store(true, std::memory_order_release);
        sends_.pop_front();
      }
    }
    return moved;
  }

  // Reads up to `len` bytes; returns bytes read (0: would block). EOF and errors throw.
  size_t readSome(void* dst, size_t len) {
    for (;;) {
      ssize_t r = ::recv(fd_, dst, len, MSG_DONTWAIT);
      if (r > 0) return static_cast<size_t>(r);
      if (r == 0) peerGone("end of stream");
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      peerGone(std::strerror(errno));
    }
  }

  bool pullRecvs() {
    bool moved = false;
    while (!recvs_.empty()) {
      PendingRecv& r = recvs_.front();
      if (r.headerDone < sizeof(FrameHeader)) {
        size_t got = readSome(reinterpret_cast<char*>(&r.got) + r.headerDone,
                              sizeof(FrameHeader) - r.headerDone);
        if (got == 0) break;
        moved = true;
        r.headerDone += got;
        if (r.headerDone < sizeof(FrameHeader)) continue;
        checkHeader(r);
      }
      if (!pullPayload(r, moved)) break;
      r.request->done.store(true, std::memory_order_release);
      recvs_.pop_front();
    }
    return moved;
  }

  void checkHeader(const PendingRecv& r) {
    std::string msg = frameError(rank_, peer_, r.expected, r.got, r.spec.bytes);
    if (msg.empty()) return;
    markBroken(msg);
    ::shutdown(fd_, SHUT_RDWR);
    throw ProtocolError(msg);
  }

  // Returns true once the whole payload was consumed.
  bool pullPayload(PendingRecv& r, bool& moved) {
    const RecvSpec& s = r.spec;
    char* dst = static_cast<char*>(s.dst);
    if (s.reduce == nullptr) {
      while (r.payloadDone < s.bytes) {
        size_t got = readSome(dst + r.payloadDone, s.bytes - r.payloadDone);
        if (got == 0) return false;
        moved = true;
        r.payloadDone += got;
      }
      return true;
    }
    const char* accum = static_cast<const char*>(s.accum != nullptr ? s.accum : s.dst);
    const size_t es = s.elemSize;
    while (r.payloadDone < s.bytes) {
      // staged_ bytes already in the staging buffer (a partial element from the last read).
      size_t want = std::min(staging_.size() - staged_, s.bytes - r.payloadDone - staged_);
      size_t got = want > 0 ? readSome(staging_.data() + staged_, want) : 0;
      if (got == 0 && want > 0) return false;
      moved = true;
      staged_ += got;
      size_t whole = staged_ / es * es;
      if (whole > 0) {
        reduceParallel(s.reduce, dst + r.payloadDone, accum + r.payloadDone, staging_.data(),
                       whole / es, es, s.threads);
        r.payloadDone += whole;
        std::memmove(staging_.data(), staging_.data() + whole, staged_ - whole);
        staged_ -= whole;
      }
    }
    return true;
  }

  int fd_;
  int rank_, peer_;
  std::string address_;
  std::vector<char> staging_;
  size_t staged_ = 0;
  std::deque<PendingSend> sends_;
  std::deque<PendingRecv> recvs_;
  std::atomic<bool> isBroken_{false};
  std::mutex mu_;
  std::string broken_;  // why the link is unusable (guarded by mu_)
};

}  // namespace

std::unique_ptr<Link> makeTcpLink(const TcpLinkOptions& options) {
  return std::make_unique<TcpLink>(options);
}

}  // namespace pycollective

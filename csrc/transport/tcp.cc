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
#include "core/host_copy.h"
#include "transport/aead.h"

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
    if (!o.key.empty()) {
      cipher_ = std::make_unique<Aes256Gcm>(o.key);
      // Each direction has its own nonces: the lower rank's records carry 0, the higher's 1.
      sendDirection_ = rank_ < peer_ ? 0 : 1;
      record_.resize(kRecordHead + kTcpRecordBytes + Aes256Gcm::kTagBytes);
      sealed_.resize(record_.size());
    }
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
    return std::string(cipher_ ? "encrypted " : "") + "tcp " + address_ + " -> rank " +
           std::to_string(peer_);
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

  bool pushSends() { return cipher_ ? pushSealed() : pushPlain(); }

  // Encrypted sends: one record at a time is sealed from the front send's header and payload
  // and written out; the send completes once its last record has left.
  bool pushSealed() {
    bool moved = false;
    for (;;) {
      if (sealedDone_ < sealedBytes_) {
        ssize_t w = ::send(fd_, sealed_.data() + sealedDone_, sealedBytes_ - sealedDone_,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          if (errno == EINTR) continue;
          peerGone(std::strerror(errno));
        }
        moved = true;
        sealedDone_ += static_cast<size_t>(w);
        continue;
      }
      if (sends_.empty()) break;
      PendingSend& s = sends_.front();
      const size_t total = sizeof(FrameHeader) + s.bytes;
      if (s.done == total) {
        s.request->done.store(true, std::memory_order_release);
        sends_.pop_front();
        moved = true;
        continue;
      }
      const size_t n = std::min(kTcpRecordBytes, total - s.done);
      uint8_t* out = sealed_.data();
      putBigEndian32(out, static_cast<uint32_t>(n));
      // A record of payload only is sealed straight from the caller's buffer; one holding
      // header bytes is gathered first.
      const uint8_t* plain = out + kRecordHead;
      if (s.done < sizeof(FrameHeader))
        copyPlain(s, s.done, n, out + kRecordHead);
      else
        plain = reinterpret_cast<const uint8_t*>(s.data) + (s.done - sizeof(FrameHeader));
      uint8_t nonce[Aes256Gcm::kNonceBytes];
      makeNonce(sendDirection_, sendCounter_++, nonce);
      cipher_->seal(nonce, out, kRecordHead, plain, n, out + kRecordHead, out + kRecordHead + n);
      s.done += n;
      sealedBytes_ = kRecordHead + n + Aes256Gcm::kTagBytes;
      sealedDone_ = 0;
    }
    return moved;
  }

  // Bytes [offset, offset + n) of a send's header followed by its payload.
  static void copyPlain(const PendingSend& s, size_t offset, size_t n, uint8_t* dst) {
    const auto* header = reinterpret_cast<const uint8_t*>(&s.header);
    if (offset < sizeof(FrameHeader)) {
      size_t take = std::min(n, sizeof(FrameHeader) - offset);
      std::memcpy(dst, header + offset, take);
      dst += take;
      offset += take;
      n -= take;
    }
    if (n > 0) hostCopy(dst, s.data + (offset - sizeof(FrameHeader)), n);
  }

  bool pushPlain() {
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

  // Reads up to `len` bytes of the stream (plaintext, decrypted on an encrypted link); returns
  // bytes read (0: would block). EOF, errors and records that fail authentication throw.
  size_t readSome(void* dst, size_t len) {
    if (!cipher_) return readSocket(dst, len);
    if (openPos_ == openBytes_) return openRecord(static_cast<uint8_t*>(dst), len);
    size_t n = std::min(len, openBytes_ - openPos_);
    hostCopy(dst, record_.data() + kRecordHead + openPos_, n);
    openPos_ += n;
    return n;
  }

  // Reads the next record whole and authenticates and decrypts it: straight into `dst` when
  // all of it fits in `len` bytes (returns its length), else in place, handing out the first
  // `len` bytes. Returns 0 while the record has not all arrived.
  size_t openRecord(uint8_t* dst, size_t len) {
    while (recordHave_ < kRecordHead) {
      size_t got = readSocket(record_.data() + recordHave_, kRecordHead - recordHave_);
      if (got == 0) return 0;
      recordHave_ += got;
    }
    const uint8_t* head = record_.data();
    const size_t n = (size_t(head[0]) << 24) | (size_t(head[1]) << 16) | (size_t(head[2]) << 8) |
                     size_t(head[3]);
    if (n == 0 || n > kTcpRecordBytes)
      refuseStream("announced an encrypted record of " + std::to_string(n) + " bytes (at most " +
                   std::to_string(kTcpRecordBytes) + "): the stream is corrupt, or the peer does " +
                   "not encrypt (PYCOLLECTIVE_DATA_ENCRYPT must be the same on every rank)");
    const size_t whole = kRecordHead + n + Aes256Gcm::kTagBytes;
    while (recordHave_ < whole) {
      size_t got = readSocket(record_.data() + recordHave_, whole - recordHave_);
      if (got == 0) return 0;
      recordHave_ += got;
    }
    uint8_t nonce[Aes256Gcm::kNonceBytes];
    makeNonce(1 - sendDirection_, recvCounter_++, nonce);
    uint8_t* body = record_.data() + kRecordHead;
    const bool direct = n <= len;
    if (!cipher_->open(nonce, record_.data(), kRecordHead, body, n, direct ? dst : body, body + n))
      refuseStream("sent encrypted record #" + std::to_string(recvCounter_ - 1) +
                   " that fails authentication: it was altered, replayed, reordered or dropped " +
                   "on the way, or sealed with another key; nothing of it was used");
    recordHave_ = 0;
    if (direct) {
      openPos_ = openBytes_ = 0;
      return n;
    }
    openBytes_ = n;
    openPos_ = std::min(len, n);
    hostCopy(dst, body, openPos_);
    return openPos_;
  }

  [[noreturn]] void refuseStream(const std::string& what) {
    std::string msg = "rank " + std::to_string(rank_) + ": rank " + std::to_string(peer_) +
                      " over " + describe() + " " + what;
    markBroken(msg);
    ::shutdown(fd_, SHUT_RDWR);
    throw ProtocolError(msg);
  }

  static void putBigEndian32(uint8_t* out, uint32_t v) {
    out[0] = uint8_t(v >> 24);
    out[1] = uint8_t(v >> 16);
    out[2] = uint8_t(v >> 8);
    out[3] = uint8_t(v);
  }

  static void makeNonce(uint32_t direction, uint64_t counter, uint8_t nonce[12]) {
    putBigEndian32(nonce, direction);
    for (int i = 0; i < 8; ++i) nonce[4 + i] = uint8_t(counter >> (56 - 8 * i));
  }

  size_t readSocket(void* dst, size_t len) {
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
  // Encrypted links only (cipher_ set): the record being sent and the one being received.
  static constexpr size_t kRecordHead = 4;
  std::unique_ptr<Aes256Gcm> cipher_;
  uint32_t sendDirection_ = 0;
  uint64_t sendCounter_ = 0, recvCounter_ = 0;
  std::vector<uint8_t> sealed_;  // length, ciphertext, tag
  size_t sealedBytes_ = 0, sealedDone_ = 0;
  std::vector<uint8_t> record_;  // as received; decrypted in place
  size_t recordHave_ = 0, openPos_ = 0, openBytes_ = 0;
  std::atomic<bool> isBroken_{false};
  std::mutex mu_;
  std::string broken_;  // why the link is unusable (guarded by mu_)
};

}  // namespace

std::unique_ptr<Link> makeTcpLink(const TcpLinkOptions& options) {
  return std::make_unique<TcpLink>(options);
}

}  // namespace pycollective

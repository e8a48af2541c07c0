#include "transport/shm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "core/host_copy.h"
#include "core/logging.h"
#include "core/stream_copy.h"
#include "transport/peer_distance.h"
#include "transport/shm_common.h"

namespace pycollective {

namespace {

using shm::kDigestBytes;
using shm::kReasonBytes;
using shm::loadReason;
using shm::ownStartTicks;
using shm::pidNamesPeer;
using shm::sameDigest;
using shm::storeReason;
using shm::sysError;

// Segment layout (version 1):
//   [0, kControlBytes)                          SegmentControl
//   [kControlBytes, +ringBytes)                 ring 0: messages of the creator (side 0)
//   [kControlBytes + ringBytes, +ringBytes)     ring 1: messages of the opener (side 1)
// Ring r is written only by side r and read only by side 1 - r. head[r] and tail[r] are byte
// counters that only grow; the free space of ring r is ringBytes - (head - tail). Every message
// is a FrameHeader followed by its payload padded to 8 bytes, so every message starts 8-aligned
// and an element of up to 8 bytes never straddles the end of the ring (ringBytes % 64 == 0).
constexpr uint64_t kSegmentMagic = 0x314d48534c4f4350ull;  // "PCOLSHM1"
constexpr uint32_t kLayoutVersion = 1;
constexpr size_t kMinRingBytes = 4096;
constexpr size_t kHeaderBytes = sizeof(FrameHeader);
// The sender publishes (and the receiver frees) the ring in pieces of at most this size, so both
// processes copy at the same time instead of taking turns over the whole ring; small enough to
// stay in cache between the two copies.
constexpr size_t kChunkBytes = size_t(256) << 10;
constexpr auto kLivenessInterval = std::chrono::milliseconds(50);
constexpr auto kHandshakePoll = std::chrono::microseconds(500);

static_assert(kHeaderBytes % 8 == 0, "payloads must start 8-aligned");
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

enum SideState : uint32_t {
  kAbsent = 0,  // not attached yet (zero-filled segment)
  kAttached = 1,
  kClosed = 2,   // the link was destroyed normally: what it sent is still in the ring
  kAborted = 3,  // reason[] says why
  kRefused = 4,  // the opener rejected the segment during the handshake; reason[] says why
};

struct alignas(128) SideBlock {
  std::atomic<uint32_t> state;
  int32_t pid;
  int32_t rank;
  uint32_t reserved;
  uint64_t startTicks;  // /proc/<pid>/stat start time: tells a reused pid from the peer
  char reason[kReasonBytes];
};

// 128 bytes per counter: the two processes write different counters, and adjacent-line
// prefetchers would otherwise make neighbouring lines bounce as if they were shared.
struct alignas(128) Counter {
  std::atomic<uint64_t> value;
};

struct SegmentControl {
  std::atomic<uint64_t> magic;  // stored last by the creator (release): the rest is initialized
  uint32_t version;
  uint32_t controlBytes;
  uint64_t ringBytes;
  unsigned char digest[kDigestBytes];
  SideBlock sides[2];  // [0] creator, [1] opener
  Counter head[2];     // bytes side r has written into ring r
  Counter tail[2];     // bytes side 1 - r has consumed from ring r
};

constexpr size_t kControlBytes = (sizeof(SegmentControl) + 4095) & ~size_t(4095);

size_t segmentBytes(size_t ringBytes) {
  return kControlBytes + 2 * ringBytes;
}
size_t pad8(size_t n) {
  return (n + 7) & ~size_t(7);
}

void sleepPoll() {
  std::this_thread::sleep_for(kHandshakePoll);
}

void fillSide(SideBlock& side, int rank) {
  side.pid = static_cast<int32_t>(::getpid());
  side.rank = rank;
  side.startTicks = ownStartTicks();
}

class ShmLink : public Link {
 public:
  ShmLink(const ShmLinkOptions& options, void* base, size_t mapBytes, int side)
      : name_(options.name),
        rank_(options.rank),
        peer_(options.peer),
        base_(base),
        mapBytes_(mapBytes),
        ctl_(static_cast<SegmentControl*>(base)),
        side_(side) {
    ringBytes_ = static_cast<size_t>(ctl_->ringBytes);
    char* data = static_cast<char*>(base) + kControlBytes;
    sendRing_ = data + side_ * ringBytes_;
    recvRing_ = data + (1 - side_) * ringBytes_;
    chunkBytes_ = std::min(kChunkBytes, (ringBytes_ / 4) & ~size_t(7));
    const SideBlock& other = ctl_->sides[1 - side_];
    peerPid_ = other.pid;
    peerStartTicks_ = other.startTicks;
    watchPid_ = pidNamesPeer(peerPid_, peerStartTicks_);
    if (!watchPid_)
      PC_WARN(kTransport, "shm link ", name_, ": pid ", peerPid_, " of rank ", peer_,
              " is not visible from rank ", rank_,
              " (another pid namespace?): if it dies "
              "without aborting, only the collective timeout will notice");
    // Start from wherever the counters are (zero on a fresh segment).
    sendHead_ = sendHead().load(std::memory_order_relaxed);
    sendTailCache_ = sendTail().load(std::memory_order_acquire);
    recvTail_ = recvTail().load(std::memory_order_relaxed);
    recvHeadCache_ = recvHead().load(std::memory_order_acquire);
  }

  ~ShmLink() override {
    // An aborted side stays aborted, so the peer still learns the reason; otherwise the peer
    // learns that this side left on purpose (and may still drain what it sent).
    if (mine().state.load(std::memory_order_acquire) != kAborted)
      mine().state.store(kClosed, std::memory_order_release);
    ::munmap(base_, mapBytes_);
  }

  RequestPtr postSend(const void* data, size_t bytes, const FrameHeader& header) override {
    throwIfFailed();
    if (theirs().state.load(std::memory_order_acquire) == kClosed) throwClosed();
    auto req = std::make_shared<Request>();
    PendingSend s;
    s.data = static_cast<const char*>(data);
    s.bytes = bytes;
    s.header = header;
    s.header.bytes = bytes;  // framing follows what is really sent, whatever the caller stamped
    s.request = req;
    sends_.push_back(s);
    return req;
  }

  RequestPtr postRecv(const RecvSpec& spec, const FrameHeader& expected) override {
    PC_ASSERT(spec.reduce == nullptr || ((spec.elemSize == 1 || spec.elemSize == 2 ||
                                          spec.elemSize == 4 || spec.elemSize == 8) &&
                                         spec.bytes % spec.elemSize == 0),
              "reduce over shm needs whole elements of 1, 2, 4 or 8 bytes: ", spec.bytes,
              " bytes of ", spec.elemSize);
    auto req = std::make_shared<Request>();
    PendingRecv r;
    r.spec = spec;
    r.expected = expected;
    r.request = req;
    recvs_.push_back(r);
    return req;
  }

  bool progress() override {
    if (sends_.empty() && recvs_.empty()) return false;
    // A peer's abort fails only what this side cannot finish: messages already in the ring
    // were sent before it, so they are delivered first (a peer that finished this call and
    // failed in its next one, a mismatch there, must not fail this one here). This side's own
    // abort stops everything at once.
    throwIfAborted(mine(), rank_);
    bool moved = false;
    if (!sends_.empty()) moved |= pushSends();
    if (!recvs_.empty()) moved |= pullRecvs();
    if (sends_.empty() && recvs_.empty()) return moved;
    throwIfAborted(theirs(), peer_);
    if (moved) {
      stalled_ = false;
    } else if (!sends_.empty() || !recvs_.empty()) {
      checkStalled();
    }
    return moved;
  }

  void abort(const std::string& reason) noexcept override {
    bool first = false;
    if (!abortClaimed_.compare_exchange_strong(first, true)) return;
    // The reason goes first, then the state (release): the peer reads them in the other order.
    storeReason(mine().reason, reason);
    mine().state.store(kAborted, std::memory_order_release);
  }

  std::string describe() const override {
    return "shm " + name_ + " -> rank " + std::to_string(peer_);
  }

 private:
  struct PendingSend {
    const char* data = nullptr;
    size_t bytes = 0;
    FrameHeader header;
    RequestPtr request;
    size_t written = 0;
    bool headerWritten = false;
  };
  struct PendingRecv {
    RecvSpec spec;
    FrameHeader expected;
    RequestPtr request;
    uint64_t payloadAt = 0;  // ring position of the first payload byte
    size_t consumed = 0;
    bool headerRead = false;
  };

  SideBlock& mine() { return ctl_->sides[side_]; }
  SideBlock& theirs() { return ctl_->sides[1 - side_]; }
  std::atomic<uint64_t>& sendHead() { return ctl_->head[side_].value; }
  std::atomic<uint64_t>& sendTail() { return ctl_->tail[side_].value; }
  std::atomic<uint64_t>& recvHead() { return ctl_->head[1 - side_].value; }
  std::atomic<uint64_t>& recvTail() { return ctl_->tail[1 - side_].value; }

  // A counter the peer writes, re-read. While long messages pass, the reads that find it moved
  // are timed: how far the peer's core is decides how their pieces are written (copyPiece). A
  // short message's reads are not: the fences of the timing would be a share of its latency.
  uint64_t reloadPeerCounter(const std::atomic<uint64_t>& counter, uint64_t seen, size_t want) {
    if (want < PeerDistance::kMinTimedBytes) return counter.load(std::memory_order_acquire);
    return distance_.load(counter, seen);
  }

  // Free bytes at `head`, re-reading the consumer's counter only when the cached one does not
  // leave `want` bytes: the shared line is touched only when it might help.
  size_t sendSpace(uint64_t head, size_t want) {
    size_t space = ringBytes_ - static_cast<size_t>(head - sendTailCache_);
    if (space < want) {
      sendTailCache_ = reloadPeerCounter(sendTail(), sendTailCache_, want);
      space = ringBytes_ - static_cast<size_t>(head - sendTailCache_);
    }
    return space;
  }

  size_t recvAvailable(uint64_t tail, size_t want) {
    size_t avail = static_cast<size_t>(recvHeadCache_ - tail);
    if (avail < want) {
      recvHeadCache_ = reloadPeerCounter(recvHead(), recvHeadCache_, want);
      avail = static_cast<size_t>(recvHeadCache_ - tail);
    }
    return avail;
  }

  void copyIntoRing(uint64_t pos, const void* src, size_t n, bool streaming = false) {
    size_t off = static_cast<size_t>(pos % ringBytes_);
    size_t first = std::min(n, ringBytes_ - off);
    const auto copy = streaming ? streamCopy : hostCopy;
    copy(sendRing_ + off, src, first);
    if (first < n) copy(sendRing_, static_cast<const char*>(src) + first, n - first);
  }

  // A piece of a message's payload: with streaming stores when it is long and the peer far.
  void copyPiece(uint64_t pos, const char* src, size_t n) {
    if (n < PeerDistance::kMinStreamedBytes) {
      copyIntoRing(pos, src, n);
      return;
    }
    const bool stream = distance_.stream(n);
    if (stream != streaming_) {
      streaming_ = stream;
      PC_INFO(kTransport, "shm ring to rank ", peer_, ": a cache line from its core takes ",
              distance_.nanoseconds(), " ns; long messages now go ",
              stream ? "past the cache (streaming stores)" : "through the cache");
    }
    copyIntoRing(pos, src, n, stream);
  }

  void copyFromRing(void* dst, uint64_t pos, size_t n) {
    size_t off = static_cast<size_t>(pos % ringBytes_);
    size_t first = std::min(n, ringBytes_ - off);
    hostCopy(dst, recvRing_ + off, first);
    if (first < n) hostCopy(static_cast<char*>(dst) + first, recvRing_, n - first);
  }

  // Copies or reduces n payload bytes at ring position `pos` into the receive's destination,
  // straight out of the ring. With a wrap that is two pieces; each holds whole elements because
  // the payload starts 8-aligned and the ring size is a multiple of 64.
  void consumePayload(const PendingRecv& r, uint64_t pos, size_t n) {
    const RecvSpec& s = r.spec;
    char* dst = static_cast<char*>(s.dst) + r.consumed;
    size_t off = static_cast<size_t>(pos % ringBytes_);
    size_t first = std::min(n, ringBytes_ - off);
    if (s.reduce == nullptr) {
      hostCopy(dst, recvRing_ + off, first);
      if (first < n) hostCopy(dst + first, recvRing_, n - first);
      return;
    }
    const char* accum =
        (s.accum != nullptr ? static_cast<const char*>(s.accum) : static_cast<const char*>(s.dst)) +
        r.consumed;
    reduceParallel(s.reduce, dst, accum, recvRing_ + off, first / s.elemSize, s.elemSize,
                   s.threads);
    if (first < n)
      reduceParallel(s.reduce, dst + first, accum + first, recvRing_, (n - first) / s.elemSize,
                     s.elemSize, s.threads);
  }

  // Moves queued sends into the ring, at most one ring's worth per call so that the caller's
  // other links get their turn. A send completes once all its bytes are in the ring: the user's
  // buffer is then free.
  bool pushSends() {
    uint64_t head = sendHead_;
    const uint64_t start = head;
    uint64_t published = head;
    while (!sends_.empty() && head - start < ringBytes_) {
      PendingSend& s = sends_.front();
      if (!s.headerWritten) {
        if (sendSpace(head, kHeaderBytes) < kHeaderBytes) break;
        copyIntoRing(head, &s.header, kHeaderBytes);
        head += kHeaderBytes;
        s.headerWritten = true;
      }
      while (s.written < s.bytes && head - start < ringBytes_) {
        size_t remaining = s.bytes - s.written;
        // Whole multiples of 8 except for the last piece, which brings its padding: the head
        // stays 8-aligned within the message, so the receiver always sees whole elements.
        size_t space = sendSpace(head, std::min(pad8(remaining), chunkBytes_)) & ~size_t(7);
        size_t n = std::min({remaining, space, chunkBytes_});
        if (n == 0) break;
        copyPiece(head, s.data + s.written, n);
        s.written += n;
        head += s.written == s.bytes ? pad8(n) : n;
        // Publish every piece so the receiver copies this one while the next is written.
        sendHead().store(head, std::memory_order_release);
        published = head;
      }
      if (s.written < s.bytes) break;
      s.request->done.store(true, std::memory_order_release);
      sends_.pop_front();
    }
    if (head != published) sendHead().store(head, std::memory_order_release);
    sendHead_ = head;
    return head != start;
  }

  bool pullRecvs() {
    uint64_t tail = recvTail_;
    const uint64_t start = tail;
    uint64_t published = tail;
    while (!recvs_.empty() && tail - start < ringBytes_) {
      PendingRecv& r = recvs_.front();
      if (!r.headerRead) {
        if (recvAvailable(tail, kHeaderBytes) < kHeaderBytes) break;
        FrameHeader got;
        copyFromRing(&got, tail, kHeaderBytes);
        checkHeader(r, got);
        tail += kHeaderBytes;
        r.payloadAt = tail;
        r.headerRead = true;
      }
      const RecvSpec& s = r.spec;
      while (r.consumed < s.bytes && tail - start < ringBytes_) {
        size_t remaining = s.bytes - r.consumed;
        size_t avail = recvAvailable(tail, std::min(remaining, chunkBytes_));
        size_t n = std::min({remaining, avail, chunkBytes_});
        if (s.reduce != nullptr) n -= n % s.elemSize;
        if (n == 0) break;
        consumePayload(r, tail, n);
        r.consumed += n;
        // The sender published the padding together with the last payload byte.
        tail = r.consumed == s.bytes ? r.payloadAt + pad8(s.bytes) : tail + n;
        // Free every piece at once, so the sender refills it while the next is read.
        recvTail().store(tail, std::memory_order_release);
        published = tail;
      }
      if (r.consumed < s.bytes) break;
      r.request->done.store(true, std::memory_order_release);
      recvs_.pop_front();
    }
    if (tail != published) recvTail().store(tail, std::memory_order_release);
    recvTail_ = tail;
    return tail != start;
  }

  void checkHeader(const PendingRecv& r, const FrameHeader& got) {
    std::string msg = frameError(rank_, peer_, r.expected, got, r.spec.bytes);
    if (msg.empty()) return;
    abort(msg);
    throw ProtocolError(msg);
  }

  // Failures that end every pending request: an abort on either side.
  void throwIfFailed() {
    throwIfAborted(mine(), rank_);
    throwIfAborted(theirs(), peer_);
  }
  static void throwIfAborted(SideBlock& side, int rank) {
    if (side.state.load(std::memory_order_acquire) == kAborted)
      throw RemoteError("rank " + std::to_string(rank) + " aborted: " + loadReason(side.reason));
  }

  [[noreturn]] void throwClosed() {
    throw RemoteError(makeMessage(
        "rank ", peer_, " closed its link (", describe(), ") while rank ", rank_, " still ",
        recvs_.empty() ? "had messages for it" : "waited for messages from it"));
  }

  // Nothing moved although work is pending: the peer may have closed its side or died.
  void checkStalled() {
    if (theirs().state.load(std::memory_order_acquire) == kClosed) {
      // It may have closed right after sending: its last messages are still in the ring. The
      // head is read after the state (acquire), so it is final.
      if (!recvs_.empty() && recvHead().load(std::memory_order_acquire) != recvHeadCache_) return;
      throwClosed();
    }
    // Only after a stall of kLivenessInterval, and then at that pace: a message that arrives
    // within microseconds must not pay for a syscall and a /proc read.
    auto now = std::chrono::steady_clock::now();
    if (!stalled_) {
      stalled_ = true;
      nextLivenessCheck_ = now + kLivenessInterval;
      return;
    }
    if (now < nextLivenessCheck_) return;
    nextLivenessCheck_ = now + kLivenessInterval;
    if (watchPid_ && peerDied())
      throw RemoteError(makeMessage("rank ", peer_, " (pid ", peerPid_,
                                    ") died while this rank waited for it over shm (", name_, ")"));
  }

  bool peerDied() const { return shm::processDied(peerPid_, peerStartTicks_); }

  std::string name_;
  int rank_, peer_;
  void* base_;
  size_t mapBytes_;
  SegmentControl* ctl_;
  int side_;
  size_t ringBytes_ = 0;
  size_t chunkBytes_ = 0;
  PeerDistance distance_;
  bool streaming_ = false;  // how the last long piece was written
  char* sendRing_ = nullptr;
  char* recvRing_ = nullptr;
  // Local copies: this side is the only writer of sendHead_ and recvTail_; the caches hold the
  // peer's counters as last read.
  uint64_t sendHead_ = 0, sendTailCache_ = 0;
  uint64_t recvTail_ = 0, recvHeadCache_ = 0;
  std::deque<PendingSend> sends_;
  std::deque<PendingRecv> recvs_;
  std::atomic<bool> abortClaimed_{false};
  pid_t peerPid_ = 0;
  uint64_t peerStartTicks_ = 0;
  bool watchPid_ = false;
  bool stalled_ = false;
  std::chrono::steady_clock::time_point nextLivenessCheck_{};
};

// Owns what the handshake acquired; whatever is still owned when it ends (an exception) is
// released, and the creator's name unlinked.
struct HandshakeGuard {
  std::string name;
  bool unlinkName = false;
  int fd = -1;
  void* addr = MAP_FAILED;
  size_t bytes = 0;

  ~HandshakeGuard() {
    if (fd >= 0) ::close(fd);
    if (addr != MAP_FAILED) ::munmap(addr, bytes);
    if (unlinkName) ::shm_unlink(name.c_str());
  }
  void closeFd() {
    ::close(fd);
    fd = -1;
  }
  void* release() {
    void* a = addr;
    addr = MAP_FAILED;
    unlinkName = false;
    return a;
  }
};

std::string who(const ShmLinkOptions& o) {
  return "rank " + std::to_string(o.rank);
}

std::unique_ptr<Link> createSegment(const ShmLinkOptions& o, const Deadline& deadline) {
  HandshakeGuard g;
  g.name = o.name;
  g.fd = ::shm_open(o.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (g.fd < 0) {
    int err = errno;
    if (err == EEXIST)
      throw Error(makeMessage(who(o), " cannot create shm segment ", o.name, " for rank ", o.peer,
                              ": it already exists (left over by a crashed run with the same "
                              "session, or two groups chose the same name); remove /dev/shm",
                              o.name, " if no run uses it"));
    throw Error(sysError(makeMessage(who(o), " cannot create shm segment ", o.name), err));
  }
  // The name is ours from here on: every failure below unlinks it, nobody else would.
  g.unlinkName = true;
  g.bytes = segmentBytes(o.ringBytes);
  // Reserve the pages now: a full /dev/shm (64 MiB by default in Docker) then fails here with
  // a clear message instead of killing the process with SIGBUS at its first large message.
  int rc = ::posix_fallocate(g.fd, 0, static_cast<off_t>(g.bytes));
  if (rc == EOPNOTSUPP || rc == EINVAL)  // a file system without fallocate: size it at least
    rc = ::ftruncate(g.fd, static_cast<off_t>(g.bytes)) == 0 ? 0 : errno;
  if (rc != 0)
    throw Error(
        sysError(makeMessage(who(o), " cannot allocate ", g.bytes, " bytes of shared memory for ",
                             o.name, " (two rings of ", o.ringBytes,
                             " bytes; is /dev/shm too small? In Docker "
                             "raise --shm-size)"),
                 rc));
  g.addr = ::mmap(nullptr, g.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g.fd, 0);
  if (g.addr == MAP_FAILED)
    throw Error(sysError(makeMessage(who(o), " cannot map shm segment ", o.name), errno));
  g.closeFd();

  // The pages are zero (fresh tmpfs pages): every counter and state starts at 0.
  auto* ctl = new (g.addr) SegmentControl;
  ctl->version = kLayoutVersion;
  ctl->controlBytes = static_cast<uint32_t>(kControlBytes);
  ctl->ringBytes = o.ringBytes;
  std::memcpy(ctl->digest, o.authDigest.data(), kDigestBytes);
  fillSide(ctl->sides[0], o.rank);
  ctl->sides[0].state.store(kAttached, std::memory_order_relaxed);
  ctl->magic.store(kSegmentMagic, std::memory_order_release);

  SideBlock& opener = ctl->sides[1];
  for (;;) {
    uint32_t state = opener.state.load(std::memory_order_seq_cst);
    if (state == kAttached) break;
    if (state == kRefused || state == kAborted || state == kClosed)
      throw RemoteError(makeMessage("rank ", o.peer, " refused shm segment ", o.name, ": ",
                                    loadReason(opener.reason)));
    if (deadline.expired()) {
      // Tell an opener that arrives just now, so it fails instead of talking to nobody.
      std::string why =
          makeMessage(who(o), " gave up waiting for it after ", o.connectTimeoutSeconds, " s");
      storeReason(ctl->sides[0].reason, why);
      ctl->sides[0].state.store(kAborted, std::memory_order_seq_cst);
      throw CollectiveTimeout(
          makeMessage(who(o), " timed out after ", o.connectTimeoutSeconds, " s waiting for rank ",
                      o.peer, " to attach to shm segment ", o.name,
                      ": is that rank running on this host, and did it reach this point?"));
    }
    sleepPoll();
  }
  PC_INFO(kTransport, "shm link rank ", o.rank, " -> rank ", o.peer, ": created ", o.name,
          ", two rings of ", o.ringBytes, " bytes");
  auto link = std::make_unique<ShmLink>(o, g.addr, g.bytes, 0);
  g.release();  // the opener unlinked the name before it attached
  return link;
}

std::unique_ptr<Link> openSegment(const ShmLinkOptions& o, const Deadline& deadline) {
  HandshakeGuard g;
  g.name = o.name;
  auto timeout = [&](const char* what) {
    return CollectiveTimeout(makeMessage(who(o), " timed out after ", o.connectTimeoutSeconds,
                                         " s waiting for rank ", o.peer, " to ", what,
                                         " shm segment ", o.name,
                                         ": is that rank running on this host, and did it reach "
                                         "this point?"));
  };
  for (;;) {
    g.fd = ::shm_open(o.name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (g.fd >= 0) break;
    if (errno != ENOENT)
      throw Error(sysError(makeMessage(who(o), " cannot open shm segment ", o.name), errno));
    if (deadline.expired()) throw timeout("create");
    sleepPoll();
  }
  // The open descriptor keeps the segment alive: drop the name at once, so that no /dev/shm
  // entry outlives the handshake, whatever happens next to either process.
  ::shm_unlink(o.name.c_str());

  // The creator sizes the segment right after creating it, and stores the magic last.
  struct stat st;
  for (;;) {
    if (::fstat(g.fd, &st) != 0)
      throw Error(sysError(makeMessage(who(o), " cannot stat shm segment ", o.name), errno));
    if (static_cast<size_t>(st.st_size) >= kControlBytes) break;
    if (deadline.expired()) throw timeout("initialize");
    sleepPoll();
  }
  g.bytes = kControlBytes;
  g.addr = ::mmap(nullptr, g.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0);
  if (g.addr == MAP_FAILED)
    throw Error(sysError(makeMessage(who(o), " cannot map shm segment ", o.name), errno));
  auto* ctl = static_cast<SegmentControl*>(g.addr);
  while (ctl->magic.load(std::memory_order_acquire) != kSegmentMagic) {
    if (deadline.expired()) throw timeout("initialize");
    sleepPoll();
  }
  const uint64_t ringBytes = ctl->ringBytes;
  const size_t total = segmentBytes(static_cast<size_t>(ringBytes));
  if (::fstat(g.fd, &st) != 0)
    throw Error(sysError(makeMessage(who(o), " cannot stat shm segment ", o.name), errno));
  if (ctl->version != kLayoutVersion || ctl->controlBytes != kControlBytes ||
      ringBytes < kMinRingBytes || ringBytes % 64 != 0 || static_cast<size_t>(st.st_size) != total)
    throw Error(makeMessage(who(o), " cannot use shm segment ", o.name, ": layout version ",
                            ctl->version, " with rings of ", ringBytes, " bytes in ", st.st_size,
                            " bytes is not what this build of pycollective (version ",
                            kLayoutVersion, ") expects: do all ranks run the same installation?"));
  ::munmap(g.addr, g.bytes);
  g.addr = MAP_FAILED;
  g.bytes = total;
  g.addr = ::mmap(nullptr, g.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, g.fd, 0);
  if (g.addr == MAP_FAILED)
    throw Error(sysError(makeMessage(who(o), " cannot map shm segment ", o.name), errno));
  g.closeFd();
  ctl = static_cast<SegmentControl*>(g.addr);
  SideBlock& creator = ctl->sides[0];
  SideBlock& me = ctl->sides[1];

  auto refuse = [&](const std::string& why) {
    storeReason(me.reason, why);
    me.state.store(kRefused, std::memory_order_release);
    return Error(makeMessage(who(o), " refused shm segment ", o.name, ": ", why));
  };
  if (!sameDigest(ctl->digest, reinterpret_cast<const unsigned char*>(o.authDigest.data())))
    throw refuse(
        "its authentication digest differs from this rank's (the ranks were started "
        "with different cluster tokens, or the segment belongs to another cluster)");
  if (creator.rank != o.peer)
    throw refuse(makeMessage("it was created by rank ", creator.rank, ", expected rank ", o.peer));

  fillSide(me, o.rank);
  me.state.store(kAttached, std::memory_order_seq_cst);
  // The creator may have given up just before: it marks itself aborted first and then stops
  // looking, so seeing its state after ours (seq_cst on both sides) catches that race.
  if (creator.state.load(std::memory_order_seq_cst) != kAttached)
    throw RemoteError(makeMessage("rank ", o.peer, " abandoned shm segment ", o.name, ": ",
                                  loadReason(creator.reason)));
  if (ringBytes != o.ringBytes)
    PC_INFO(kTransport, "shm link rank ", o.rank, " -> rank ", o.peer,
            ": using the creator's rings of ", ringBytes, " bytes (asked for ", o.ringBytes, ")");
  PC_INFO(kTransport, "shm link rank ", o.rank, " -> rank ", o.peer, ": opened ", o.name);
  auto link = std::make_unique<ShmLink>(o, g.addr, g.bytes, 1);
  g.release();
  return link;
}

}  // namespace

std::unique_ptr<Link> connectShm(const ShmLinkOptions& options) {
  const ShmLinkOptions& o = options;
  PC_CHECK(o.name.size() >= 2 && o.name.size() <= 255 && o.name[0] == '/' &&
               o.name.find('/', 1) == std::string::npos,
           "shm segment name must be '/' followed by up to 254 characters without '/', got '",
           o.name, "'");
  PC_CHECK(o.authDigest.size() == kDigestBytes, "shm auth digest must be ", kDigestBytes,
           " bytes, got ", o.authDigest.size());
  PC_CHECK(o.ringBytes >= kMinRingBytes && o.ringBytes % 64 == 0,
           "shm ring size must be a multiple of 64 of at least ", kMinRingBytes, " bytes, got ",
           o.ringBytes);
  PC_CHECK(o.rank >= 0 && o.peer >= 0 && o.rank != o.peer, "shm link between ranks ", o.rank,
           " and ", o.peer);
  PC_CHECK(o.connectTimeoutSeconds > 0, "shm connect timeout must be positive, got ",
           o.connectTimeoutSeconds);
  Deadline deadline = Deadline::after(o.connectTimeoutSeconds);
  return o.create ? createSegment(o, deadline) : openSegment(o, deadline);
}

}  // namespace pycollective

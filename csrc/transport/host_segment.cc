#include "transport/host_segment.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "core/error.h"
#include "core/host_copy.h"
#include "core/knobs.h"
#include "core/logging.h"
#include "core/stream_copy.h"
#include "core/wait_policy.h"
#include "transport/cross_memory.h"
#include "transport/shm_common.h"

namespace pycollective {

// Segment layout (version 2), for M members and slots of S payload bytes:
//   [0, kControlBytes)                        Layout: magic, geometry, digest, abort count,
//                                              members that find the others far
//   [kControlBytes, +M * sizeof(MemberBlock))  one MemberBlock per member
//   [slotsAt, +2M * slotStride(S))             slot (m, s) at slotsAt + (2m + s) * slotStride:
//                                              SlotHead (call number and header), then payload
struct HostSegment::Layout {
  std::atomic<uint64_t> magic;  // stored last by the creator (release): the rest is initialized
  uint32_t version;
  uint32_t members;
  uint64_t slotBytes;
  unsigned char digest[shm::kDigestBytes];
  // Bumped by every member that aborts: a waiter reads this one word instead of every block.
  alignas(128) std::atomic<uint32_t> aborts;
  // Members whose waits find the others' cores far (voteDistance): while any does, every
  // member writes its slot past the cache, since every member reads every slot. On the
  // aborts' line: it changes only when the machine does.
  std::atomic<uint32_t> farMembers;
};

namespace {

constexpr uint64_t kSegmentMagic = 0x3154534843434f50ull;  // "POCCHST1"
constexpr uint32_t kLayoutVersion = 2;
constexpr size_t kControlBytes = 256;
static_assert(sizeof(HostSegment::Layout) <= kControlBytes, "the layout fits its bytes");
constexpr size_t kMaxSlotBytes = size_t(16) << 20;
constexpr auto kLivenessInterval = std::chrono::milliseconds(50);
constexpr auto kHandshakePoll = std::chrono::microseconds(500);

enum MemberState : uint32_t {
  kAbsent = 0,  // not attached yet (zero-filled segment)
  kAttached = 1,
  kClosed = 2,   // left normally (its group was destroyed)
  kAborted = 3,  // reason[] says why
  kRefused = 4,  // refused the segment, or gave up waiting for the others; reason[] says why
};

// The member's latest collective over links (announceLinkCall): its position and header.
struct alignas(64) LinkCallNotice {
  std::atomic<uint64_t> position;  // 0: none yet
  FrameHeader header;
};

struct alignas(128) MemberBlock {
  LinkCallNotice linkCall;
  std::atomic<uint32_t> state;
  int32_t pid;
  int32_t rank;
  uint32_t reserved;
  uint64_t startTicks;
  char reason[shm::kReasonBytes];
};

// The call number and header share one cache line, which the owner writes and the others read;
// the payload starts on the next line.
struct alignas(64) SlotHead {
  std::atomic<uint64_t> call;  // the owner's call count when it published (release)
  FrameHeader header;
};
static_assert(sizeof(SlotHead) == 64, "a slot's head is one cache line");

size_t slotStride(size_t slotBytes) {
  // A spare line after the payload keeps the next slot's head off the prefetched neighbour.
  return sizeof(SlotHead) + slotBytes + 64;
}
size_t slotsAt(size_t members) {
  return (kControlBytes + members * sizeof(MemberBlock) + 4095) & ~size_t(4095);
}
size_t segmentBytes(size_t members, size_t slotBytes) {
  return slotsAt(members) + 2 * members * slotStride(slotBytes);
}

MemberBlock* blocks(void* base) {
  return reinterpret_cast<MemberBlock*>(static_cast<char*>(base) + kControlBytes);
}
SlotHead* slotHead(void* base, size_t members, size_t slotBytes, int member, int slot) {
  return reinterpret_cast<SlotHead*>(static_cast<char*>(base) + slotsAt(members) +
                                     (2 * member + slot) * slotStride(slotBytes));
}

void sleepPoll() {
  std::this_thread::sleep_for(kHandshakePoll);
}

// Owns what the handshake acquired until the segment is built; the creator's name is unlinked
// if the handshake fails.
struct Acquired {
  std::string name;
  bool unlinkName = false;
  int fd = -1;
  void* addr = MAP_FAILED;
  size_t bytes = 0;
  ~Acquired() {
    if (fd >= 0) ::close(fd);
    if (addr != MAP_FAILED) ::munmap(addr, bytes);
    if (unlinkName) ::shm_unlink(name.c_str());
  }
};

std::string whoOf(const HostSegmentOptions& o) {
  return makeMessage("[rank ", o.ranks[o.member], "/", o.worldSize, "]");
}

void* mapShared(const HostSegmentOptions& o, int fd, size_t bytes) {
  void* addr = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (addr == MAP_FAILED)
    throw Error(
        shm::sysError(makeMessage(whoOf(o), " cannot map the host segment ", o.name), errno));
  return addr;
}

void create(const HostSegmentOptions& o, Acquired& a) {
  a.fd = ::shm_open(o.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (a.fd < 0) {
    const int err = errno;
    if (err == EEXIST)
      throw Error(makeMessage(whoOf(o), " cannot create the host segment ", o.name,
                              ": it already exists (left over by a crashed run with the same "
                              "session?); remove /dev/shm",
                              o.name, " if no run uses it"));
    throw Error(
        shm::sysError(makeMessage(whoOf(o), " cannot create the host segment ", o.name), err));
  }
  a.unlinkName = true;
  a.bytes = segmentBytes(o.ranks.size(), o.slotBytes);
  int rc = ::posix_fallocate(a.fd, 0, static_cast<off_t>(a.bytes));
  if (rc == EOPNOTSUPP || rc == EINVAL)
    rc = ::ftruncate(a.fd, static_cast<off_t>(a.bytes)) == 0 ? 0 : errno;
  if (rc != 0)
    throw Error(shm::sysError(makeMessage(whoOf(o), " cannot allocate ", a.bytes,
                                          " bytes of shared memory for the host segment ", o.name,
                                          " (is /dev/shm too small? In Docker raise --shm-size)"),
                              rc));
  a.addr = mapShared(o, a.fd, a.bytes);
  // Fresh tmpfs pages are zero: every state, call number and abort count starts at 0.
  auto* layout = new (a.addr) HostSegment::Layout;
  layout->version = kLayoutVersion;
  layout->members = static_cast<uint32_t>(o.ranks.size());
  layout->slotBytes = o.slotBytes;
  std::memcpy(layout->digest, o.authDigest.data(), shm::kDigestBytes);
  for (size_t m = 0; m < o.ranks.size(); ++m) new (&blocks(a.addr)[m]) MemberBlock;
  layout->magic.store(kSegmentMagic, std::memory_order_release);
}

void open(const HostSegmentOptions& o, Acquired& a, const Deadline& deadline) {
  auto timeout = [&](const char* what) {
    return CollectiveTimeout(
        makeMessage(whoOf(o), " timed out after ", o.connectTimeoutSeconds, " s waiting for rank ",
                    o.ranks[0], " to ", what, " the host segment ", o.name,
                    ": is that rank running on this host, and did it reach this point?"));
  };
  for (;;) {
    a.fd = ::shm_open(o.name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (a.fd >= 0) break;
    if (errno != ENOENT)
      throw Error(
          shm::sysError(makeMessage(whoOf(o), " cannot open the host segment ", o.name), errno));
    if (deadline.expired()) throw timeout("create");
    sleepPoll();
  }
  const size_t expected = segmentBytes(o.ranks.size(), o.slotBytes);
  struct stat st;
  for (;;) {
    if (::fstat(a.fd, &st) != 0)
      throw Error(
          shm::sysError(makeMessage(whoOf(o), " cannot stat the host segment ", o.name), errno));
    if (static_cast<size_t>(st.st_size) >= kControlBytes) break;
    if (deadline.expired()) throw timeout("initialize");
    sleepPoll();
  }
  if (static_cast<size_t>(st.st_size) != expected)
    throw Error(makeMessage(whoOf(o), " cannot use the host segment ", o.name, ": it has ",
                            st.st_size, " bytes where ", expected, " were expected for ",
                            o.ranks.size(), " members with slots of ", o.slotBytes,
                            " bytes: do all ranks run the same installation and settings?"));
  a.bytes = expected;
  a.addr = mapShared(o, a.fd, a.bytes);
  auto* layout = static_cast<HostSegment::Layout*>(a.addr);
  while (layout->magic.load(std::memory_order_acquire) != kSegmentMagic) {
    if (deadline.expired()) throw timeout("initialize");
    sleepPoll();
  }
  MemberBlock& me = blocks(a.addr)[o.member];
  auto refuse = [&](const std::string& why) {
    shm::storeReason(me.reason, why);
    me.state.store(kRefused, std::memory_order_release);
    return Error(makeMessage(whoOf(o), " refused the host segment ", o.name, ": ", why));
  };
  if (!shm::sameDigest(layout->digest, reinterpret_cast<const unsigned char*>(o.authDigest.data())))
    throw refuse(
        "its authentication digest differs from this rank's (the ranks were started with "
        "different cluster tokens, or the segment belongs to another cluster)");
  if (layout->version != kLayoutVersion || layout->members != o.ranks.size() ||
      layout->slotBytes != o.slotBytes)
    throw refuse(makeMessage("its layout (version ", layout->version, ", ", layout->members,
                             " members, slots of ", layout->slotBytes,
                             " bytes) is not this rank's: do all ranks run the same "
                             "installation and settings?"));
}

}  // namespace

std::unique_ptr<HostSegment> HostSegment::connect(const HostSegmentOptions& options) {
  const HostSegmentOptions& o = options;
  const int n = static_cast<int>(o.ranks.size());
  PC_CHECK(o.name.size() >= 2 && o.name.size() <= 255 && o.name[0] == '/' &&
               o.name.find('/', 1) == std::string::npos,
           "host segment name must be '/' followed by up to 254 characters without '/', got '",
           o.name, "'");
  PC_CHECK(n >= 2 && o.member >= 0 && o.member < n,
           "a host segment needs at least 2 members "
           "and this rank among them; got member ",
           o.member, " of ", n);
  PC_CHECK(std::is_sorted(o.ranks.begin(), o.ranks.end()) && o.ranks.front() >= 0 &&
               o.ranks.back() < o.worldSize,
           "host segment ranks must be ascending ranks of the world of ", o.worldSize);
  PC_CHECK(o.authDigest.size() == shm::kDigestBytes, "host segment digest must be ",
           shm::kDigestBytes, " bytes, got ", o.authDigest.size());
  PC_CHECK(o.slotBytes >= 64 && o.slotBytes <= kMaxSlotBytes && o.slotBytes % 64 == 0,
           "host segment slots must be a multiple of 64 bytes from 64 to ", kMaxSlotBytes, ", got ",
           o.slotBytes);
  PC_CHECK(o.connectTimeoutSeconds > 0, "host segment connect timeout must be positive, got ",
           o.connectTimeoutSeconds);
  const Deadline deadline = Deadline::after(o.connectTimeoutSeconds);
  Acquired a;
  a.name = o.name;
  if (o.member == 0)
    create(o, a);
  else
    open(o, a, deadline);
  ::close(a.fd);
  a.fd = -1;

  MemberBlock* all = blocks(a.addr);
  MemberBlock& me = all[o.member];
  me.pid = static_cast<int32_t>(::getpid());
  me.rank = o.ranks[o.member];
  me.startTicks = shm::ownStartTicks();
  me.state.store(kAttached, std::memory_order_seq_cst);
  // Every member waits for all: a group whose segment is not whole must not start.
  for (int m = 0; m < n; ++m) {
    for (;;) {
      // A member that attached may have aborted or left since (its first call failed): the
      // segment was whole, and the calls will report that failure.
      const uint32_t state = all[m].state.load(std::memory_order_seq_cst);
      if (state != kAbsent && state != kRefused) break;
      if (state == kRefused)
        throw RemoteError(makeMessage(whoOf(o), ": rank ", o.ranks[m],
                                      " refused or gave up the host segment ", o.name, ": ",
                                      shm::loadReason(all[m].reason)));
      if (deadline.expired()) {
        // Tell members that attach just now, so they fail instead of waiting for nobody.
        const std::string why = makeMessage(whoOf(o), " gave up waiting for rank ", o.ranks[m],
                                            " after ", o.connectTimeoutSeconds, " s");
        shm::storeReason(me.reason, why);
        me.state.store(kRefused, std::memory_order_seq_cst);
        throw CollectiveTimeout(makeMessage(
            whoOf(o), " timed out after ", o.connectTimeoutSeconds, " s waiting for rank ",
            o.ranks[m], " to attach to the host segment ", o.name,
            ": is that rank running on this host, and did it reach this point?"));
      }
      sleepPoll();
    }
  }
  // Every member has it mapped: the name is no longer needed (both may unlink; one succeeds).
  ::shm_unlink(o.name.c_str());
  a.unlinkName = false;
  PC_INFO(kTransport, whoOf(o), " host segment ", o.name, ": ", n, " members, slots of ",
          o.slotBytes, " bytes");
  std::unique_ptr<HostSegment> seg(new HostSegment(o, a.addr, a.bytes));
  a.addr = MAP_FAILED;
  seg->agreeOnReads(deadline);
  return seg;
}

HostSegment::HostSegment(const HostSegmentOptions& o, void* base, size_t mapBytes)
    : name_(o.name),
      ranks_(o.ranks),
      member_(o.member),
      worldSize_(o.worldSize),
      slotBytes_(o.slotBytes),
      base_(base),
      mapBytes_(mapBytes),
      layout_(static_cast<Layout*>(base)),
      timeWaits_(o.timeWaits) {
  spinSeconds_ = spinSecondsFor(members());
  const MemberBlock* all = blocks(base_);
  for (int m = 0; m < members(); ++m)
    watchPid_.push_back(m != member_ && shm::pidNamesPeer(all[m].pid, all[m].startTicks));
}

HostSegment::~HostSegment() {
  if (farVoted_) layout_->farMembers.fetch_sub(1, std::memory_order_relaxed);
  MemberBlock& me = blocks(base_)[member_];
  if (me.state.load(std::memory_order_acquire) != kAborted)
    me.state.store(kClosed, std::memory_order_release);
  ::munmap(base_, mapBytes_);
}

int HostSegment::pidOf(int member) const {
  return watchPid_[member] ? blocks(base_)[member].pid : -1;
}

void HostSegment::agreeOnReads(const Deadline& deadline) {
  const FrameHeader header;  // the same on every member: nothing to tell apart yet
  // Each member's word names its rank: a read of the wrong process or address shows.
  constexpr uint64_t kProbe = 0x7063636d61000000ull;  // "pccma"
  probeWord_ = kProbe ^ static_cast<uint64_t>(ranks_[member_]);
  bool ok = knobs::integer(knobs::kCrossMemory) != 0;
  std::string why = ok ? "" : "PYCOLLECTIVE_CROSS_MEMORY=0 here";
  // Before this member's offer: a peer reads it only after seeing that. Only 2 members ever
  // read each other's buffers (algorithms/staged.cc), so a larger host's ranks stay untraceable
  // under Yama (and agree that they do not read).
  const std::string yama = ok && members() == 2 ? cross_memory::letSiblingsRead() : "";
  if (!yama.empty()) PC_INFO(kTransport, who(), " host segment ", name_, ": ", yama);
  {
    Call offer(*this, header, deadline);
    auto* mine = static_cast<uint64_t*>(offer.payload());
    mine[0] = reinterpret_cast<uintptr_t>(&probeWord_);
    mine[1] = ok ? 1 : 0;
    offer.publish(2 * sizeof(uint64_t));
    for (int m = 0; m < members(); ++m) {
      if (m == member_) continue;
      const auto* theirs = static_cast<const uint64_t*>(offer.await(m, 2 * sizeof(uint64_t)));
      if (!ok) continue;
      if (theirs[1] == 0) {
        why = makeMessage("rank ", ranks_[m], " has PYCOLLECTIVE_CROSS_MEMORY=0");
      } else if (pidOf(m) < 0) {
        why = makeMessage("rank ", ranks_[m], " runs in another pid namespace");
      } else {
        uint64_t word = 0;
        const int err = cross_memory::read(pidOf(m), reinterpret_cast<const void*>(theirs[0]),
                                           &word, sizeof(word));
        if (err == 0 && word == (kProbe ^ static_cast<uint64_t>(ranks_[m]))) continue;
        why = makeMessage("reading rank ", ranks_[m], " (pid ", pidOf(m),
                          ") failed: ", err != 0 ? std::strerror(err) : "another word came back",
                          yama.empty() ? "" : " (" + yama + ")");
      }
      ok = false;
    }
  }
  {
    Call verdict(*this, header, deadline);
    *static_cast<uint64_t*>(verdict.payload()) = ok ? 1 : 0;
    verdict.publish(sizeof(uint64_t));
    for (int m = 0; m < members(); ++m) {
      if (m == member_) continue;
      const bool theirs = *static_cast<const uint64_t*>(verdict.await(m, sizeof(uint64_t))) != 0;
      if (ok && !theirs) why = makeMessage("rank ", ranks_[m], " could not read another member");
      ok = ok && theirs;
    }
  }
  readsEachOther_ = ok;
  PC_INFO(kTransport, who(), " host segment ", name_, ": members ",
          ok ? "read each other's buffers directly (process_vm_readv)"
             : "copy through the segment: " + why);
}

bool HostSegment::streamsPayloads() const {
  return layout_->farMembers.load(std::memory_order_relaxed) > 0;
}

void HostSegment::addDistanceSample(double ns) {
  distance_.addSample(ns);
  voteDistance();
}

void HostSegment::fixDistance(double ns) {
  timeWaits_ = false;
  for (int i = 0; i < PeerDistance::kWindow; ++i) addDistanceSample(ns);
}

void HostSegment::voteDistance() {
  const bool far = distance_.far();
  if (far == farVoted_) return;
  farVoted_ = far;
  if (far)
    layout_->farMembers.fetch_add(1, std::memory_order_relaxed);
  else
    layout_->farMembers.fetch_sub(1, std::memory_order_relaxed);
}

std::string HostSegment::who() const {
  return makeMessage("[rank ", ranks_[member_], "/", worldSize_, "]");
}

void HostSegment::abort(const std::string& reason) noexcept {
  bool first = false;
  if (!abortClaimed_.compare_exchange_strong(first, true)) return;
  MemberBlock& me = blocks(base_)[member_];
  // The reason goes first, then the state (release): waiters read them in the other order.
  shm::storeReason(me.reason, reason);
  me.state.store(kAborted, std::memory_order_release);
  layout_->aborts.fetch_add(1, std::memory_order_release);
}

void HostSegment::fail(int member, const std::string& what, const FrameHeader& call) {
  const MemberBlock& b = blocks(base_)[member];
  const std::string reason = shm::loadReason(b.reason);
  if (member == member_)
    throw Aborted(makeMessage(who(), " ", describeCall(call), " aborted: ", reason));
  throw RemoteError(makeMessage("rank ", ranks_[member], " ", what, " while rank ", ranks_[member_],
                                " waited for it in ", describeCall(call), " on the host segment ",
                                name_, reason.empty() ? "" : ": ", reason));
}

// Throws for the first member (this one first) that aborted.
void HostSegment::checkPeers(int waitingFor, const FrameHeader& call) {
  const MemberBlock* all = blocks(base_);
  if (all[member_].state.load(std::memory_order_acquire) == kAborted) fail(member_, "", call);
  if (all[waitingFor].state.load(std::memory_order_acquire) == kAborted)
    fail(waitingFor, "aborted", call);
  for (int m = 0; m < members(); ++m)
    if (all[m].state.load(std::memory_order_acquire) == kAborted) fail(m, "aborted", call);
}

void HostSegment::announceLinkCall(const FrameHeader& header) {
  LinkCallNotice& notice = blocks(base_)[member_].linkCall;
  notice.header = header;
  notice.position.store(++position_, std::memory_order_release);
}

// Throws ProtocolError when `member` runs, over links, the collective at `position` that this
// member runs on the segment.
void HostSegment::checkLinkCall(int member, uint64_t position, const FrameHeader& call) {
  LinkCallNotice& notice = blocks(base_)[member].linkCall;
  if (notice.position.load(std::memory_order_acquire) != position) return;
  const FrameHeader theirs = notice.header;
  // The member may be past that call already, writing its next notice: then the copy may be
  // torn, and the mismatch (which the position proves) is reported without its header.
  std::atomic_thread_fence(std::memory_order_acquire);
  const bool intact = notice.position.load(std::memory_order_relaxed) == position;
  const std::string error = makeMessage(
      "rank ", ranks_[member_], " runs ", describeCall(call), " on the host segment where rank ",
      ranks_[member], " runs ", intact ? describeCall(theirs) : std::string("a collective"),
      " over links",
      intact ? ": " + headerMismatch(call, theirs) : std::string(" (it moved on since)"),
      ". Every rank must call the same collectives, in the same order, with the same "
      "arguments.");
  abort(error);
  throw ProtocolError(error);
}

HostSegment::Call::Call(HostSegment& segment, const FrameHeader& header, const Deadline& deadline)
    : seg_(segment),
      header_(header),
      deadline_(deadline),
      call_(++segment.calls_),
      position_(++segment.position_) {
  slot_ = static_cast<int>(call_ & 1);
  header_.step = 0;
}

void* HostSegment::Call::payload() {
  return reinterpret_cast<char*>(
             slotHead(seg_.base_, seg_.members(), seg_.slotBytes_, seg_.member_, slot_)) +
         sizeof(SlotHead);
}

void HostSegment::Call::write(const void* src, size_t bytes) {
  PC_ASSERT(bytes <= seg_.slotBytes_, "host segment payload of ", bytes, " bytes");
  (seg_.streams(bytes) ? streamCopy : hostCopy)(payload(), src, bytes);
}

bool HostSegment::streams(size_t bytes) {
  if (bytes < kMinStreamedBytes) return false;
  const bool stream = streamsPayloads();
  if (stream != streaming_) {
    streaming_ = stream;
    PC_INFO(kTransport, who(), " host segment ", name_, ": ",
            layout_->farMembers.load(std::memory_order_relaxed), " of ", members(),
            " members find the others' cores far (this one: a cache line takes ",
            distance_.nanoseconds(), " ns); payloads of ", kMinStreamedBytes,
            " bytes and more now go ",
            stream ? "past the cache (streaming stores)" : "through the cache");
  }
  return stream;
}

void HostSegment::Call::publish(size_t bytes) {
  PC_ASSERT(bytes <= seg_.slotBytes_, "host segment payload of ", bytes, " bytes");
  SlotHead* head = slotHead(seg_.base_, seg_.members(), seg_.slotBytes_, seg_.member_, slot_);
  head->header = header_;
  head->header.bytes = bytes;
  head->call.store(call_, std::memory_order_release);
}

const void* HostSegment::Call::await(int member, size_t bytes) {
  HostSegment& s = seg_;
  SlotHead* head = slotHead(s.base_, s.members(), s.slotBytes_, member, slot_);
  // The load that sees the member's publish fetched the line from its core: its time is how far
  // that core is (write() decides by it). The first load counts as well when it already finds
  // the call published: the member wrote the line since this one last read it (two calls ago,
  // when the slot showed call_ - 2; a timed call is the 4th or later). A member that always
  // arrives last would otherwise never time a load again, and a far vote left from an earlier
  // phase kept every member streaming, 3-13% slower with the cores near.
  static_assert(kTimedCallEvery >= 2, "a timed call's slot must have held an earlier call");
  const bool timed = s.timeWaits_ && call_ % kTimedCallEvery == 0;
  const uint64_t before =
      timed ? s.distance_.load(head->call, call_ - 2) : head->call.load(std::memory_order_acquire);
  if (before != call_) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point since = Clock::now();
    Clock::time_point nextLiveness = since + kLivenessInterval;
    for (uint32_t round = 1;; ++round) {
      const uint64_t c =
          timed ? s.distance_.load(head->call, before) : head->call.load(std::memory_order_acquire);
      if (c == call_) break;
      // What a member published before it aborted (in its next call) is still read: the call
      // number is loaded again after the abort was seen.
      if (s.layout_->aborts.load(std::memory_order_acquire) != 0) {
        if (head->call.load(std::memory_order_acquire) == call_) break;
        s.checkPeers(member, header_);
      }
      // A member at most one call behind still shows the call before (or none); any other
      // number means the members' calls on the segment went out of step.
      if (c > call_)
        throw InternalError(makeMessage(s.who(), " rank ", s.ranks_[member], " is at call ", c,
                                        " of the host segment where this rank is at ", call_));
      const Clock::time_point now = Clock::now();
      const double idle = std::chrono::duration<double>(now - since).count();
      if (deadline_.expired())
        throw CollectiveTimeout(makeMessage(
            s.who(), " ", describeCall(header_), " timed out after ", deadline_.totalSeconds(),
            " s waiting for rank ", s.ranks_[member], " on the host segment ", s.name_,
            " (it finished ", c, " of its calls there, this rank is at call ", call_,
            "). Every rank must call the same collectives in the same order; raise "
            "PYCOLLECTIVE_TIMEOUT (or timeout=) if ranks are legitimately slow."));
      if (now >= nextLiveness) {
        nextLiveness = now + kLivenessInterval;
        s.checkLinkCall(member, position_, header_);
        const MemberBlock& b = blocks(s.base_)[member];
        if (b.state.load(std::memory_order_acquire) == kClosed) {
          if (head->call.load(std::memory_order_acquire) == call_) break;
          s.fail(member, "left the group (closed its host segment)", header_);
        }
        if (s.watchPid_[member] && shm::processDied(b.pid, b.startTicks))
          throw RemoteError(makeMessage("rank ", s.ranks_[member], " (pid ", b.pid,
                                        ") died while rank ", s.ranks_[s.member_],
                                        " waited for it in ", describeCall(header_),
                                        " over shm (host segment ", s.name_, ")"));
      }
      // Spin, yield, then sleep (core/wait_policy.h), as a wait on shm links does.
      if (idle < s.spinSeconds_) {
        cpuRelax();
      } else if (idle < kPollingYieldSeconds) {
        ::sched_yield();
      } else {
        std::this_thread::sleep_for(sleepPause(idle));
      }
    }
  }
  if (timed) s.voteDistance();
  FrameHeader expected = header_;
  expected.bytes = bytes;
  const std::string error =
      frameError(s.ranks_[s.member_], s.ranks_[member], expected, head->header, bytes);
  if (!error.empty()) {
    s.abort(error);
    throw ProtocolError(error);
  }
  return reinterpret_cast<const char*>(head) + sizeof(SlotHead);
}

}  // namespace pycollective

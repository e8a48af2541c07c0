#pragma once
// One POSIX shared-memory segment for all ranks of a group on one host, for small collectives
// (algorithms/slots.cc) and large ones in pieces (algorithms/staged.cc). Each member owns
// two slots (a call header and a payload each); a call writes this member's slot and reads
// everyone else's, so a small allreduce is one write and one wait instead of log2(n) rounds of
// point-to-point messages, each of which needs the peer to be running.
//
// Calls alternate between the two slots. A member may write a slot again only two calls later,
// and by then every member has read it: to finish call k a member waits until every member has
// published call k, which each did only after it finished call k - 1. So no call needs more
// synchronisation than the wait for its peers' data.
//
// Every published slot carries the call's FrameHeader, checked like a frame on a link, so
// ranks that called different collectives fail with ProtocolError, naming both calls. A member
// that aborts leaves its reason in the segment; one that dies without saying so is noticed by
// its pid, as the shm links do.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "transport/frame.h"
#include "transport/peer_distance.h"

namespace pycollective {

struct HostSegmentOptions {
  // POSIX shm name, unique per group and host ("/pycol-<session>-h<first rank>").
  std::string name;
  // Global ranks of the members, ascending; member 0 creates the segment (O_CREAT|O_EXCL, mode
  // 0600) and the others open it.
  std::vector<int> ranks;
  int member = -1;         // this rank's index in `ranks`
  int worldSize = 0;       // for messages ("[rank 3/8]")
  std::string authDigest;  // 32 bytes from the cluster token (see ShmLinkOptions::authDigest)
  size_t slotBytes = size_t(16) << 10;  // payload capacity of a slot: a multiple of 64
  double connectTimeoutSeconds = 30.0;
  // Whether waits time the load that sees a slot published (kTimedCallEvery), for the distance
  // that decides how payloads are written; a test that feeds the distance itself turns it off.
  bool timeWaits = true;
};

class HostSegment {
 public:
  // Blocks until every member attached, or throws (CollectiveTimeout, InvalidArgument, Error,
  // RemoteError when a member refused the segment). The name is unlinked once all attached,
  // and on every failure of the creator.
  static std::unique_ptr<HostSegment> connect(const HostSegmentOptions& options);
  ~HostSegment();  // marks this member closed (unless it aborted) and unmaps

  int member() const { return member_; }
  int members() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }
  size_t slotBytes() const { return slotBytes_; }
  const std::string& name() const { return name_; }
  // Calls this member made on the segment so far.
  uint64_t calls() const { return calls_; }

  // Whether every member can read every other member's memory (transport/cross_memory.h),
  // as the members agreed when they connected: in two calls of the segment, each reading a word
  // of every other member's. False where a member has PYCOLLECTIVE_CROSS_MEMORY=0, sits in
  // another pid namespace, or the kernel refuses a read (Yama past scope 1, seccomp).
  bool membersReadEachOther() const { return readsEachOther_; }
  // The process of `member` as this one names it; -1 where another pid namespace hides it.
  int pidOf(int member) const;

  // Fails every present and future call of every member, with this reason. Never throws.
  void abort(const std::string& reason) noexcept;

  // Said by a member before it runs a collective of the segment's ranks over links instead
  // (a larger call): a member waiting in a segment call at the same position then fails with
  // ProtocolError naming both calls, rather than both waiting until their timeouts.
  void announceLinkCall(const FrameHeader& header);

  // Whether payloads of kMinStreamedBytes and more are written past the cache now: while any
  // member's waits find the others' cores far (Call::write).
  bool streamsPayloads() const;
  // Whether `bytes` that another member will read should be written past the cache now (they
  // are kMinStreamedBytes or more, and streamsPayloads()); a change is logged. Call::write
  // asks it, as do algorithms that write what the others read elsewhere (staged: parts of a
  // slot, and outputs the other reads directly).
  bool streams(size_t bytes);
  // Counts a timed load as a wait does, and this member's vote with it (for the test).
  void addDistanceSample(double ns);
  // For tests across processes: this member's waits stop timing loads and its distance becomes
  // `ns` (a full window of it), so that its vote stays what the test says. Between calls only.
  void fixDistance(double ns);
  // How far this member's timed loads find the others' cores, in nanoseconds (PeerDistance).
  double distanceNanoseconds() const { return distance_.nanoseconds(); }

  // One collective on the segment. Every member makes the same calls in the same order.
  class Call {
   public:
    // `header` describes the call (its bytes field is set per slot by publish); waits are
    // bounded by `deadline`.
    Call(HostSegment& segment, const FrameHeader& header, const Deadline& deadline);

    // This member's payload area for the call: slotBytes() bytes, 64-byte aligned.
    void* payload();
    // Copies this member's payload into payload(): with streaming stores, past this core's
    // cache, while any member finds the others' cores far and it is kMinStreamedBytes or more.
    void write(const void* src, size_t bytes);
    // Makes the first `bytes` of payload() and the call's header visible to the others.
    void publish(size_t bytes);
    // Waits until `member` published this call, checks its header (it must have published
    // `bytes`) and returns its payload, valid until this member's next call. Throws
    // ProtocolError (another call), RemoteError (the member aborted, left or died),
    // CollectiveTimeout, Aborted (this member aborted meanwhile).
    const void* await(int member, size_t bytes);

   private:
    HostSegment& seg_;
    FrameHeader header_;
    const Deadline& deadline_;
    uint64_t call_;      // this member's call count on the segment (picks the slot)
    uint64_t position_;  // collectives of the segment's ranks so far, link calls included
    int slot_;
  };

  // The segment's first bytes (defined in host_segment.cc, where the layout is described).
  struct Layout;

  // Every member reads every other member's slot. Where their cores pass cache lines slowly
  // (transport/peer_distance.h: the 2-vCPU VM's far phase, other chiplets or sockets), a slot
  // written through the cache is fetched line by line from the writer's core, and one written
  // past it is read from memory, faster from this size up. Far apart, streaming: 3 ranks x 2 KiB
  // 10.1-10.5 us against 11.3-11.4, 8 KiB 12.1-12.5 against 18.5-18.8, 16 KiB 14.8-15.0 against
  // 27.6-27.7; 2 ranks x 8 KiB 4.0 against 7.1. Near, streaming is slower (2 ranks 12-20% at
  // 1-8 KiB, 3 ranks 3-13%): the distance decides (docs/benchmarks-log.md, "The host segment far
  // apart").
  static constexpr size_t kMinStreamedBytes = size_t(2) << 10;
  // Every this many calls the waits for the others' slots time the load that sees a slot
  // published (PeerDistance::load): the fences would otherwise slow every wait a little.
  static constexpr uint64_t kTimedCallEvery = 4;
  // Which of PeerDistance's 8 samples, from the fastest, decides: the 6th. With more members
  // than cores a member often waits for one that then runs on its own core, and that load takes
  // 20-30 ns however far the cores are (3 ranks far apart: windows of 20-30 ns alongside others
  // of 100-150); the 6th still ignores two slow outliers (an interrupt in the timed load).
  static constexpr int kDecidingSample = 5;

 private:
  HostSegment(const HostSegmentOptions& options, void* base, size_t mapBytes);
  // Every member, once all attached: sets readsEachOther_ (membersReadEachOther()).
  void agreeOnReads(const Deadline& deadline);
  [[noreturn]] void fail(int member, const std::string& what, const FrameHeader& call);
  void checkPeers(int waitingFor, const FrameHeader& call);
  void checkLinkCall(int member, uint64_t position, const FrameHeader& call);
  std::string who() const;
  // Counts this member in Layout::farMembers while its waits find the others far.
  void voteDistance();

  std::string name_;
  std::vector<int> ranks_;
  int member_;
  int worldSize_;
  size_t slotBytes_;
  void* base_;
  size_t mapBytes_;
  Layout* layout_;
  uint64_t calls_ = 0;     // calls this member made on the segment
  uint64_t position_ = 0;  // collectives of the members this member made, on links too
  double spinSeconds_;     // how long a wait spins before it yields the core
  PeerDistance distance_{kDecidingSample};  // how far the others' cores are, from the waits
  bool timeWaits_;                          // HostSegmentOptions::timeWaits
  bool farVoted_ = false;                   // counted in Layout::farMembers
  bool streaming_ = false;                  // how the last long payload was written
  std::vector<bool> watchPid_;
  bool readsEachOther_ = false;  // membersReadEachOther()
  uint64_t probeWord_ = 0;       // the word the others read to find out
  std::atomic<bool> abortClaimed_{false};
};

}  // namespace pycollective

#include "comm/communicator.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/knobs.h"
#include "core/params.h"
#include "core/thread_pool.h"
#include "core/wait_policy.h"
#include "transport/notifier.h"

namespace pycollective {

Communicator::Communicator(int rank, int size, std::vector<std::unique_ptr<Link>> links,
                           std::vector<int> hostOf, double timeoutSeconds)
    : rank_(rank),
      size_(size),
      links_(std::move(links)),
      hostOf_(std::move(hostOf)),
      timeoutSeconds_(timeoutSeconds) {
  PC_CHECK(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " out of range for size ", size);
  PC_CHECK(static_cast<int>(links_.size()) == size, "expected ", size, " links, got ",
           links_.size());
  if (hostOf_.empty()) hostOf_.assign(size, 0);
  PC_CHECK(static_cast<int>(hostOf_.size()) == size, "host table has ", hostOf_.size(),
           " entries for ", size, " ranks");
  const int onMyHost = static_cast<int>(std::count(hostOf_.begin(), hostOf_.end(), hostOf_[rank]));
  const int cores = hostCores();
  modelCores_ = cores;
  reduceThreads_ =
      params::reduceThreads() > 0 ? params::reduceThreads() : std::max(1, cores / onMyHost);
  spinSeconds_ = spinSecondsFor(onMyHost);
  autoTrials_ = static_cast<int>(knobs::integer(knobs::kAutoTrials));
}

Communicator::~Communicator() = default;

void Communicator::setCosts(const LinkCost& local, const LinkCost& remote) {
  localCost_ = local;
  remoteCost_ = remote;
  autoChoices_.forget();
}

void Communicator::setModelCores(int cores) {
  modelCores_ = cores;
  autoChoices_.forget();
}

void Communicator::setCacheBytes(double bytes) {
  cacheBytes_ = bytes;
  autoChoices_.forget();
}

void Communicator::setHierarchicalGroupSize(int size) {
  hierarchicalGroupSize_ = size;
  autoChoices_.forget();
}

void Communicator::setTuned(std::vector<TunedChoice> table) {
  tuned_ = std::move(table);
  autoChoices_.forget();
}

Link& Communicator::link(int peer) {
  PC_ASSERT(peer >= 0 && peer < size_ && peer != rank_ && links_[peer], "bad peer ", peer);
  return *links_[peer];
}

uint64_t Communicator::nextSeq(int groupId) {
  std::lock_guard<std::mutex> lock(seqMu_);
  return seq_[groupId]++;
}

std::string Communicator::who() const {
  return "[rank " + std::to_string(rank_) + "/" + std::to_string(size_) + "]";
}

void Communicator::abort(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(abortMu_);
    if (abortReason_.empty()) abortReason_ = reason;
  }
  aborted_.store(true);
  for (auto& l : links_)
    if (l) l->abort(reason);
  if (hostSegment_) hostSegment_->abort(reason);
}

void Communicator::setHostSegment(std::unique_ptr<HostSegment> segment) {
  if (segment) {
    const auto& ranks = segment->ranks();
    PC_CHECK(segment->member() >= 0 && ranks[segment->member()] == rank_, who(),
             " the host segment's member ", segment->member(), " is not this rank");
    for (int r : ranks)
      PC_CHECK(r >= 0 && r < size_ && hostOf_[r] == hostOf_[rank_], who(), " rank ", r,
               " of the host segment is not on this rank's host");
  }
  hostSegment_ = std::move(segment);
  autoChoices_.forget();
}

std::string Communicator::abortReason() {
  std::lock_guard<std::mutex> lock(abortMu_);
  return abortReason_;
}

void* Communicator::deviceScratch(int slot, size_t bytes, int device) {
  if (static_cast<int>(deviceScratch_.size()) <= slot) deviceScratch_.resize(slot + 1);
  cuda::DeviceBuffer& b = deviceScratch_[slot];
  if (b.get() == nullptr || b.bytes() < bytes || b.device() != device) {
    b = cuda::DeviceBuffer();  // free first: the old buffer may be most of the device
    b = cuda::DeviceBuffer(bytes, device);
  }
  return b.get();
}

void* Communicator::scratch(int slot, size_t bytes) {
  if (static_cast<int>(scratch_.size()) <= slot) {
    scratch_.resize(slot + 1);
    scratchBytes_.resize(slot + 1, 0);
  }
  if (scratchBytes_[slot] < bytes) {
    // 64-byte aligned (vector loads) by over-allocating.
    scratch_[slot].reset(new char[bytes + 64]);
    scratchBytes_[slot] = bytes;
  }
  auto addr = reinterpret_cast<uintptr_t>(scratch_[slot].get());
  return reinterpret_cast<void*>((addr + 63) & ~uintptr_t(63));
}

void Communicator::waitAll(const std::vector<Pending>& pending, const std::vector<Link*>& advance,
                           const Deadline& deadline, const FrameHeader& call) {
  // The links to advance: `advance` itself when it has every pending request's link (an
  // exchange's active links always do), so a small call's wait allocates nothing.
  std::vector<Link*> merged;
  for (const auto& p : pending) {
    if (std::find(advance.begin(), advance.end(), p.link) != advance.end()) continue;
    if (merged.empty()) merged = advance;
    if (std::find(merged.begin(), merged.end(), p.link) == merged.end()) merged.push_back(p.link);
  }
  const std::vector<Link*>& links = merged.empty() ? advance : merged;
  Notifier* bell = nullptr;
  bool allNotify = !links.empty(), allSockets = !links.empty();
  for (Link* l : links) {
    if (l->notifier() == nullptr)
      allNotify = false;
    else
      bell = l->notifier();
    if (l->pollFd() < 0) allSockets = false;
  }
  std::vector<pollfd> fds;

  int idleRounds = 0;
  std::chrono::steady_clock::time_point idleSince;
  for (;;) {
    uint64_t seen = bell != nullptr ? bell->generation() : 0;
    bool moved = false;
    for (Link* l : links) moved |= l->progress();
    bool done = std::all_of(pending.begin(), pending.end(), [](const Pending& p) {
      return p.request->done.load(std::memory_order_acquire);
    });
    if (done) return;
    if (aborted_.load())
      throw Aborted(who() + " " + describeCall(call) + " aborted: " + abortReason());
    if (moved) {
      idleRounds = 0;
      continue;
    }
    if (deadline.expired()) {
      const Pending* stuck = nullptr;
      for (const auto& p : pending)
        if (!p.request->done.load()) {
          stuck = &p;
          break;
        }
      throw CollectiveTimeout(
          makeMessage(who(), " ", describeCall(call), " timed out after ", deadline.totalSeconds(),
                      " s waiting for rank ", stuck->peer,
                      stuck->isSend ? " to receive" : " to send", " over ", stuck->link->describe(),
                      ". Every rank must call the same collectives in the same order; raise "
                      "PYCOLLECTIVE_TIMEOUT (or timeout=) if ranks are legitimately slow."));
    }
    // Spin, yield, then sleep (core/wait_policy.h): on the doorbell, in poll() for sockets, or
    // with a growing pause for links that can do neither (shared memory), which yield longer.
    if (idleRounds++ == 0) idleSince = std::chrono::steady_clock::now();
    const double idle =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - idleSince).count();
    const double yieldFor = (allNotify || allSockets) ? 100e-6 : kPollingYieldSeconds;
    if (idle < spinSeconds_) {
      cpuRelax();
    } else if (idle < yieldFor) {
      std::this_thread::yield();
    } else if (allNotify) {
      bell->waitPast(seen, std::chrono::milliseconds(5));
    } else if (allSockets) {
      // Sleep in the kernel until a socket is ready (bounded, to re-check abort and deadline).
      fds.clear();
      for (Link* l : links)
        if (l->pollEvents() != 0) fds.push_back(pollfd{l->pollFd(), l->pollEvents(), 0});
      ::poll(fds.data(), fds.size(), 5);
    } else {
      const auto pause = sleepPause(idle);
      if (bell != nullptr)
        bell->waitPast(seen, pause);
      else
        std::this_thread::sleep_for(pause);
    }
  }
}

Group::Group(Communicator& comm, std::vector<int> members)
    : comm_(comm), members_(std::move(members)), myIndex_(-1) {
  for (size_t i = 0; i < members_.size(); ++i)
    if (members_[i] == comm.rank()) myIndex_ = static_cast<int>(i);
  PC_ASSERT(myIndex_ >= 0, "rank ", comm.rank(), " is not a member of the group");
}

Group Group::world(Communicator& comm) {
  std::vector<int> all(comm.size());
  for (int i = 0; i < comm.size(); ++i) all[i] = i;
  return Group(comm, std::move(all));
}

}  // namespace pycollective

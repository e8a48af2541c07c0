#pragma once
// The native object behind a process group or one replica of a LocalCommunicator: who this rank
// is, one Link per peer, where each peer lives (host), the timeout, the abort flag and the
// sequence counter that stamps every collective.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/agreed_choice.h"
#include "comm/choice_memo.h"
#include "comm/executor.h"
#include "core/deadline.h"
#include "cuda/device_ops.h"
#include "transport/host_segment.h"
#include "transport/link.h"

namespace pycollective {

// The alpha-beta-gamma model of one kind of link, used by algo="auto":
// time(message of b bytes) = alpha + b * beta; reducing b bytes costs b * gamma.
struct LinkCost {
  double alpha = 5e-6;       // seconds per message
  double beta = 1.0 / 5e9;   // seconds per byte moved
  double gamma = 1.0 / 8e9;  // seconds per byte reduced
  // Whether the sender copies each byte in and the receiver copies it out (a ring in shared
  // memory, a loopback socket: links between processes of one host), rather than the receiver
  // alone (in-process links) or a wire setting the pace (other hosts). beta prices an
  // exchange, in which each rank makes both copies; a one-way transfer runs its two copies on
  // two cores (link_load.h, oneWaySeconds).
  bool bothSidesCopy = false;
};

// The cost model's cache line for groups across processes, which every rank must share: the
// 32 MiB of L3 this project's first (EPYC) VM kept. (sysconf's L3 size there is the whole
// socket's 256 MiB, which no VM gets, so it is not asked.)
constexpr double kCacheResidentBytes = 32 << 20;

// A measured winner written by `pycollective tune`: for calls of `kind` on the whole group of up
// to maxBytes per rank (and above the previous entry's maxBytes), run `algo`.
struct TunedChoice {
  int kind;
  size_t maxBytes;
  std::string algo;
};

// A message waited for: used to name the peer and link in timeout messages.
struct Pending {
  Link* link;
  RequestPtr request;
  int peer;  // global rank
  bool isSend;
};

class Communicator {
 public:
  // links[peer] is nullptr for this rank. hostOf[r] groups ranks by host (hierarchical).
  Communicator(int rank, int size, std::vector<std::unique_ptr<Link>> links,
               std::vector<int> hostOf, double timeoutSeconds);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  Link& link(int peer);
  // False for this rank and for a communicator made for the cost model alone (no links).
  bool hasLink(int peer) const { return peer >= 0 && peer < size_ && links_[peer] != nullptr; }
  const std::vector<int>& hostOf() const { return hostOf_; }
  double timeoutSeconds() const { return timeoutSeconds_; }
  // Threads one large host reduction of this rank may use: the cores left to it by the other
  // ranks on its host (PYCOLLECTIVE_REDUCE_THREADS overrides).
  int reduceThreads() const { return reduceThreads_; }
  void setTimeoutSeconds(double s) { timeoutSeconds_ = s; }

  // Costs of links between ranks on the same host / different hosts.
  const LinkCost& localCost() const { return localCost_; }
  const LinkCost& remoteCost() const { return remoteCost_; }
  void setCosts(const LinkCost& local, const LinkCost& remote);
  // Cores per host as the cost model shares them among ranks (algorithms/shared_cores.h):
  // this host's (hostCores()) unless set; 0 leaves cores out of the model, for groups whose link
  // costs already price threads that share cores (in-process replicas, local/local_group.cc).
  int modelCores() const { return modelCores_; }
  void setModelCores(int cores);
  // Bytes a call may read and write in all and still be in cache on its next run, as the cost
  // model counts it (algorithms/cache_model.h): kCacheResidentBytes unless set (in-process
  // groups set what core/cache_probe.h measured; every rank of a process group must agree).
  double cacheBytes() const { return cacheBytes_; }
  void setCacheBytes(double bytes);
  // Ranks per hierarchical group when the host layout does not say (in-process replicas);
  // 0 = derive from hostOf.
  int hierarchicalGroupSize() const { return hierarchicalGroupSize_; }
  void setHierarchicalGroupSize(int size);
  // Measured choices for algo="auto" on this group (sorted by maxBytes); the cost model decides
  // where the table says nothing.
  const std::vector<TunedChoice>& tuned() const { return tuned_; }
  void setTuned(std::vector<TunedChoice> table);
  // auto's decisions so far; the setters above empty it, since they change what auto decides.
  ChoiceMemo& autoChoices() const { return autoChoices_; }
  // auto's measured choices where the model prices a near tie (comm/agreed_choice.h), and the
  // counted calls each candidate's trial takes (PYCOLLECTIVE_AUTO_TRIALS when the communicator
  // was made; 0: the model's choice alone). A LocalGroup sets 0 on its replicas' communicators:
  // it measures for all of them at once (local/measured_choice.h).
  AgreedChoices& agreedChoices() const { return agreedChoices_; }
  int autoTrials() const { return autoTrials_; }
  void setAutoTrials(int calls) { autoTrials_ = calls; }

  // Sequence number of the next collective of group `groupId` (0 = all ranks).
  uint64_t nextSeq(int groupId = 0);

  // Waits until every request in `waitFor` completed, advancing every link in `advance` (a
  // sender may need its outgoing links pushed while it waits for a receive). Throws
  // CollectiveTimeout (naming the call, the peer and the link), Aborted, RemoteError,
  // ProtocolError. `call` is the header of the collective waited for (for messages only).
  void waitAll(const std::vector<Pending>& waitFor, const std::vector<Link*>& advance,
               const Deadline& deadline, const FrameHeader& call);

  // Marks the communicator failed and fails every link, so peers stop waiting for this rank.
  void abort(const std::string& reason) noexcept;
  bool aborted() const { return aborted_.load(); }
  std::string abortReason();

  // A scratch buffer of at least `bytes`, reused across calls; `slot` keeps two buffers apart.
  void* scratch(int slot, size_t bytes);
  // The same on a CUDA device (collectives on device buffers).
  void* deviceScratch(int slot, size_t bytes, int device);

  Executor& executor() { return executor_; }

  // The segment this rank shares with the other ranks of its host (small collectives of
  // exactly those ranks run through it: algorithms/slots.cc), or nullptr.
  void setHostSegment(std::unique_ptr<HostSegment> segment);
  HostSegment* hostSegment() const { return hostSegment_.get(); }

  // "[rank 3/8]"
  std::string who() const;

 private:
  int rank_, size_;
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<int> hostOf_;
  double timeoutSeconds_;
  int reduceThreads_ = 1;
  double spinSeconds_ = 5e-6;  // how long a wait spins before it yields the core
  LinkCost localCost_, remoteCost_;
  int modelCores_ = 0;
  int hierarchicalGroupSize_ = 0;
  double cacheBytes_ = kCacheResidentBytes;
  std::vector<TunedChoice> tuned_;
  mutable ChoiceMemo autoChoices_;
  mutable AgreedChoices agreedChoices_;
  int autoTrials_ = 0;
  std::mutex seqMu_;
  std::map<int, uint64_t> seq_;
  std::atomic<bool> aborted_{false};
  std::mutex abortMu_;
  std::string abortReason_;
  std::vector<std::unique_ptr<char[]>> scratch_;
  std::vector<size_t> scratchBytes_;
  std::vector<cuda::DeviceBuffer> deviceScratch_;
  std::unique_ptr<HostSegment> hostSegment_;
  Executor executor_;  // last member: its thread is joined before the links go away
};

// The members of a (sub)group seen from one rank: algorithms talk to group ranks 0..size-1 and
// never see global ranks, so the same ring runs on the whole world or on the ranks of one host.
class Group {
 public:
  Group(Communicator& comm, std::vector<int> members);
  static Group world(Communicator& comm);

  int rank() const { return myIndex_; }
  int size() const { return static_cast<int>(members_.size()); }
  int globalRank(int groupRank) const { return members_[groupRank]; }
  Link& link(int groupRank) { return comm_.link(members_[groupRank]); }
  Communicator& comm() { return comm_; }
  const Communicator& comm() const { return comm_; }

 private:
  Communicator& comm_;
  std::vector<int> members_;
  int myIndex_;
};

}  // namespace pycollective

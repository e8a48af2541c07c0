#pragma once
// n replicas in one process (what MirroredStrategy needs): n Communicators joined by inproc
// links, each driven by its own executor thread, all running the same algorithm code as
// processes on different hosts would.
//
// The same replicas can also be members of a larger group that spans processes
// (MultiWorkerMirroredStrategy: every replica of every worker), as NCCL serves several GPUs of
// one process: then each local replica also holds links to the replicas of the same local
// index in the other processes, and the group runs the hierarchical all-reduce over them.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/communicator.h"
#include "local/measured_choice.h"

namespace pycollective {

class LocalGroup {
 public:
  // groupSize: replicas per hierarchical group (0 = all replicas form one group).
  LocalGroup(int size, double timeoutSeconds, int groupSize);
  // This process is `worker` of `numWorkers` processes with the same number of local replicas
  // (crossLinks.size()); local replica l is global rank worker * size + l. crossLinks[l][w]
  // joins local replica l to replica l of worker w (nullptr at w == worker). hostOfWorker[w]
  // is worker w's host. Those links and the in-process ones are exactly what hierarchical
  // all-reduce uses (a ring per process, one ring per local index across processes), so it is
  // the one collective this group runs.
  LocalGroup(int worker, int numWorkers, std::vector<std::vector<std::unique_ptr<Link>>> crossLinks,
             const std::vector<int>& hostOfWorker, double timeoutSeconds);
  ~LocalGroup();

  // Local replicas (this process's).
  int size() const { return static_cast<int>(comms_.size()); }
  int numWorkers() const { return numWorkers_; }

  // Runs the collective on every replica at once: args[i] is replica i's call. Returns when all
  // finished; rethrows the first replica's error (all replicas fail together). algo "inline"
  // (or "auto" when the tuned table or the model prefers it) computes it on the calling thread.
  // Calls from several threads run one after another, each whole: interleaved, the replicas'
  // executors could take two threads' calls in different orders (replica 0 A then B, replica 1
  // B then A), which fails the group for good.
  void run(const std::vector<CollectiveArgs>& args, const std::string& algo);

  // Marks every replica's communicator failed (peers stop waiting for them).
  void abort(const std::string& reason) noexcept;

  // The algorithm algo="auto" runs (or would pick) for replica 0's call, and why: the trial's
  // times once this shape has been called, else the tuned table's entry or the model's table
  // (`inline`'s price first, then the algorithms').
  std::string explain(const CollectiveArgs& args);

  Communicator& communicator(int replica) { return *comms_[replica]; }

  // The most calls of one shape algo="auto" spends on its first trial (each candidate's first
  // calls, which do not count, included) before it runs its settled choice; 0 where it does
  // not measure (PYCOLLECTIVE_AUTO_TRIALS=0).
  int autoTrialCalls() const {
    return autoTrials_ > 0
               ? (MeasuredChoices::kUnfairCalls + autoTrials_) * static_cast<int>(kMaxCandidates)
               : 0;
  }

 private:
  // Whether algo="auto" runs this call inline: the tuned table's entry decides, else the model.
  bool inlineIsBest(const std::vector<CollectiveArgs>& args);
  // " inline=<us>us <algorithm>=<us>us ...": every price the model gives the call.
  std::string modelTable(const std::vector<CollectiveArgs>& args);
  // What algo="auto" runs for a host call: the measured choice among the tuned table's entry,
  // where there is one, and the model's candidates (measured_choice.h; `*trial` is set, with
  // the shape, when this call's time is to be recorded). "auto" leaves the choice to each
  // replica's communicator, which makes the same one.
  std::string autoPick(const std::vector<CollectiveArgs>& args, CallShape* shape, bool* trial);
  // The algorithms the model prices near its best, inline included (comm/auto_candidates.h).
  std::vector<MeasuredChoices::Candidate> autoCandidates(const std::vector<CollectiveArgs>& args);

  // A group across processes, a small call: hierarchical's phases with one thread per process
  // (reduce the local replicas inline, one all-reduce across processes by replica 0, local
  // copies). Below kCrossSmallBytes the threaded schedule costs more in replica-thread wake-ups
  // than it saves (measured at 4 KiB: 0.13-0.17 ms threaded, 0.11-0.12 ms this way, 2 workers x 2
  // replicas on 2 vCPUs).
  static constexpr size_t kCrossSmallBytes = 64 << 10;
  static constexpr int kCrossSmallGroupId = 0x20000001;  // apart from new_group()'s ids
  void runCrossSmall(const std::vector<CollectiveArgs>& args);
  // A host call with a named algorithm: "inline" on this thread, any other on the replicas.
  void runOnHost(const std::vector<CollectiveArgs>& args, const std::string& algo);
  // Every replica runs `algo`: 1..n-1 on their executor threads, 0 on the caller's.
  void runOnReplicas(const std::vector<CollectiveArgs>& args, const std::string& algo);
  // A group spanning processes: only hierarchical all-reduce (see the second constructor).
  void checkCrossProcessCall(const CollectiveArgs& args, const std::string& algo) const;

  std::vector<std::unique_ptr<Communicator>> comms_;
  std::mutex runMu_;  // one call at a time (run)
  int numWorkers_ = 1;
  int autoTrials_ = 0;  // PYCOLLECTIVE_AUTO_TRIALS when the group was made
  MeasuredChoices measured_;
};

}  // namespace pycollective

#pragma once
// n replicas in one process (what MirroredStrategy needs): n Communicators joined by inproc
// links, each driven by its own executor thread, all running the same algorithm code as
// processes on different hosts would.
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/communicator.h"

namespace pycollective {

class LocalGroup {
 public:
  // groupSize: replicas per hierarchical group (0 = all replicas form one group).
  LocalGroup(int size, double timeoutSeconds, int groupSize);
  ~LocalGroup();

  int size() const { return static_cast<int>(comms_.size()); }

  // Runs the collective on every replica at once: args[i] is replica i's call. Returns when all
  // finished; rethrows the first replica's error (all replicas fail together). algo "inline"
  // (or "auto" when the tuned table or the model prefers it) computes it on the calling thread.
  void run(const std::vector<CollectiveArgs>& args, const std::string& algo);

  // The algorithm algo="auto" would pick for replica 0's call, with the model's table.
  std::string explain(const CollectiveArgs& args);

  Communicator& communicator(int replica) { return *comms_[replica]; }

 private:
  // Whether algo="auto" runs this call inline: the tuned table's entry decides, else the model.
  bool inlineIsBest(const std::vector<CollectiveArgs>& args);

  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace pycollective

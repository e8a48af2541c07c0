#pragma once
// The per-call context an algorithm uses to talk to its peers: it stamps every message with the
// call's header (and a per-link step counter both ends count alike), remembers what is in flight
// and waits for it under the call's deadline. Sub-groups (hierarchical) share one call state.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "reduce/reduce.h"

namespace pycollective {

class Exchange {
 public:
  Exchange(Group group, const CollectiveArgs& args, uint8_t algoIndex, uint64_t seq);

  // The same call seen from a sub-group of this group's communicator.
  Exchange on(Group subgroup) const;

  Group& group() { return group_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }

  ReduceFn reduceFn() const { return state_->reduce; }
  size_t elemSize() const { return state_->elemSize; }
  size_t segmentBytes() const { return state_->segmentBytes; }

  // Post a message to / from group rank `peer`. Zero-byte messages are skipped on both ends.
  RequestPtr send(int peer, const void* data, size_t bytes);
  RequestPtr recv(int peer, void* dst, size_t bytes);
  // dst = accum OP incoming (accum == nullptr: dst OP incoming).
  RequestPtr recvReduce(int peer, void* dst, const void* accum, size_t bytes);

  // Local work that belongs to the call: dst = a OP b over `bytes`.
  void reduceLocal(void* dst, const void* a, const void* b, size_t bytes) const;

  // Like copy(), for results written to memory this rank will not read again (another rank's
  // output): streaming stores for host buffers, which skip reading the destination first.
  void store(void* dst, const void* src, size_t bytes) const;

  // dst = src over `bytes` in the call's memory: std::memcpy for host buffers, a device copy
  // (finished on return) for device buffers. Algorithms copy only through this.
  void copy(void* dst, const void* src, size_t bytes) const {
    if (state_->copy == nullptr) {
      std::memcpy(dst, src, bytes);
    } else if (bytes > 0) {
      state_->copy(dst, src, bytes);
    }
  }

  // A scratch buffer of at least `bytes` in the call's memory (host, or the call's device),
  // reused across calls; `slot` keeps two buffers apart.
  void* scratch(int slot, size_t bytes);

  // data[i] *= factor over `count` elements of the call's dtype (avg's final scale).
  void scale(void* data, size_t count, double factor) const;

  void wait(const RequestPtr& request);
  void waitAll();

 private:
  struct CallState {
    ~CallState();  // device calls: makes the caller's device current again
    int previousDevice = -1;
    Communicator* comm;
    FrameHeader header;  // template: step/bytes filled per message
    ReduceFn reduce;
    CopyFn copy = nullptr;  // nullptr: host memory (std::memcpy)
    int device = -1;        // CUDA device of the call's buffers, -1 for host memory
    int reduceThreads = 1;  // host reductions may split over this many threads
    DType dtype = DType::kFloat32;
    size_t elemSize;
    size_t segmentBytes;
    Deadline deadline;
    std::vector<uint32_t> sendSteps, recvSteps;  // per global peer
    std::vector<Pending> inFlight;
    std::vector<Link*> activeLinks;
  };

  Exchange(Group group, std::shared_ptr<CallState> state)
      : group_(std::move(group)), state_(std::move(state)) {}
  RequestPtr track(int globalPeer, RequestPtr request, bool isSend);
  RequestPtr postRecv(int peer, void* dst, const void* accum, size_t bytes, bool reduce);
  void prune();

  Group group_;
  std::shared_ptr<CallState> state_;
};

}  // namespace pycollective

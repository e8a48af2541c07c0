#pragma once
// The per-call context an algorithm uses to talk to its peers: it stamps every message with the
// call's header (and a per-link step counter both ends count alike), remembers what is in flight
// and waits for it under the call's deadline. Sub-groups (hierarchical) share one call state.
// With a compressed wire format (CollectiveArgs::wire) it also encodes what it sends over
// network links and decodes what arrives from them when the receive is waited for, so the
// algorithms run unchanged (reduce/wire_codec.h has the rules that keep ranks identical).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/wire_arena.h"
#include "core/host_copy.h"
#include "reduce/reduce.h"
#include "reduce/wire_codec.h"

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
  // The call's header (step and bytes are per message) and deadline, for algorithms that move
  // data through something other than links (slots: the host segment).
  const FrameHeader& callHeader() const { return state_->header; }
  const Deadline& deadline() const { return state_->deadline; }
  size_t elemSize() const { return state_->elemSize; }
  size_t segmentBytes() const { return state_->segmentBytes; }

  // Post a message to / from group rank `peer`. Zero-byte messages are skipped on both ends.
  RequestPtr send(int peer, const void* data, size_t bytes);
  RequestPtr recv(int peer, void* dst, size_t bytes);
  // dst = accum OP incoming (accum == nullptr: dst OP incoming).
  RequestPtr recvReduce(int peer, void* dst, const void* accum, size_t bytes);

  // Local work that belongs to the call: dst = a OP b over `bytes` (a compressed call rounds
  // a and b to its wire format first, as it does with received data).
  void reduceLocal(void* dst, const void* a, const void* b, size_t bytes) const;

  // Like copy(), for results written to memory this rank will not read again (another rank's
  // output): streaming stores for host buffers, which skip reading the destination first.
  void store(void* dst, const void* src, size_t bytes) const;

  // dst = src over `bytes` in the call's memory: hostCopy for host buffers, a device copy
  // (finished on return) for device buffers. Algorithms copy only through this.
  void copy(void* dst, const void* src, size_t bytes) const {
    if (bytes == 0) return;  // an empty buffer's pointer may be null: memcpy must not see it
    if (state_->copy == nullptr) {
      hostCopy(dst, src, bytes);
    } else {
      state_->copy(dst, src, bytes);
    }
  }

  // A scratch buffer of at least `bytes` in the call's memory (host, or the call's device),
  // reused across calls; `slot` keeps two buffers apart.
  void* scratch(int slot, size_t bytes);

  // Whether this call sends values over network links in a 16-bit wire format.
  bool compressed() const { return state_->wire != WireFormat::kNative; }
  // A compressed call's values rounded in place to its wire format (reduce/wire_codec.h).
  void roundToWire(void* data, size_t count) const;
  // Said by an algorithm whose schedule already rounded every element of a compressed call's
  // output (the ring rounds each chunk where it is finished, before passing it on): the final
  // rounding pass of the whole output is then skipped.
  void markOutputRounded() { state_->outputRounded = true; }
  bool outputRounded() const { return state_->outputRounded; }

  // data[i] *= factor over `count` elements of the call's dtype (avg's final scale).
  void scale(void* data, size_t count, double factor) const;

  // Completes `request` (and, for a compressed receive, decodes it into its destination).
  void wait(const RequestPtr& request);
  void waitAll();

 private:
  // A compressed receive waiting to be decoded once its 16-bit payload is in.
  struct Decode {
    RequestPtr request;
    float* dst;
    const float* accum;  // with reduce: dst = round(accum) OP incoming
    const uint16_t* incoming;
    size_t count;
    bool reduce;
    bool done = false;
  };

  struct CallState {
    ~CallState();  // device calls: makes the caller's device current again
    int previousDevice = -1;
    Communicator* comm;
    FrameHeader header;  // template: step/bytes filled per message
    ReduceFn reduce;
    CopyFn copy = nullptr;  // nullptr: host memory (hostCopy)
    int device = -1;        // CUDA device of the call's buffers, -1 for host memory
    int reduceThreads = 1;  // host reductions may split over this many threads
    DType dtype = DType::kFloat32;
    size_t elemSize;
    size_t segmentBytes;
    Deadline deadline;
    std::vector<uint32_t> sendSteps, recvSteps;  // per global peer
    std::vector<Pending> inFlight;
    std::vector<Link*> activeLinks;
    WireFormat wire = WireFormat::kNative;
    bool outputRounded = false;
    WireArena* wireArena = nullptr;  // this thread's, for the encoded payloads (wire_arena.h)
    std::vector<std::unique_ptr<uint16_t[]>> wireBuffers;  // when another call holds the arena
    std::vector<Decode> decodes;
  };

  Exchange(Group group, std::shared_ptr<CallState> state)
      : group_(std::move(group)), state_(std::move(state)) {}
  RequestPtr track(int globalPeer, RequestPtr request, bool isSend);
  RequestPtr postRecv(int peer, void* dst, const void* accum, size_t bytes, bool reduce);
  void prune();
  bool encodes(int peer);              // whether messages to/from `peer` use the wire format
  uint16_t* wireBuffer(size_t count);  // a buffer for `count` encoded elements, for this call
  void decode(Decode& d);

  Group group_;
  std::shared_ptr<CallState> state_;
};

}  // namespace pycollective

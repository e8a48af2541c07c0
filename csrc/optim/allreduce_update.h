#pragma once
// An optimizer step across processes, fused into the all-reduce of the gradients.
//
// The two-step version all-reduces the gradient into a buffer, then every rank reads it back
// and runs the update over the whole variable. Here the all-reduce's result is consumed where it
// is made (ZeRO's reduce-scatter / update / allgather, as one pipelined ring): each rank gets
// the sum of one chunk, segment by segment, applies the rule to that chunk of the variable and
// its slots while the segment is still in cache, and the allgather then carries the *new state*
// instead of the summed gradient. Every rank updates 1/N of the state instead of all of it,
// the summed gradient is never written out, and every copy ends bitwise identical (one rank
// computed each chunk). The rank's other local copies (in-process replicas) get copy 0's state.
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "optim/replicated_update.h"

namespace pycollective {

// All tensors as ONE collective (one pipelined ring, each tensor chunked on its own, so the
// pipeline stays full from the first tensor to the last): for each, `grads` holds this rank's one
// gradient (its local replicas' sum), `copies` and `slots` the state as for applyReplicatedUpdate;
// the rule sees gradScale * (sum over the group's ranks). shapeHashes[i] is tensor i's shape hash;
// members/groupId as for runCollective. Every tensor is checked before anything moves
// (InvalidArgument / InvalidType); a later failure aborts the communicator. The rule travels in
// the frame header (as its root field), so ranks that apply different rules get a ProtocolError.
//
// shardedSlots (ZeRO stage 1): every slot of a tensor is one array holding only this rank's
// chunk of the slot, chunk `rank` of Chunks(count, group size) (algorithms/chunking.h: the
// chunk this rank's reduce-scatter owns; possibly empty). Only the variable crosses the ring
// after the update, so the step costs what the all-reduce of the gradient costs, and the slots
// take 1/N of their memory. The flag travels in the header's update rule (kShardedStateFlag).
void allreduceUpdate(Communicator& comm, const std::vector<int>& members, int groupId,
                     UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                     const std::vector<ReplicatedTensor>& tensors,
                     const std::vector<uint32_t>& shapeHashes, double timeoutSeconds,
                     bool shardedSlots = false);

}  // namespace pycollective

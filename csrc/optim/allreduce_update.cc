#include "optim/allreduce_update.h"

#include "algorithms/chunking.h"
#include "algorithms/registry.h"
#include "algorithms/ring.h"
#include "core/error.h"
#include "core/stream_copy.h"
#include "optim/update_kernels.h"

namespace pycollective {

namespace {

// The state arrays of copy `c` that cross the ring and reach every local copy: the variable,
// then (unless the slots are sharded, and so stay where they are) its slots in the rule's order.
std::vector<char*> stateOf(const ReplicatedTensor& t, size_t c, bool shardedSlots) {
  std::vector<char*> state{static_cast<char*>(t.copies[c])};
  if (!shardedSlots)
    for (const auto& slot : t.slots) state.push_back(static_cast<char*>(slot[c]));
  return state;
}

// One tensor's collective (arguments already checked).
void updateOne(Group& group, int groupId, UpdateRule rule, DType dtype, const UpdateHyper& hyper,
               const ReplicatedTensor& tensor, uint32_t shapeHash, double timeoutSeconds,
               bool shardedSlots) {
  CollectiveArgs args;
  args.kind = CollectiveKind::kAllreduceUpdate;
  args.in = tensor.grads[0];
  args.out = tensor.copies[0];
  args.count = tensor.count;
  args.dtype = dtype;
  args.op = ReduceOp::kSum;
  args.updateRule =
      static_cast<uint8_t>(static_cast<uint8_t>(rule) | (shardedSlots ? kShardedStateFlag : 0));
  args.shapeHash = shapeHash;
  args.timeoutSeconds = timeoutSeconds;

  const size_t es = elementSize(dtype);
  const std::vector<char*> state = stateOf(tensor, 0, shardedSlots);
  const int nSlots = static_cast<int>(tensor.slots.size());
  const UpdateBlockFn update = lookupUpdateBlock(dtype);
  runSchedule(group, groupId, args, ring::algorithm(), [&](Exchange& ex) {
    const Chunks chunks(tensor.count, ex.size());
    char* work = ex.size() > 2 ? static_cast<char*>(ex.scratch(0, tensor.count * es)) : nullptr;
    char* reduced = static_cast<char*>(ex.scratch(1, chunks.size(ex.rank()) * es));
    ring::reduceApplyAllgather(
        ex, static_cast<const char*>(tensor.grads[0]), work, reduced, state, tensor.count,
        // Per segment, on the ring's critical path: the kernel alone (the arguments were
        // checked once, before anything moved; a segment is small enough for one thread).
        [&](const char* sum, size_t offset, size_t n) {
          void* slots[kMaxSlots] = {nullptr, nullptr};
          // A sharded slot starts at this rank's chunk; a replicated one at element 0.
          const size_t slotOffset = shardedSlots ? offset - chunks.offset(ex.rank()) : offset;
          for (int k = 0; k < nSlots; ++k)
            slots[k] = static_cast<char*>(tensor.slots[k][0]) + slotOffset * es;
          update(rule, hyper, sum, state[0] + offset * es, slots, n);
        });
  });
  // The other local copies are written, not read, before the next step: streaming stores.
  for (size_t c = 1; c < tensor.copies.size(); ++c) {
    const std::vector<char*> copy = stateOf(tensor, c, shardedSlots);
    for (size_t k = 0; k < state.size(); ++k) streamCopy(copy[k], state[k], tensor.count * es);
  }
}

}  // namespace

void allreduceUpdate(Communicator& comm, const std::vector<int>& members, int groupId,
                     UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                     const std::vector<ReplicatedTensor>& tensors,
                     const std::vector<uint32_t>& shapeHashes, double timeoutSeconds,
                     bool shardedSlots) {
  PC_CHECK(tensors.size() == shapeHashes.size(), comm.who(), " allreduce_update: ", tensors.size(),
           " tensors but ", shapeHashes.size(), " shape hashes");
  checkReplicatedUpdate(rule, dtype, tensors, shardedSlots);
  for (size_t i = 0; i < tensors.size(); ++i)
    PC_CHECK(tensors[i].grads.size() == 1, comm.who(), " allreduce_update: tensor ", i, " has ",
             tensors[i].grads.size(),
             " gradients; pass this rank's one gradient (sum the "
             "local replicas' first)");
  Group group(comm, members);
  for (size_t i = 0; i < tensors.size(); ++i)
    updateOne(group, groupId, rule, dtype, hyper, tensors[i], shapeHashes[i], timeoutSeconds,
              shardedSlots);
}

}  // namespace pycollective

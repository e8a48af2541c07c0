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

// The shape hashes of a call's tensors as one (the header carries one): ranks that pass
// different tensors, or the same ones in another order, disagree on it.
uint32_t combinedShapeHash(const std::vector<uint32_t>& shapeHashes) {
  uint32_t h = 2166136261u;  // FNV-1a over the hashes
  for (uint32_t x : shapeHashes) {
    h ^= x;
    h *= 16777619u;
  }
  return h;
}

// Every tensor of the call as one collective (arguments already checked).
void updateAll(Group& group, int groupId, UpdateRule rule, DType dtype, const UpdateHyper& hyper,
               const std::vector<ReplicatedTensor>& tensors,
               const std::vector<uint32_t>& shapeHashes, double timeoutSeconds, bool shardedSlots) {
  size_t total = 0;
  for (const ReplicatedTensor& t : tensors) total += t.count;
  CollectiveArgs args;
  args.kind = CollectiveKind::kAllreduceUpdate;
  args.in = tensors[0].grads[0];
  args.out = tensors[0].copies[0];
  args.count = total;
  args.dtype = dtype;
  args.op = ReduceOp::kSum;
  args.updateRule =
      static_cast<uint8_t>(static_cast<uint8_t>(rule) | (shardedSlots ? kShardedStateFlag : 0));
  args.shapeHash = combinedShapeHash(shapeHashes);
  args.timeoutSeconds = timeoutSeconds;

  const size_t es = elementSize(dtype);
  const int nSlots = static_cast<int>(tensors[0].slots.size());
  const UpdateBlockFn update = lookupUpdateBlock(dtype);
  runSchedule(group, groupId, args, ring::algorithm(), [&](Exchange& ex) {
    const int n = ex.size(), r = ex.rank();
    std::vector<ring::ChunkFn> applies;
    applies.reserve(tensors.size());  // never reallocated: the buffers point into it
    std::vector<ring::ApplyBuffers> buffers;
    for (const ReplicatedTensor& t : tensors) {
      const Chunks chunks(t.count, n);
      const std::vector<char*> state = stateOf(t, 0, shardedSlots);
      const size_t chunkOffset = chunks.offset(r);
      // Per segment, on the ring's critical path: the kernel alone (the arguments were
      // checked once, before anything moved; a segment is small enough for one thread).
      applies.push_back([&t, state, chunkOffset, nSlots, shardedSlots, es, update, rule, &hyper](
                            const char* sum, size_t offset, size_t count) {
        void* slots[kMaxSlots] = {nullptr, nullptr};
        // A sharded slot starts at this rank's chunk; a replicated one at element 0.
        const size_t slotOffset = shardedSlots ? offset - chunkOffset : offset;
        for (int k = 0; k < nSlots; ++k)
          slots[k] = static_cast<char*>(t.slots[k][0]) + slotOffset * es;
        update(rule, hyper, sum, state[0] + offset * es, slots, count);
      });
      // With more than two ranks the ring's partial sums go through the variable itself
      // (ring.h: only chunks that the allgather overwrites), as an allreduce's go through its
      // output. A separate 16 MiB scratch (4 ranks, 16 MiB of gradients) cost the fused plain
      // SGD step 0.5 ms more, 12.54-12.56 ms against 12.06-12.09 (three alternating pairs).
      // A step that fails midway may leave partial sums in those chunks (the scratch left old
      // values there, or some chunks updated and some not): recovery restores a checkpoint
      // (strategies/fault_tolerance.py saves one at step 0), which overwrites them all.
      buffers.push_back({static_cast<const char*>(t.grads[0]), n > 2 ? state[0] : nullptr, state,
                         t.count, &applies.back()});
    }
    ring::reduceApplyAllgather(ex, buffers);
  });
  // The other local copies are written, not read, before the next step: streaming stores.
  for (const ReplicatedTensor& t : tensors) {
    const std::vector<char*> state = stateOf(t, 0, shardedSlots);
    for (size_t c = 1; c < t.copies.size(); ++c) {
      const std::vector<char*> copy = stateOf(t, c, shardedSlots);
      for (size_t k = 0; k < state.size(); ++k) streamCopy(copy[k], state[k], t.count * es);
    }
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
  if (tensors.empty()) return;
  Group group(comm, members);
  updateAll(group, groupId, rule, dtype, hyper, tensors, shapeHashes, timeoutSeconds, shardedSlots);
}

}  // namespace pycollective

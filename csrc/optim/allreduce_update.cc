#include "optim/allreduce_update.h"

#include "algorithms/chunking.h"
#include "algorithms/registry.h"
#include "algorithms/ring.h"
#include "core/error.h"
#include "core/stream_copy.h"
#include "optim/update_kernels.h"

namespace pycollective {

namespace {

// The state arrays of copy `c`: the variable, then its slots in the rule's order.
std::vector<char*> stateOf(const ReplicatedTensor& t, size_t c) {
  std::vector<char*> state{static_cast<char*>(t.copies[c])};
  for (const auto& slot : t.slots) state.push_back(static_cast<char*>(slot[c]));
  return state;
}

// One tensor's collective (arguments already checked).
void updateOne(Group& group, int groupId, UpdateRule rule, DType dtype, const UpdateHyper& hyper,
               const ReplicatedTensor& tensor, uint32_t shapeHash, double timeoutSeconds) {
  CollectiveArgs args;
  args.kind = CollectiveKind::kAllreduceUpdate;
  args.in = tensor.grads[0];
  args.out = tensor.copies[0];
  args.count = tensor.count;
  args.dtype = dtype;
  args.op = ReduceOp::kSum;
  args.updateRule = static_cast<uint8_t>(rule);
  args.shapeHash = shapeHash;
  args.timeoutSeconds = timeoutSeconds;

  const size_t es = elementSize(dtype);
  const std::vector<char*> state = stateOf(tensor, 0);
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
          for (size_t k = 1; k < state.size(); ++k) slots[k - 1] = state[k] + offset * es;
          update(rule, hyper, sum, state[0] + offset * es, slots, n);
        });
  });
  // The other local copies are written, not read, before the next step: streaming stores.
  for (size_t c = 1; c < tensor.copies.size(); ++c) {
    const std::vector<char*> copy = stateOf(tensor, c);
    for (size_t k = 0; k < state.size(); ++k) streamCopy(copy[k], state[k], tensor.count * es);
  }
}

}  // namespace

void allreduceUpdate(Communicator& comm, const std::vector<int>& members, int groupId,
                     UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                     const std::vector<ReplicatedTensor>& tensors,
                     const std::vector<uint32_t>& shapeHashes, double timeoutSeconds) {
  PC_CHECK(tensors.size() == shapeHashes.size(), comm.who(), " allreduce_update: ", tensors.size(),
           " tensors but ", shapeHashes.size(), " shape hashes");
  checkReplicatedUpdate(rule, dtype, tensors);
  for (size_t i = 0; i < tensors.size(); ++i)
    PC_CHECK(tensors[i].grads.size() == 1, comm.who(), " allreduce_update: tensor ", i, " has ",
             tensors[i].grads.size(),
             " gradients; pass this rank's one gradient (sum the "
             "local replicas' first)");
  Group group(comm, members);
  for (size_t i = 0; i < tensors.size(); ++i)
    updateOne(group, groupId, rule, dtype, hyper, tensors[i], shapeHashes[i], timeoutSeconds);
}

}  // namespace pycollective

#pragma once
// Optimizer steps on replicated state, fused with the reduction of the replicas' gradients.
//
// MirroredStrategy keeps one copy of every variable (and of every optimizer slot) per local
// replica, identical by construction. When the replicas share this process, "all-reduce the
// gradients, then every replica updates its copy" can be done in one pass over memory: each
// element of every replica's gradient is read once, the state is read from copy 0 only and
// updated there in place, and the new state is written once into every other copy (streaming
// stores). That is the memory traffic of
// the all-reduce alone plus one read of the state, where the two-step version pays the
// all-reduce, then a read-modify-write of every copy per replica.
//
// The same function applies an already all-reduced gradient (one gradient, gradScale 1/N) to
// every local copy: the multi-worker strategy's last step.
#include <cstddef>
#include <vector>

#include "core/dtype.h"

namespace pycollective {

// The update rules, with the Keras optimizers' arithmetic (g: the scaled gradient sum).
enum class UpdateRule : int {
  kSgd = 0,       // w -= lr * g
  kMomentum = 1,  // m = momentum * m - lr * g;  w += m                     (slots: m)
  kNesterov = 2,  // m = momentum * m - lr * g;  w += momentum * m - lr * g  (slots: m)
  kAdam = 3,      // m += (g - m)(1 - beta1); v += (g*g - v)(1 - beta2);
                  // w -= lr * m / (sqrt(v) + epsilon)   (lr: the bias-corrected step size)
};
constexpr int kNumUpdateRules = 4;
// Set in a frame header's update rule when the slots are sharded (allreduce_update.h): ranks
// that disagree about sharding then fail with a ProtocolError instead of exchanging mismatched
// schedules.
constexpr uint8_t kShardedStateFlag = 0x10;
// "sgd", "momentum", "nesterov", "adam" (what Python passes by name); with kShardedStateFlag,
// "momentum, sharded state" and so on.
const char* updateRuleName(uint8_t rule);

struct UpdateHyper {
  double lr = 0;
  double momentum = 0;
  double beta1 = 0;
  double beta2 = 0;
  double epsilon = 0;
  double gradScale = 1;  // g = gradScale * (sum of the gradients): 1/N makes it a mean
};

// One variable: its gradients (one per replica, summed in this order), its copies, and the
// copies of each of its slots (in the order the rule lists them). Copies and slots must not
// overlap the gradients.
struct ReplicatedTensor {
  size_t count = 0;
  std::vector<const void*> grads;
  std::vector<void*> copies;
  std::vector<std::vector<void*>> slots;
};

// Slots the rule keeps per variable (0, 1 or 2).
int slotCount(UpdateRule rule);
constexpr int kMaxSlots = 2;  // Adam's m and v

// InvalidArgument when a tensor has no gradient, no copy, or the wrong number of slots;
// InvalidType for dtypes other than float32 and float64. Every slot has one array per copy, or,
// with `shardedSlots` (allreduce_update.h), exactly one: this rank's shard.
void checkReplicatedUpdate(UpdateRule rule, DType dtype,
                           const std::vector<ReplicatedTensor>& tensors, bool shardedSlots = false);

// Applies the rule to every tensor, split over the shared reduction thread pool. float32 and
// float64 only (InvalidType otherwise: callers fall back to their own arithmetic); InvalidArgument
// when a tensor has no gradient, no copy, or the wrong number of slots.
void applyReplicatedUpdate(UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                           const std::vector<ReplicatedTensor>& tensors);

}  // namespace pycollective

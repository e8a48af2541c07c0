#include "optim/replicated_update.h"

#include <algorithm>

#include "core/error.h"
#include "core/stream_copy.h"
#include "core/thread_pool.h"
#include "optim/update_kernels.h"
#include "reduce/reduce.h"
#include "transport/frame.h"

namespace pycollective {

const char* updateRuleName(uint8_t rule) {
  static const char* const kNames[kNumUpdateRules] = {"sgd", "momentum", "nesterov", "adam"};
  static const char* const kSharded[kNumUpdateRules] = {
      "sgd, sharded state", "momentum, sharded state", "nesterov, sharded state",
      "adam, sharded state"};
  const bool sharded = (rule & kShardedStateFlag) != 0;
  const uint8_t base = static_cast<uint8_t>(rule & ~kShardedStateFlag);
  if (base >= kNumUpdateRules) return "an unknown rule";
  return sharded ? kSharded[base] : kNames[base];
}

namespace {

// Frame errors (transport/frame.h) name the header's update rule through this.
[[maybe_unused]] const bool kUpdateRuleNamerRegistered =
    (registerUpdateRuleNamer(&updateRuleName), true);

// A piece is one thread's share (a job of the pool); a block is what one pass keeps in cache:
// the summed gradient and copy 0's new state of a block stay in L1/L2 between being computed
// and being stored into the other copies.
constexpr size_t kPieceBytes = 512 * 1024;
constexpr size_t kBlockBytes = 64 * 1024;

struct Piece {
  const ReplicatedTensor* tensor;
  size_t begin;
  size_t count;
};

// Copy 0 is updated in place with ordinary stores (its lines were just read, and a single
// copy, the multi-worker case, then stays in cache for the next step); the other copies get
// the block with streaming stores.
template <typename T>
void runPiece(UpdateRule rule, const UpdateHyper& h, ReduceFn sum, UpdateBlockFn update, int nSlots,
              const Piece& p) {
  const ReplicatedTensor& t = *p.tensor;
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  thread_local std::vector<T> acc;  // the gradient sum of a block
  acc.resize(kBlock);
  void* s[kMaxSlots] = {nullptr, nullptr};
  for (size_t off = p.begin; off < p.begin + p.count; off += kBlock) {
    const size_t n = std::min(kBlock, p.begin + p.count - off);
    const T* g = static_cast<const T*>(t.grads[0]) + off;
    if (t.grads.size() > 1) {
      sum(acc.data(), g, static_cast<const T*>(t.grads[1]) + off, n);
      for (size_t r = 2; r < t.grads.size(); ++r)
        sum(acc.data(), acc.data(), static_cast<const T*>(t.grads[r]) + off, n);
      g = acc.data();
    }
    T* w = static_cast<T*>(t.copies[0]) + off;
    for (int k = 0; k < nSlots; ++k) s[k] = static_cast<T*>(t.slots[k][0]) + off;
    update(rule, h, g, w, s, n);
    for (size_t c = 1; c < t.copies.size(); ++c)
      streamCopy(static_cast<T*>(t.copies[c]) + off, w, n * sizeof(T));
    for (int k = 0; k < nSlots; ++k)
      for (size_t c = 1; c < t.slots[k].size(); ++c)
        streamCopy(static_cast<T*>(t.slots[k][c]) + off, s[k], n * sizeof(T));
  }
}

template <typename T>
void applyAll(UpdateRule rule, DType dtype, const UpdateHyper& h,
              const std::vector<ReplicatedTensor>& tensors) {
  const int nSlots = slotCount(rule);
  std::vector<Piece> pieces;
  const size_t pieceElems = kPieceBytes / sizeof(T);
  for (const ReplicatedTensor& t : tensors)
    for (size_t b = 0; b < t.count; b += pieceElems)
      pieces.push_back({&t, b, std::min(pieceElems, t.count - b)});
  const ReduceFn sum = lookupReduce(dtype, ReduceOp::kSum);
  const UpdateBlockFn update = lookupUpdateBlock(dtype);
  auto run = [&](int i) { runPiece<T>(rule, h, sum, update, nSlots, pieces[i]); };
  if (pieces.size() <= 1) {
    for (size_t i = 0; i < pieces.size(); ++i) run(static_cast<int>(i));
    return;
  }
  ThreadPool::reductionPool().parallelFor(static_cast<int>(pieces.size()), run);
}

}  // namespace

int slotCount(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kSgd: return 0;
    case UpdateRule::kMomentum:
    case UpdateRule::kNesterov: return 1;
    case UpdateRule::kAdam: return 2;
  }
  throw InvalidArgument(makeMessage("unknown update rule ", static_cast<int>(rule)));
}

void checkReplicatedUpdate(UpdateRule rule, DType dtype,
                           const std::vector<ReplicatedTensor>& tensors, bool shardedSlots) {
  const int nSlots = slotCount(rule);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ReplicatedTensor& t = tensors[i];
    PC_CHECK(!t.grads.empty() && !t.copies.empty(), "replicated update: tensor ", i,
             " needs at least one gradient and one copy");
    PC_CHECK(static_cast<int>(t.slots.size()) == nSlots, "replicated update: tensor ", i, " has ",
             t.slots.size(), " slots, the rule keeps ", nSlots);
    for (const auto& copies : t.slots) {
      if (shardedSlots)
        PC_CHECK(copies.size() == 1, "sharded update: tensor ", i, " has a slot with ",
                 copies.size(), " arrays; pass this rank's one shard of each slot");
      else
        PC_CHECK(copies.size() == t.copies.size(), "replicated update: tensor ", i, " has ",
                 t.copies.size(), " copies but a slot with ", copies.size());
    }
  }
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64)
    throw InvalidType(
        makeMessage("fused optimizer updates support float32 and float64, not ", dtypeName(dtype)));
}

void applyReplicatedUpdate(UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                           const std::vector<ReplicatedTensor>& tensors) {
  checkReplicatedUpdate(rule, dtype, tensors);
  if (dtype == DType::kFloat32) return applyAll<float>(rule, dtype, hyper, tensors);
  applyAll<double>(rule, dtype, hyper, tensors);
}

}  // namespace pycollective

#include "optim/replicated_update.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/stream_copy.h"
#include "core/thread_pool.h"
#include "reduce/reduce.h"

namespace pycollective {

namespace {

// A piece is one thread's share (a job of the pool); a block is what one pass keeps in cache:
// the summed gradient and copy 0's new state of a block stay in L1/L2 between being computed
// and being stored into the other copies.
constexpr size_t kPieceBytes = 512 * 1024;
constexpr size_t kBlockBytes = 64 * 1024;
constexpr int kMaxSlots = 2;  // Adam's m and v

struct Piece {
  const ReplicatedTensor* tensor;
  size_t begin;
  size_t count;
};

// Updates one block of copy 0 in place: w (weights) and s[k] (slots) point into copy 0, g is
// the gradient sum (not yet scaled). Every element is read before it is written, so a gradient
// that is itself a copy is still read intact.
template <typename T>
void computeBlock(UpdateRule rule, const UpdateHyper& h, const T* g, T* w, T* const* s,
                  size_t n) {
  const T scale = static_cast<T>(h.gradScale), lr = static_cast<T>(h.lr);
  switch (rule) {
    case UpdateRule::kSgd:
      for (size_t i = 0; i < n; ++i) w[i] = w[i] - lr * (scale * g[i]);
      break;
    case UpdateRule::kMomentum: {
      const T mom = static_cast<T>(h.momentum);
      for (size_t i = 0; i < n; ++i) {
        const T m = mom * s[0][i] - lr * (scale * g[i]);
        s[0][i] = m;
        w[i] = w[i] + m;
      }
      break;
    }
    case UpdateRule::kNesterov: {
      const T mom = static_cast<T>(h.momentum);
      for (size_t i = 0; i < n; ++i) {
        const T step = lr * (scale * g[i]);
        const T m = mom * s[0][i] - step;
        s[0][i] = m;
        w[i] = w[i] + (mom * m - step);
      }
      break;
    }
    case UpdateRule::kAdam: {
      const T b1 = static_cast<T>(1 - h.beta1), b2 = static_cast<T>(1 - h.beta2);
      const T eps = static_cast<T>(h.epsilon);
      for (size_t i = 0; i < n; ++i) {
        const T gi = scale * g[i];
        const T m = s[0][i] + (gi - s[0][i]) * b1;
        const T v = s[1][i] + (gi * gi - s[1][i]) * b2;
        s[0][i] = m;
        s[1][i] = v;
        w[i] = w[i] - lr * m / (std::sqrt(v) + eps);
      }
      break;
    }
  }
}

// Copy 0 is updated in place with ordinary stores (its lines were just read, and a single
// copy, the multi-worker case, then stays in cache for the next step); the other copies get
// the block with streaming stores.
template <typename T>
void runPiece(UpdateRule rule, const UpdateHyper& h, ReduceFn sum, int nSlots, const Piece& p) {
  const ReplicatedTensor& t = *p.tensor;
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  thread_local std::vector<T> acc;  // the gradient sum of a block
  acc.resize(kBlock);
  T* s[kMaxSlots] = {nullptr, nullptr};
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
    computeBlock(rule, h, g, w, s, n);
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
  auto run = [&](int i) { runPiece<T>(rule, h, sum, nSlots, pieces[i]); };
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
                           const std::vector<ReplicatedTensor>& tensors) {
  const int nSlots = slotCount(rule);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ReplicatedTensor& t = tensors[i];
    PC_CHECK(!t.grads.empty() && !t.copies.empty(), "replicated update: tensor ", i,
             " needs at least one gradient and one copy");
    PC_CHECK(static_cast<int>(t.slots.size()) == nSlots, "replicated update: tensor ", i,
             " has ", t.slots.size(), " slots, the rule keeps ", nSlots);
    for (const auto& copies : t.slots)
      PC_CHECK(copies.size() == t.copies.size(), "replicated update: tensor ", i, " has ",
               t.copies.size(), " copies but a slot with ", copies.size());
  }
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64)
    throw InvalidType(makeMessage("fused optimizer updates support float32 and float64, not ",
                                  dtypeName(dtype)));
}

void applyReplicatedUpdate(UpdateRule rule, DType dtype, const UpdateHyper& hyper,
                           const std::vector<ReplicatedTensor>& tensors) {
  checkReplicatedUpdate(rule, dtype, tensors);
  if (dtype == DType::kFloat32) return applyAll<float>(rule, dtype, hyper, tensors);
  applyAll<double>(rule, dtype, hyper, tensors);
}

}  // namespace pycollective

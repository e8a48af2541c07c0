#pragma once
// auto's decisions, remembered per call shape. The cost model prices every algorithm for a call
// (a few microseconds, as much as a small collective itself), and its answer depends only on the
// call's shape and on the model's inputs (link costs, the tuned table), so it runs once per shape.
// The communicator forgets everything when those inputs change (Communicator::setCosts etc.).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace pycollective {

// What a decision depends on, beside the model's inputs. `question` keeps different decisions
// about the same call apart (which algorithm; whether the inline path beats them all).
struct CallShape {
  int question = 0;
  int groupId = 0;
  uint64_t members = 0;  // a hash of the group's global ranks
  uint8_t kind = 0, dtype = 0, op = 0, wire = 0;
  int root = 0;
  bool device = false;
  size_t count = 0;
  size_t segmentBytes = 0;

  bool operator==(const CallShape& o) const {
    return question == o.question && groupId == o.groupId && members == o.members &&
           kind == o.kind && dtype == o.dtype && op == o.op && wire == o.wire && root == o.root &&
           device == o.device && count == o.count && segmentBytes == o.segmentBytes;
  }
};

struct CallShapeHash {
  size_t operator()(const CallShape& s) const {
    uint64_t h = s.count * 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
    mix(static_cast<uint64_t>(s.question));
    mix(static_cast<uint64_t>(s.groupId));
    mix(s.members);
    mix(static_cast<uint64_t>(s.kind) | static_cast<uint64_t>(s.dtype) << 8 |
        static_cast<uint64_t>(s.op) << 16 | static_cast<uint64_t>(s.wire) << 24);
    mix(static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 1 | (s.device ? 1 : 0));
    mix(s.segmentBytes);
    return static_cast<size_t>(h);
  }
};

class ChoiceMemo {
 public:
  // The remembered answer, or -1. `*epoch` receives the memo's epoch, to pass to remember().
  int find(const CallShape& shape, uint64_t* epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    *epoch = epoch_;
    auto it = answers_.find(shape);
    return it == answers_.end() ? -1 : it->second;
  }
  // Keeps an answer worked out since find() returned `epoch`, unless forget() ran in between:
  // then the answer may rest on the old costs or table, and is dropped.
  void remember(const CallShape& shape, int answer, uint64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (epoch != epoch_) return;
    // A program that calls with ever new sizes must not grow this without bound.
    if (answers_.size() >= kMaxShapes) answers_.clear();
    answers_[shape] = answer;
  }
  // Moves on every forget(): a decision taken at another epoch may rest on old inputs. Read
  // without the lock: a remembered plain call asks on every call.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  void forget() {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.clear();
    epoch_.fetch_add(1, std::memory_order_release);
  }

 private:
  static constexpr size_t kMaxShapes = 4096;
  std::mutex mu_;
  std::atomic<uint64_t> epoch_{0};  // written under mu_
  std::unordered_map<CallShape, int, CallShapeHash> answers_;
};

}  // namespace pycollective

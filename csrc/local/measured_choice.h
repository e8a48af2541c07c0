#pragma once
// auto's choice for in-process replicas, settled and kept up by timing. The cost model prices
// every algorithm from a few constants; near a cache boundary it misses by 1.2x-2x, and on a VM
// whose cores another tenant shares the fastest algorithm changes from one minute to the next
// (2 replicas x 1 MiB, two benchmark runs seconds apart: halving-doubling 167 us against
// `direct`'s 108, then 84 against 106). A LocalGroup's calls are decided in one place -- the
// calling thread picks, every replica runs the pick -- so auto can afford to measure:
//
// - a call counts only after kUnfairCalls calls in a row of the same algorithm (the first
//   calls of a shape, or after a switch, pay for what came before: outputs touched the first
//   time, caches left by another algorithm);
// - each candidate (the algorithms the model prices near its best, best first; led by the
//   tuned table's entry where there is one) runs
//   kUnfairCalls + `trialsEach` calls in a row, and the shape settles on the fastest, unless the
//   first candidate is within kMoveMargin of it (a near tie stays the model's, or the table's);
// - from then on every call is timed, and now and then another candidate is checked:
//   kUnfairCalls + kCheckCalls calls of it in a row, judged by the median of its counted calls
//   against the median of the current choice's last calls. The shape moves to it only when it
//   ran kMoveMargin faster than the choice's calls both before and after its check (until the
//   twenty-fourth session one counted call decided, and a candidate's times from an earlier
//   check could replace a choice that had just slowed with all the others; until the
//   twenty-sixth the calls before alone, and the machine's pace changing as the check began
//   moved 4 replicas x 4 MiB between its near ties every few dozen calls). Checks come after
//   kBaseInterval calls, each check the choice survives doubles that candidate's interval (to
//   kMaxInterval; four times for one kCloseRatio slower), so keeping watch costs ever less, and
//   the trial counts as the first check of each near tie slower than the choice there (until the
//   twenty-seventh session every rival was first checked after kBaseInterval calls, the next
//   after 2 and 4 times as many whatever the gap); when every one of the current choice's
//   last calls runs kCloseRatio slower than usual (the machine changed, not a few calls that
//   paid for other work) every other candidate is checked at once;
// - the algorithms priced outside the near ties wait in reserve (AutoCandidate::reserve). They
//   join the race when the choice's last calls all run kWidenRatio slower than usual (or, its
//   first counted calls, kWidenRatio slower than the model's price), and leave it after a check
//   that finds them no faster than the choice (a lone near tie's calls are timed for this where
//   the model prices them at kMinModelSeconds or more). Those priced within kWidenRatio of the
//   near ties race once the shape has run kOnceAfter calls, until their first check
//   (checkedOnce): the model misses by more than its window. When the VM's two vCPUs drift apart (a
//   cache line's round trip 350 ns instead of 60), the in-process algorithms that hand data between
//   threads over links -- ring, halving-doubling, reduce-to-one -- run 4-6x slower for seconds to
//   minutes, while `direct` and `inline` do not; the model, which knows nothing of it, prices
//   them 1.25x or more apart.
//
// Groups across processes measure too, agreeing on each decision (comm/agreed_choice.h). The
// measured choice depends on timing:
// results whose reduction order differs between algorithms (3 or more replicas, floats) may
// then differ in the last bits from run to run. PYCOLLECTIVE_AUTO_TRIALS=0 keeps the model's
// choice alone.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/auto_candidates.h"
#include "comm/choice_memo.h"

namespace pycollective {

class MeasuredChoices {
 public:
  // Calls right after another algorithm's that do not count (see record()).
  static constexpr int kUnfairCalls = 2;

  using Candidate = AutoCandidate;

  // The algorithm to run for this call. The first call of a shape starts its trial with
  // `candidates()` (the model's best first). `*timeIt` says whether to record() this call's
  // time. `epoch` is the model inputs' (ChoiceMemo::epoch()): a trial begun under other costs or
  // another tuned table starts again.
  template <typename CandidatesFn>
  std::string pick(const CallShape& shape, uint64_t epoch, int trialsEach,
                   CandidatesFn&& candidates, bool* timeIt) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = shapes_.find(shape);
    if (it == shapes_.end() || it->second.epoch != epoch) {
      if (shapes_.size() >= kMaxShapes) shapes_.clear();
      it = shapes_.insert_or_assign(shape, Trial(candidates(), epoch, trialsEach)).first;
    }
    return it->second.next(timeIt);
  }

  // How long one call of `algo` for this shape took. True when the shape settled or moved to
  // another algorithm, for the first kChangesSaid times (the caller logs describe() then).
  bool record(const CallShape& shape, const std::string& algo, double seconds);

  // What auto runs for this shape and why, or "" if the shape has not been called since the
  // model's inputs last changed (`epoch`, as for pick()).
  std::string describe(const CallShape& shape, uint64_t epoch);

 private:
  static constexpr uint64_t kBaseInterval = 32;
  static constexpr uint64_t kMaxInterval = 2048;
  static constexpr size_t kMaxShapes = 4096;
  static constexpr int kChangesSaid = 10;  // per shape: a noisy machine moves it back and forth

  struct Timings {
    RecentTimes times;
    uint64_t due = 0;  // the call at which its next check is due
    uint64_t interval = kBaseInterval;
    bool racing = false;  // a near tie, or a reserve called up by a slowdown
    double estimate() const { return times.estimate(); }
  };

  struct Trial {
    Trial(std::vector<Candidate> c, uint64_t e, int trialsEach);
    std::string next(bool* timeIt);
    // True when the choice changed (settled, or moved).
    bool record(const std::string& algo, double seconds);
    void settle();
    // After a counted call of the current choice: on a slowdown, every other candidate is due.
    void watchForSlowdown();
    void raceReserves();              // until each one's check finds it no faster (lost())
    void raceOnce();                  // the reserves checkedOnce, at the kOnceAfter-th call
    void startLevel(double seconds);  // the choice's first usual time
    // After `checked`'s check: a rival that ran kMoveMargin faster than the choice's calls
    // before it waits for the choice's calls after it (confirming); another lost().
    void judge(size_t checked);
    // After the choice's counted calls that follow a check it looked to lose: true when the
    // choice moved to the rival.
    bool confirm();
    void lost(size_t checked);      // the choice stays: the rival waits longer, a reserve stops
    void waitLonger(size_t rival);  // the next check of a rival that did not beat the choice
    bool settled() const { return current >= 0; }
    // Whether calls are timed: where near ties race, or a lone one's reserves wait for it to
    // slow (a clock read is cheap beside a call priced at kMinModelSeconds or more).
    bool timed() const {
      return trialsEach > 0 && (nearTies > 1 || (candidates.size() > 1 &&
                                                 candidates[0].modelSeconds >= kMinModelSeconds));
    }

    std::vector<Candidate> candidates;  // the near ties first, then the reserves
    size_t nearTies = 0;                // the candidates that race from the start
    std::vector<Timings> timings;
    bool onceToCome = false;  // the reserves checkedOnce still wait for that check (raceOnce)
    uint64_t epoch = 0;
    int trialsEach = 0;
    uint64_t calls = 0;
    size_t turn = 0;          // before settling: the candidate the next call runs
    int last = -1;            // the candidate the previous call ran
    int streak = 0;           // calls in a row of `last` before this one
    int checking = -1;        // once settled: the other candidate whose check is under way
    int confirming = -1;      // a rival faster than the choice's calls before its check (judge())
    double choiceBefore = 0;  // the choice's estimate from those calls
    int current = -1;         // once settled: the choice
    // The choice's usual time: a moving average of its estimate (kLevelWeight per counted
    // call), which a slowdown by kCloseRatio resets.
    double level = 0;
    int changesSaid = 0;
  };

  std::mutex mu_;
  std::unordered_map<CallShape, Trial, CallShapeHash> shapes_;
};

}  // namespace pycollective

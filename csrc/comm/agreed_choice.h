#pragma once
// auto's choice for a group across processes, settled by timing as in-process replicas settle
// theirs (local/measured_choice.h), with every decision agreed. Each rank times its own view of
// a call, and ranks that ran different algorithms would fail the call, so nothing here follows
// one rank's clock alone: which algorithm a call runs is a function of the shape's call count
// (the same on every rank, since every rank calls the same collectives in the same order), and
// the times that decide pass through a small allreduce first: each counted call's time on its
// slowest rank (a call's slot in its candidate's recent calls is the same on every rank), of
// which each candidate's median decides (agreed_auto.cc says why not one rank's median):
//
// - the trial: each near tie (the model's, best first, led by the tuned table's entry where
//   there is one: comm/auto_candidates.h) runs kUnfairCalls + trialsEach calls in a row,
//   the first kUnfairCalls not counted (they pay for what the previous algorithm left behind);
//   then the ranks agree on the times and settle on the fastest, unless the first candidate is
//   within kMoveMargin of it;
// - a check every `interval` calls: each other racing candidate runs kUnfairCalls + kCheckCalls
//   calls (kColdCalls more not counted where one has not run this shape yet), judged by its
//   counted ones alone, the choice's own recent calls stand for it, the
//   ranks agree, and the shape moves to a candidate kMoveMargin faster. The interval doubles
//   from kBaseInterval to kMaxInterval while the choice stands, and starts over when it moves;
// - a watch every kWatchInterval calls of the choice between checks: the ranks agree on its last
//   calls, and when all of them ran kCloseRatio slower than its usual time (the machine changed)
//   the next call starts a check. Without it a choice that slowed ran on for up to kMaxInterval
//   calls; the watch costs one agreement per kWatchInterval calls (a few microseconds in a few
//   milliseconds, at kMinModelSeconds; calls priced under it are measured but not watched);
// - the algorithms priced outside the near ties wait in reserve (AutoCandidate::reserve): a
//   watch that finds the choice kWidenRatio slower than usual (or its first usual time that
//   much over the model's price, in two windows of calls in a row: the first may be warm-up)
//   has them join the next check, and a check that finds a reserve no faster sends it back. A
//   lone near tie with reserves is watched so (no trial): the model has no rival for it, but a
//   machine that changed under it may. The reserves priced within
//   kWidenRatio of the near ties have one check of their own after the shape's first
//   kOnceAfter calls (checkedOnce; kOnceAfterCheap for a choice priced under
//   kCheapCallSeconds): the model misses by more than its window. One that lost it while
//   running within kWidenRatio of the choice is checked once more after as many calls again:
//   a reserve's first calls in a process can still be warming up after the check's uncounted
//   ones (2 ranks x 2 MiB in the benchmark: halving-doubling's counted calls 295, 222 and 186
//   us, its settled ones 120-140, against `staged`'s 161-171; auto stayed on `staged`).
//
// The agreement is one allreduce of a few doubles per trial, check or watch. Which calls are
// measured is the caller's to say, by the candidates it gives: one alone is not (process
// groups measure calls the model prices under 5 us only on a crowded host,
// algorithms/agreed_auto.cc).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/auto_candidates.h"
#include "comm/choice_memo.h"

namespace pycollective {

class AgreedChoices {
 public:
  static constexpr int kUnfairCalls = 2;
  // More calls not counted where a check runs a candidate this shape has not run yet: it warms
  // up over several calls (2 ranks x 1 MiB, halving-doubling's first calls in a process after
  // the first: 186, 192, 179, 135, 122, 107 us, then 78-96; its shm rings are 4 MiB), and a
  // reserve 1.7x faster lost its one check to `staged` on its first ones.
  static constexpr int kColdCalls = 4;
  // The most calls of one shape the first trial takes, with `trialsEach` counted calls each.
  static int trialCalls(int trialsEach) {
    return trialsEach > 0 ? (kUnfairCalls + trialsEach) * static_cast<int>(kMaxCandidates) : 0;
  }

  // One call's part in its shape's schedule.
  struct Step {
    std::string algo;
    size_t candidate = 0;
    bool counted = false;  // its time joins the candidate's recent calls (record())
    // After it every rank agrees on the times (samples(), decide()): the end of the trial, of a
    // check or of a watch's calls.
    bool closesRound = false;
  };

  // The next call of this shape: false where there is nothing to measure (`candidates()` gave
  // one algorithm alone, or trialsEach <= 0); the caller runs the model's choice then. A shape
  // first met, or met under other model inputs (`epoch`: ChoiceMemo::epoch()), starts its
  // trial with `candidates()`.
  template <typename CandidatesFn>
  bool next(const CallShape& shape, uint64_t epoch, int trialsEach, CandidatesFn&& candidates,
            Step* step) {
    std::lock_guard<std::mutex> lock(mu_);
    Schedule& s = scheduleOf(shape, epoch, trialsEach, candidates);
    if (!s.measures()) return false;
    s.advance(step);
    return true;
  }

  // Whether calls of this shape are measured (starts its schedule as next() would).
  template <typename CandidatesFn>
  bool measures(const CallShape& shape, uint64_t epoch, int trialsEach, CandidatesFn&& candidates) {
    std::lock_guard<std::mutex> lock(mu_);
    return scheduleOf(shape, epoch, trialsEach, candidates).measures();
  }

  // This rank's time of a call next() planned.
  void record(const CallShape& shape, const Step& step, double seconds);
  // This rank's recent counted calls, RecentTimes::kRecent slots per candidate (0 where a slot
  // is empty): what the ranks agree on after a round, slot by slot.
  std::vector<double> samples(const CallShape& shape);
  // The agreed samples (each slot's slowest rank): each candidate's median decides; the trial
  // settles, a check keeps or moves the choice, a watch compares the choice with its usual
  // time. True when the choice settled or moved, the first kChangesSaid times (logged).
  bool decide(const CallShape& shape, const std::vector<double>& agreed);

  // What auto runs for this shape and why, or "" where the shape has no schedule under `epoch`
  // (not called since the model's inputs changed, or not measured).
  std::string describe(const CallShape& shape, uint64_t epoch);
  // The algorithm the shape's next call outside a round runs (its choice, or the trial's
  // candidate under way), or "" where the shape has no schedule under `epoch` or is not measured.
  std::string running(const CallShape& shape, uint64_t epoch);

 private:
  // Twice the in-process intervals: every check also costs an agreement (a small allreduce).
  static constexpr uint64_t kBaseInterval = 64, kMaxInterval = 4096;
  static constexpr uint64_t kWatchInterval = 64;
  static constexpr size_t kMaxShapes = 4096;  // a program of ever new sizes stays bounded
  static constexpr int kChangesSaid = 10;     // logged per shape

  enum class Round { kTrial, kCheck, kWatch };

  struct Schedule {
    Schedule(std::vector<AutoCandidate> c, uint64_t e, int each);
    bool measures() const { return candidates.size() > 1 && trialsEach > 0; }
    void advance(Step* step);
    void startRound(Round kind, std::vector<size_t> order, int callsEach,
                    int unfairCalls = kUnfairCalls);
    // After the agreement (decide(), `agreed` filled in): the trial's or a check's; true when
    // the choice settled or moved.
    bool settle();
    bool judgeCheck();
    // The round's candidates and the choice: the one whose agreed estimate is lowest.
    size_t fastestOfRound() const;
    // After a watch's agreement: the choice's recent calls, each slot's slowest rank.
    void watch(const RecentTimes& choice);
    void raceReserves();
    bool anotherRaces() const;  // a candidate other than the choice is racing
    // The candidate that runs: the choice, or during the trial the one whose turn it is.
    size_t running() const {
      return current >= 0 ? static_cast<size_t>(current)
                          : round[std::min(roundPos, round.size() - 1)];
    }

    std::vector<AutoCandidate> candidates;  // the near ties first, then the reserves
    std::vector<RecentTimes> times;
    std::vector<bool> racing;    // the near ties; a reserve from a slowdown to a lost check
    bool onceToCome = false;     // the reserves checkedOnce still wait for that check
    bool onceCheck = false;      // the check under way is that one
    bool onceRetried = false;    // a reserve that lost it has its second check (to come)
    uint64_t onceDelay = 0;      // calls after kOnceAfter(Cheap) before the second
    bool watched = true;         // its calls priced at kMinModelSeconds or more
    uint64_t calls = 0;          // of this shape, on every rank alike
    std::vector<double> agreed;  // each candidate's estimate from the last agreed samples
    uint64_t epoch = 0;
    int trialsEach = 0;
    int current = -1;  // the choice, once the trial is decided
    // The round under way (the trial, or a check): the candidates to run in turn, calls each.
    Round kind = Round::kTrial;
    std::vector<size_t> round;
    size_t roundPos = 0;
    int roundCallsEach = 0, callsIntoTurn = 0;
    int roundUnfairCalls = kUnfairCalls;  // of each turn, not counted
    std::vector<bool> ran;                // each candidate ran a call of this shape
    uint64_t untilCheck = 0;              // the choice's calls before the next check
    uint64_t untilWatch = 0;              // the choice's calls before the next watch agreement
    uint64_t interval = kBaseInterval;
    int choiceStreak = 0;  // the choice's calls in a row since the last round
    // The choice's usual time: a moving average of its agreed estimate at each watch
    // (kLevelWeight), which a slowdown by kCloseRatio resets; 0 until the first.
    double level = 0;
    bool firstWindowSlow = false;  // a lone near tie's first calls ran over the model's kWidenRatio
    int changesSaid = 0;
  };

  template <typename CandidatesFn>
  Schedule& scheduleOf(const CallShape& shape, uint64_t epoch, int trialsEach,
                       CandidatesFn& candidates) {
    auto it = shapes_.find(shape);
    if (it == shapes_.end() || it->second.epoch != epoch) {
      if (shapes_.size() >= kMaxShapes) shapes_.clear();
      it = shapes_.insert_or_assign(shape, Schedule(candidates(), epoch, trialsEach)).first;
    }
    return it->second;
  }

  std::mutex mu_;
  std::unordered_map<CallShape, Schedule, CallShapeHash> shapes_;
};

}  // namespace pycollective

#include "comm/agreed_choice.h"

#include <algorithm>

namespace pycollective {

AgreedChoices::Schedule::Schedule(std::vector<AutoCandidate> c, uint64_t e, int each)
    : candidates(std::move(c)), epoch(e), trialsEach(each) {
  // Calls priced under kMinModelSeconds are not watched (those under 5 us come here only from a
  // crowded host, agreed_auto.cc): the watch's agreement every kWatchInterval calls, and the checks
  // that the scatter of such calls (+-30% with 4 ranks on 2 vCPUs) sets off, cost more than a
  // choice's drift over a few thousand calls of microseconds, and the checks every kMaxInterval
  // calls at most follow the machine. The reserves a watch would call up are dropped, and those
  // checkedOnce race from the trial on: a few calls of 20-40 us cost less there than the choice
  // that waited kOnceAfter calls for their check (3 processes x 8 KiB on 2 vCPUs: `staged`,
  // priced 1.7x `slots`, ran 0.6x-0.8x its time).
  for (const AutoCandidate& a : candidates) watched = watched && a.modelSeconds >= kMinModelSeconds;
  if (!watched) {
    std::vector<AutoCandidate> racers;
    for (size_t i = 0; i < candidates.size() && racers.size() < kMaxCandidates; ++i)
      if (!candidates[i].reserve || checkedOnce(candidates, i)) racers.push_back(candidates[i]);
    for (AutoCandidate& a : racers) a.reserve = false;
    candidates = std::move(racers);
  }
  times.resize(candidates.size());
  racing.assign(candidates.size(), false);
  ran.assign(candidates.size(), false);
  size_t nearTies = 0;
  while (nearTies < candidates.size() && !candidates[nearTies].reserve) racing[nearTies++] = true;
  // The reserves priced near the window have one check to come, after kOnceAfter calls.
  for (size_t i = nearTies; i < candidates.size(); ++i)
    onceToCome = onceToCome || checkedOnce(candidates, i, kOnceWindowAcross);
  if (!measures()) return;
  if (nearTies > 1) {
    std::vector<size_t> all(nearTies);
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    startRound(Round::kTrial, std::move(all), kUnfairCalls + trialsEach);
    return;
  }
  // A lone near tie: nothing to race, but watched from its first calls (its first usual time
  // against the model's price), so that the reserves can be raced should the machine change.
  current = 0;
  untilCheck = kBaseInterval;
  untilWatch = kUnfairCalls + RecentTimes::kRecent;
}

void AgreedChoices::Schedule::startRound(Round k, std::vector<size_t> order, int callsEach,
                                         int unfairCalls) {
  kind = k;
  round = std::move(order);
  roundPos = 0;
  roundCallsEach = callsEach;
  roundUnfairCalls = unfairCalls;
  callsIntoTurn = 0;
}

bool AgreedChoices::Schedule::anotherRaces() const {
  for (size_t i = 0; i < candidates.size(); ++i)
    if (racing[i] && static_cast<int>(i) != current) return true;
  return false;
}

void AgreedChoices::Schedule::advance(Step* step) {
  const bool roundUnderWay = roundPos < round.size();
  const uint64_t onceAfter =
      current >= 0 && candidates[static_cast<size_t>(current)].modelSeconds < kCheapCallSeconds
          ? kOnceAfterCheap
          : kOnceAfter;
  if (++calls >= onceAfter + onceDelay && onceToCome && !roundUnderWay && current >= 0) {
    // Their one check starts now (judgeCheck() sends back every reserve that did not win).
    for (size_t i = 0; i < candidates.size(); ++i)
      if (checkedOnce(candidates, i, kOnceWindowAcross)) racing[i] = true;
    onceToCome = false;
    onceCheck = true;
    // After the choice's next calls, counted so that the check weighs fresh ones.
    untilCheck = std::min<uint64_t>(untilCheck, RecentTimes::kRecent);
  }
  if (!roundUnderWay && untilCheck == 0 && anotherRaces()) {
    // The choice has had its calls: each other racing candidate runs a few, judged by those
    // alone (older ones, from before the machine changed, would outvote them).
    std::vector<size_t> others;
    bool cold = false;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (racing[i] && static_cast<int>(i) != current) {
        others.push_back(i);
        times[i] = RecentTimes();
        cold = cold || !ran[i];
      }
    const int unfair = kUnfairCalls + (cold ? kColdCalls : 0);
    startRound(Round::kCheck, std::move(others), unfair + kCheckCalls, unfair);
  }
  if (roundPos < round.size()) {
    step->candidate = round[roundPos];
    step->counted = callsIntoTurn >= roundUnfairCalls;
    if (++callsIntoTurn == roundCallsEach) {
      callsIntoTurn = 0;
      ++roundPos;
    }
    step->closesRound = roundPos == round.size();
    choiceStreak = 0;
  } else {
    step->candidate = static_cast<size_t>(current);
    // Only the calls the next check or watch reads are counted (their last RecentTimes::kRecent):
    // the others need not pay for two clock reads and a record (a lock and a lookup).
    const bool checkReads = untilCheck <= RecentTimes::kRecent && anotherRaces();
    const bool watchReads = watched && untilWatch <= RecentTimes::kRecent;
    step->counted = choiceStreak >= kUnfairCalls && (checkReads || watchReads);
    ++choiceStreak;
    if (untilCheck > 0) --untilCheck;
    step->closesRound = false;
    if (watched && --untilWatch == 0) {
      untilWatch = kWatchInterval;
      // A check that starts with the next call reads these calls itself.
      if (!(untilCheck == 0 && anotherRaces())) {
        kind = Round::kWatch;
        step->closesRound = true;
      }
    }
  }
  ran[step->candidate] = true;
  step->algo = candidates[step->candidate].algo;
}

void AgreedChoices::record(const CallShape& shape, const Step& step, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || !step.counted || step.candidate >= it->second.times.size()) return;
  it->second.times[step.candidate].add(seconds);
}

std::vector<double> AgreedChoices::samples(const CallShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out;
  auto it = shapes_.find(shape);
  if (it == shapes_.end()) return out;
  out.assign(it->second.times.size() * RecentTimes::kRecent, 0.0);
  for (size_t i = 0; i < it->second.times.size(); ++i) {
    const RecentTimes& t = it->second.times[i];
    for (int j = 0; j < t.filled(); ++j) out[i * RecentTimes::kRecent + j] = t.value(j);
  }
  return out;
}

bool AgreedChoices::decide(const CallShape& shape, const std::vector<double>& samples) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || samples.size() != it->second.times.size() * RecentTimes::kRecent)
    return false;
  Schedule& s = it->second;
  // Every rank filled the same slots: its counted calls are the same calls.
  std::vector<RecentTimes> slowest(s.times.size());
  s.agreed.clear();
  for (size_t i = 0; i < s.times.size(); ++i) {
    for (int j = 0; j < s.times[i].filled(); ++j)
      slowest[i].add(samples[i * RecentTimes::kRecent + j]);
    s.agreed.push_back(slowest[i].estimate());
  }
  if (s.kind == Round::kWatch) {
    s.watch(slowest[static_cast<size_t>(s.current)]);
    return false;
  }
  const bool changed = s.current < 0 ? s.settle() : s.judgeCheck();
  s.untilCheck = s.interval;
  s.untilWatch = kWatchInterval;
  return changed && ++s.changesSaid <= kChangesSaid;
}

size_t AgreedChoices::Schedule::fastestOfRound() const {
  size_t best = round.empty() ? static_cast<size_t>(current) : round[0];
  for (size_t i : round)
    if (agreed[i] < agreed[best]) best = i;
  if (current >= 0 && agreed[static_cast<size_t>(current)] < agreed[best])
    best = static_cast<size_t>(current);
  return best;
}

bool AgreedChoices::Schedule::settle() {
  const size_t best = fastestOfRound();
  current = agreed[0] <= kMoveMargin * agreed[best] ? 0 : static_cast<int>(best);
  level = agreed[static_cast<size_t>(current)];
  // A trial on a machine already slowed takes the slow time for the usual one, and the
  // reserves would wait for a further kWidenRatio that never comes; the model prices the
  // machine at its usual speed.
  if (level > kWidenRatio * candidates[static_cast<size_t>(current)].modelSeconds) raceReserves();
  return true;
}

bool AgreedChoices::Schedule::judgeCheck() {
  const size_t best = fastestOfRound();
  bool moved = false;
  if (kMoveMargin * agreed[best] < agreed[static_cast<size_t>(current)]) {
    current = static_cast<int>(best);
    interval = kBaseInterval;
    level = agreed[best];
    moved = true;
  } else {
    interval = std::min(2 * interval, kMaxInterval);
    // A reserve checked once that ran within kWidenRatio of the choice may have run on its
    // warm-up: one more check, after as many calls again.
    for (size_t i = 0; i < candidates.size() && onceCheck && !onceRetried; ++i)
      if (racing[i] && checkedOnce(candidates, i, kOnceWindowAcross) &&
          agreed[i] <= kWidenRatio * agreed[static_cast<size_t>(current)]) {
        onceToCome = onceRetried = true;
        onceDelay = calls;
      }
  }
  onceCheck = false;
  // A reserve that did not win goes back to waiting: racing on, it would keep costing checks of
  // calls kWidenRatio or more slower.
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].reserve) racing[i] = static_cast<int>(i) == current;
  return moved;
}

void AgreedChoices::Schedule::watch(const RecentTimes& choice) {
  if (choice.filled() == 0) return;
  const double now = choice.estimate();
  if (level <= 0) {  // a lone near tie's first counted calls
    const bool slow = now > kWidenRatio * candidates[static_cast<size_t>(current)].modelSeconds;
    if (slow && !firstWindowSlow) {
      // The first calls may still be warming up (fresh pages for the outputs, the peers'
      // buffers pinned the first time; longer on a freshly booted VM, whose memory the host
      // has yet to back): the next kRecent calls say whether the machine is slow. Raced on the
      // warm-up, a reserve ran 1.4x slower than the choice until the next check (CI, 2 ranks
      // x 2 MiB: `staged` by reads 496 us in its first calls, 285 us after them).
      firstWindowSlow = true;
      untilWatch = RecentTimes::kRecent;
      return;
    }
    level = now;
    if (slow) {
      raceReserves();
      untilCheck = 0;
    }
    return;
  }
  // Slowed when every one of its last calls ran slower, its fastest too (the first calls after
  // other work pay for it for a few calls; that is not the machine changing).
  const double fastest = choice.fastest();
  if (fastest > kWidenRatio * level) raceReserves();
  if (fastest > kCloseRatio * level) {
    // What was slower may not be now: every other racing candidate is checked with the next
    // call, and the choice's new pace is its usual one from here.
    untilCheck = 0;
    interval = kBaseInterval;
    level = now;
    return;
  }
  level += kLevelWeight * (now - level);
}

void AgreedChoices::Schedule::raceReserves() {
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].reserve) racing[i] = true;
  onceToCome = false;  // this check is the one they were waiting for
}

std::string AgreedChoices::running(const CallShape& shape, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || it->second.epoch != epoch || !it->second.measures()) return "";
  return it->second.candidates[it->second.running()].algo;
}

std::string AgreedChoices::describe(const CallShape& shape, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || it->second.epoch != epoch || !it->second.measures()) return "";
  const Schedule& s = it->second;
  const bool settled = s.current >= 0;
  // Settled: the times every rank agreed on; during the trial, this rank's so far.
  std::vector<double> shown = s.agreed;
  if (!settled || shown.size() != s.candidates.size()) {
    shown.clear();
    for (const RecentTimes& t : s.times) shown.push_back(t.estimate());
  }
  const size_t runs = s.running();
  return describeRacing(s.candidates, shown, s.racing, runs, settled, /*watched=*/true) +
         (settled && !s.agreed.empty() ? " [agreed by every rank: each call's slowest rank]" : "");
}

}  // namespace pycollective

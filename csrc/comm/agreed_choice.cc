#include "comm/agreed_choice.h"

#include <algorithm>

namespace pycollective {

AgreedChoices::Schedule::Schedule(std::vector<AutoCandidate> c, uint64_t e, int each)
    : candidates(std::move(c)), epoch(e), trialsEach(each) {
  double cheapest = 0;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (i == 0 || candidates[i].modelSeconds < cheapest) cheapest = candidates[i].modelSeconds;
  if (candidates.size() > 1 && cheapest < kMinModelSeconds) candidates.resize(1);
  times.resize(candidates.size());
  if (!measures()) return;
  std::vector<size_t> all(candidates.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  startRound(std::move(all), kUnfairCalls + trialsEach);
}

void AgreedChoices::Schedule::startRound(std::vector<size_t> order, int callsEach) {
  round = std::move(order);
  roundPos = 0;
  roundCallsEach = callsEach;
  callsIntoTurn = 0;
}

void AgreedChoices::Schedule::advance(Step* step) {
  if (roundPos == round.size() && untilCheck == 0) {
    // The choice has had its calls: each other candidate runs a few, judged by those alone
    // (older ones, from before the machine changed, would outvote them).
    std::vector<size_t> others;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (static_cast<int>(i) != current) {
        others.push_back(i);
        times[i] = RecentTimes();
      }
    startRound(std::move(others), kUnfairCalls + kCheckCalls);
  }
  if (roundPos < round.size()) {
    step->candidate = round[roundPos];
    step->counted = callsIntoTurn >= kUnfairCalls;
    if (++callsIntoTurn == roundCallsEach) {
      callsIntoTurn = 0;
      ++roundPos;
    }
    step->closesRound = roundPos == round.size();
    choiceStreak = 0;
  } else {
    step->candidate = static_cast<size_t>(current);
    // Only the calls the next check reads are counted (its last RecentTimes::kRecent): the
    // others need not pay for two clock reads and a record (a lock and a lookup).
    step->counted = choiceStreak >= kUnfairCalls && untilCheck <= RecentTimes::kRecent;
    step->closesRound = false;
    ++choiceStreak;
    --untilCheck;
  }
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
  std::vector<double>& agreed = s.agreed;
  agreed.clear();
  for (size_t i = 0; i < s.times.size(); ++i) {
    RecentTimes slowest;
    for (int j = 0; j < s.times[i].filled(); ++j)
      slowest.add(samples[i * RecentTimes::kRecent + j]);
    agreed.push_back(slowest.estimate());
  }
  size_t best = 0;
  for (size_t i = 1; i < agreed.size(); ++i)
    if (agreed[i] < agreed[best]) best = i;
  bool changed = false;
  if (s.current < 0) {
    s.current = agreed[0] <= kMoveMargin * agreed[best] ? 0 : static_cast<int>(best);
    changed = true;
  } else if (kMoveMargin * agreed[best] < agreed[static_cast<size_t>(s.current)]) {
    s.current = static_cast<int>(best);
    s.interval = kBaseInterval;
    changed = true;
  } else {
    s.interval = std::min(2 * s.interval, kMaxInterval);
  }
  s.untilCheck = s.interval;
  return changed && ++s.changesSaid <= kChangesSaid;
}

std::string AgreedChoices::describe(const CallShape& shape, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || it->second.epoch != epoch || !it->second.measures()) return "";
  const Schedule& s = it->second;
  const bool settled = s.current >= 0;
  // Settled: the times every rank agreed on; during the trial, this rank's so far.
  std::vector<double> shown = s.agreed;
  if (!settled) {
    shown.clear();
    for (const RecentTimes& t : s.times) shown.push_back(t.estimate());
  }
  const size_t runs =
      settled ? static_cast<size_t>(s.current) : s.round[std::min(s.roundPos, s.round.size() - 1)];
  return describeMeasured(s.candidates, shown, runs, settled) +
         (settled ? " [agreed by every rank: each call's slowest rank]" : "");
}

}  // namespace pycollective

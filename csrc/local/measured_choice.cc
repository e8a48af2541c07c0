#include "local/measured_choice.h"

#include <algorithm>

namespace pycollective {

MeasuredChoices::Trial::Trial(std::vector<Candidate> c, uint64_t e, int each)
    : candidates(std::move(c)), timings(candidates.size()), epoch(e), trialsEach(each) {
  while (nearTies < candidates.size() && !candidates[nearTies].reserve) ++nearTies;
  for (size_t i = 0; i < nearTies; ++i) timings[i].racing = true;
  // The reserves priced near the window have one check to come (raceOnce), where calls are
  // timed at all.
  for (size_t i = nearTies; i < candidates.size(); ++i)
    onceToCome = onceToCome || (timed() && checkedOnce(candidates, i));
  if (nearTies <= 1 || trialsEach <= 0) current = 0;
}

std::string MeasuredChoices::Trial::next(bool* timeIt) {
  *timeIt = timed();
  if (!*timeIt) return candidates[0].algo;  // nothing to measure: the model's pick
  if (!settled()) return candidates[turn].algo;
  if (++calls == kOnceAfter && onceToCome) raceOnce();
  if (checking < 0 && confirming < 0) {
    // The most overdue other candidate, if one is due, starts its check.
    for (size_t i = 0; i < candidates.size(); ++i)
      if (timings[i].racing && static_cast<int>(i) != current && timings[i].due <= calls &&
          (checking < 0 || timings[i].due < timings[static_cast<size_t>(checking)].due))
        checking = static_cast<int>(i);
    // Judged by this check's calls alone: older ones may date from before the machine changed,
    // or from a trial that caught it slow (2 x 2 MiB right after the benchmark's `inline` row:
    // halving-doubling timed at 258 and 278 us in two trials, 113-139 us in its own rows).
    if (checking >= 0) timings[static_cast<size_t>(checking)].times = RecentTimes();
  }
  return candidates[static_cast<size_t>(checking >= 0 ? checking : current)].algo;
}

bool MeasuredChoices::Trial::record(const std::string& algo, double seconds) {
  size_t i = 0;
  while (i < candidates.size() && candidates[i].algo != algo) ++i;
  if (i == candidates.size()) return false;
  // A call right after another algorithm's is not a fair sample: it pays for what the other
  // left behind (caches, the replica threads' state; 2 x 2 MiB of `direct` took 392-459 us
  // right after other algorithms' calls, 190-235 in a row; 8 x 512 KiB of `inline` 607, 545,
  // 523, then 380-440 after halving-doubling), and a training loop runs one algorithm call
  // after call. The shape's first call is such a call too (outputs touched the first time).
  streak = static_cast<int>(i) == last ? streak + 1 : 0;  // last is -1 before the first call
  last = static_cast<int>(i);
  if (streak < kUnfairCalls) return false;  // the next call runs it again
  timings[i].times.add(seconds);
  if (!settled()) {
    if (timings[turn].times.count() < trialsEach) return false;
    for (size_t j = 0; j < nearTies; ++j)
      if (timings[j].times.count() < trialsEach) {
        turn = j;
        return false;
      }
    settle();
    return true;
  }
  if (static_cast<int>(i) == current) {
    if (confirming < 0) {
      watchForSlowdown();
      return false;
    }
    return timings[i].times.count() >= kCheckCalls && confirm();
  }
  if (static_cast<int>(i) != checking || timings[i].times.count() < kCheckCalls) return false;
  checking = -1;
  judge(i);
  return false;
}

void MeasuredChoices::Trial::settle() {
  size_t best = 0;
  for (size_t i = 1; i < nearTies; ++i)
    if (timings[i].estimate() < timings[best].estimate()) best = i;
  current =
      timings[0].estimate() <= kMoveMargin * timings[best].estimate() ? 0 : static_cast<int>(best);
  startLevel(timings[static_cast<size_t>(current)].estimate());
  // The trial was every near tie's first check: one that ran slower than the choice there has
  // survived it and waits as after any check it lost (the benchmark times a shape's first ~250
  // calls after its trial, and checks at 32, 96 and 224 calls of three rivals 1.16x-1.61x slower
  // cost 8 replicas x 2 MiB 1.1x-1.2x there). One faster, but within kMoveMargin of the model's
  // pick that stays, is checked soon.
  for (size_t i = 0; i < timings.size(); ++i) {
    if (i < nearTies && static_cast<int>(i) != current &&
        timings[i].estimate() > timings[static_cast<size_t>(current)].estimate())
      waitLonger(i);
    else
      timings[i].due = calls + timings[i].interval;
  }
}

void MeasuredChoices::Trial::startLevel(double seconds) {
  level = seconds;
  // A trial that ran on a machine already slowed (a process started while the vCPUs were
  // apart) takes the slow time for the usual one, and the reserves would wait for a further
  // kWidenRatio that never comes. The model prices the machine at its usual speed: a choice
  // that runs that much slower than its price has them raced once; a check sends them back.
  if (level > kWidenRatio * candidates[static_cast<size_t>(current)].modelSeconds) raceReserves();
}

void MeasuredChoices::Trial::raceReserves() {
  for (size_t i = nearTies; i < candidates.size(); ++i) timings[i].racing = true;
  onceToCome = false;  // this check is the one they were waiting for
}

void MeasuredChoices::Trial::raceOnce() {
  onceToCome = false;
  for (size_t i = nearTies; i < candidates.size(); ++i)
    if (checkedOnce(candidates, i)) {
      timings[i].racing = true;
      timings[i].due = calls;
    }
}

void MeasuredChoices::Trial::watchForSlowdown() {
  const double now = timings[static_cast<size_t>(current)].estimate();
  if (level <= 0) startLevel(now);  // a lone racer's first counted calls
  // Slowed when every one of its last calls ran slower, its fastest too: the first calls after
  // other work (a benchmark's other rows, a training step's compute) pay for it, 1.2x-2x slower
  // for a few calls, and their median took that for a machine that changed (4 replicas x 4 MiB
  // in the benchmark's rounds: every rival checked, and the reserves raced, at each round).
  const double fastestOfLast = timings[static_cast<size_t>(current)].times.fastest();
  if (fastestOfLast > kWidenRatio * level) {
    // Far slower than usual: not noise but a machine that changed under it (the VM's two vCPUs
    // moved apart: ring and halving-doubling 4-6x slower, `direct` and `inline` as before). The
    // reserves race until a check finds them no faster.
    raceReserves();
  }
  if (fastestOfLast > kCloseRatio * level) {
    // The choice slowed down: the machine changed, and what was slower may not be now. Every
    // other candidate is checked again at once; none replaces the choice on times taken before
    // the change (all of them may have slowed alike).
    for (size_t i = 0; i < candidates.size(); ++i)
      if (timings[i].racing && static_cast<int>(i) != current) {
        timings[i].interval = kBaseInterval;
        timings[i].due = calls + 1;
      }
    level = now;
    return;
  }
  level += kLevelWeight * (now - level);
}

void MeasuredChoices::Trial::judge(size_t checked) {
  Timings& now = timings[static_cast<size_t>(current)];
  if (kMoveMargin * timings[checked].estimate() < now.estimate()) {
    // Faster than the choice's calls before it; the choice's calls after it decide. On 2 vCPUs
    // the machine's pace swings 1.5x over tens of calls (4 replicas x 4 MiB: halving-doubling
    // 900-2800 us in one row of a script timing the benchmark's pattern), and a rival checked as it
    // sped up, or after the choice's calls paid for other work (a benchmark's other rows, a
    // training step's compute), looked faster than a choice it was not faster than: auto moved
    // between the four near ties there every few dozen calls.
    confirming = static_cast<int>(checked);
    choiceBefore = now.estimate();
    now.times = RecentTimes();
    return;
  }
  lost(checked);
}

bool MeasuredChoices::Trial::confirm() {
  const size_t checked = static_cast<size_t>(confirming);
  confirming = -1;
  Timings& now = timings[static_cast<size_t>(current)];
  Timings& other = timings[checked];
  // Faster than the choice both before and after its check: the choice's better window.
  if (kMoveMargin * other.estimate() < std::min(choiceBefore, now.estimate())) {
    now.interval = kBaseInterval;  // the old choice was close a moment ago: watch it
    now.due = calls + kBaseInterval;
    current = static_cast<int>(checked);
    level = other.estimate();
    return true;
  }
  lost(checked);
  return false;
}

void MeasuredChoices::Trial::lost(size_t checked) {
  // A reserve that lost goes back to waiting: racing on, it would keep costing checks of calls
  // 1.3x-2x slower (in-process 2 x 4 MiB, a loop of `auto` in calm stretches: 1.08x the best
  // on average with reserves that raced on for good, 1.02x with a lost check sending them back).
  if (candidates[checked].reserve) {
    timings[checked].racing = false;
    return;
  }
  waitLonger(checked);
}

void MeasuredChoices::Trial::waitLonger(size_t rival) {
  Timings& other = timings[rival];
  // Each check the choice survives makes the next one rarer, so that keeping watch costs ever
  // less while the machine stays as it is (a slowdown of the choice starts them over). A rival
  // that ran kCloseRatio slower waits twice as long again: its checks cost the most, and the
  // machine would have to change for it to win, which the slowdown watch sees.
  const bool farBehind =
      other.estimate() >= kCloseRatio * timings[static_cast<size_t>(current)].estimate();
  other.interval = std::min((farBehind ? 4 : 2) * other.interval, kMaxInterval);
  other.due = calls + other.interval;
}

bool MeasuredChoices::record(const CallShape& shape, const std::string& algo, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || !it->second.record(algo, seconds)) return false;
  return ++it->second.changesSaid <= kChangesSaid;
}

std::string MeasuredChoices::describe(const CallShape& shape, uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shapes_.find(shape);
  if (it == shapes_.end() || it->second.epoch != epoch) return "";
  const Trial& t = it->second;
  std::vector<double> estimates;
  std::vector<bool> racing;
  for (const Timings& timing : t.timings) {
    estimates.push_back(timing.estimate());
    racing.push_back(timing.racing);
  }
  const size_t runs = t.settled() ? static_cast<size_t>(t.current) : t.turn;
  return describeRacing(t.candidates, estimates, racing, runs, t.settled(), t.timed());
}

}  // namespace pycollective

// auto's measured choice across processes (comm/agreed_choice.h), driven by made-up timings on
// simulated ranks, each with its own AgreedChoices and its own view of the times: every rank
// must run the same algorithm on every call whatever its clock says (ranks that ran different
// algorithms would fail the call), the trial settles on the candidate whose calls ran fastest
// on their slowest rank (a near tie stays the model's), checks cost little, and the choice moves
// when the machine changes.
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/agreed_choice.h"
#include "expect.h"

using namespace pycollective;

namespace {

struct Ranks {
  std::vector<AgreedChoices> choices;
  CallShape shape;
  std::vector<AutoCandidate> candidates;
  // What a call of each algorithm takes on each rank now.
  std::vector<std::map<std::string, double>> seconds;
  int trialsEach = 2;
  int rounds = 0;  // agreements so far
  // Where set, a counted call's time on every rank from (algorithm, its place among the counted
  // calls of its run, the usual time).
  std::function<double(const std::string&, int, double)> adjust;
  std::string runAlgo;
  int countedInRun = 0;
  bool divergent = false;

  explicit Ranks(int n) : choices(n), seconds(n) { shape.count = 1024; }

  // One call on every rank; returns the algorithm they all ran ("" if they differed, or if
  // nothing was measured).
  std::string call() {
    std::vector<AgreedChoices::Step> steps(choices.size());
    for (size_t r = 0; r < choices.size(); ++r)
      if (!choices[r].next(shape, 0, trialsEach, [&] { return candidates; }, &steps[r])) return "";
    for (size_t r = 1; r < steps.size(); ++r)
      if (steps[r].algo != steps[0].algo || steps[r].closesRound != steps[0].closesRound)
        divergent = true;
    // A counted call's position in its run of counted calls of one algorithm (0 first).
    countedInRun = steps[0].algo == runAlgo ? countedInRun : 0;
    runAlgo = steps[0].algo;
    for (size_t r = 0; r < choices.size(); ++r) {
      double t = seconds[r].at(steps[r].algo);
      if (adjust && steps[r].counted) t = adjust(steps[r].algo, countedInRun, t);
      choices[r].record(shape, steps[r], t);
    }
    if (steps[0].counted) ++countedInRun;
    if (steps[0].closesRound) {  // the allreduce (max) every rank runs after the round
      std::vector<double> agreed = choices[0].samples(shape);
      for (auto& c : choices) {
        const std::vector<double> mine = c.samples(shape);
        EXPECT(mine.size() == agreed.size(), "ranks hold %zu and %zu samples", mine.size(),
               agreed.size());
        for (size_t i = 0; i < agreed.size() && i < mine.size(); ++i)
          agreed[i] = std::max(agreed[i], mine[i]);
      }
      for (auto& c : choices) c.decide(shape, agreed);
      ++rounds;
    }
    return divergent ? "" : steps[0].algo;
  }
  std::map<std::string, int> calls(int n) {
    std::map<std::string, int> ran;
    for (int i = 0; i < n; ++i) ++ran[call()];
    return ran;
  }
  std::string settledOn(size_t rank = 0) {
    const std::string s = choices[rank].describe(shape, 0);
    return s.substr(0, s.find(' '));
  }
  void setAll(const std::string& algo, double s) {
    for (auto& m : seconds) m[algo] = s;
  }
};

// Two candidates, the model's pick first, on `n` ranks, whose calls take `a` and `b` seconds.
Ranks twoCandidates(int n, double a, double b) {
  Ranks r(n);
  r.candidates = {{"halving_doubling", 100e-6}, {"ring", 110e-6}};
  r.setAll("halving_doubling", a);
  r.setAll("ring", b);
  return r;
}

}  // namespace

int main() {
  {  // The trial: four calls in a row of each (two not counted), one agreement, the faster.
    Ranks r = twoCandidates(2, 100e-6, 60e-6);
    auto trial = r.calls(8);
    EXPECT(trial["halving_doubling"] == 4 && trial["ring"] == 4, "trial ran %d + %d calls",
           trial["halving_doubling"], trial["ring"]);
    EXPECT(r.rounds == 1, "%d agreements after the trial", r.rounds);
    EXPECT(r.settledOn() == "ring", "settled on %s", r.settledOn().c_str());
    EXPECT(r.choices[1].describe(r.shape, 0).find("agreed by every rank") != std::string::npos,
           "%s", r.choices[1].describe(r.shape, 0).c_str());
    // Checks on a candidate 1.7x slower cost a few calls in a thousand.
    auto later = r.calls(4000);
    EXPECT(later["ring"] >= 3950, "the choice ran %d of 4000 calls", later["ring"]);
    EXPECT(later["halving_doubling"] >= 3, "the other candidate was never run again");
    EXPECT(!r.divergent, "ranks ran different algorithms");
  }
  {  // Ranks that see different times still run the same calls, and each call's slowest rank
     // decides: ring's calls end early on ranks 1 and 2 (as reduce_to_one's root is done
     // before the others have the result), but rank 0 waits 200 us for each.
    Ranks r = twoCandidates(3, 100e-6, 60e-6);
    r.seconds[0]["ring"] = 200e-6;
    r.seconds[2]["halving_doubling"] = 90e-6;
    r.calls(8 + 3000);
    EXPECT(!r.divergent, "ranks ran different algorithms");
    for (size_t k = 0; k < 3; ++k)
      EXPECT(r.settledOn(k) == "halving_doubling", "rank %zu settled on %s", k,
             r.settledOn(k).c_str());
  }
  {  // A near tie (within 1.1x) stays with the model's pick.
    Ranks r = twoCandidates(2, 100e-6, 95e-6);
    r.calls(8);
    EXPECT(r.settledOn() == "halving_doubling", "a near tie settled on %s", r.settledOn().c_str());
  }
  {  // The machine changes: the choice moves within the longest check interval.
    Ranks r = twoCandidates(2, 100e-6, 60e-6);
    r.calls(8 + 3000);
    r.setAll("halving_doubling", 30e-6);
    r.calls(4096 + 64);
    EXPECT(r.settledOn() == "halving_doubling", "still on %s after the change",
           r.settledOn().c_str());
    EXPECT(!r.divergent, "ranks ran different algorithms");
  }
  {  // A rival 1.2x slower whose checks each catch one lucky call does not take over: a check
     // is judged by the median of its counted calls (of two, the lower median was the lucky one).
    Ranks r = twoCandidates(2, 100e-6, 120e-6);
    r.adjust = [](const std::string& algo, int place, double t) {
      return algo == "ring" && place == 0 ? 0.4 * t : t;
    };
    r.calls(8);
    auto later = r.calls(6000);
    EXPECT(r.settledOn() == "halving_doubling", "a lucky call moved the choice to %s",
           r.settledOn().c_str());
    EXPECT(later["ring"] <= 150, "the 1.2x slower rival ran %d of 6000 calls", later["ring"]);
    EXPECT(!r.divergent, "ranks ran different algorithms");
  }
  {  // The watch: a choice that slows down is checked against the others at once, not after
     // the longest check interval; while nothing changes it costs one agreement per 64 calls.
    Ranks r = twoCandidates(2, 100e-6, 150e-6);
    r.calls(8);
    const int before = r.rounds;
    auto calm = r.calls(6000);
    EXPECT(r.rounds - before <= 6000 / 64 + 8, "%d agreements in 6000 calm calls",
           r.rounds - before);
    EXPECT(calm["ring"] <= 60, "the 1.5x slower rival ran %d of 6000 calm calls", calm["ring"]);
    r.setAll("halving_doubling", 400e-6);  // the choice now 2.7x slower than the rival
    r.calls(64 + 2 * 5 + 8);
    EXPECT(r.settledOn() == "ring", "64 calls after a 4x slowdown still on %s",
           r.settledOn().c_str());
    // A choice whose calls scatter (every fourth 1.5x slower) is not taken for one that slowed.
    Ranks noisy = twoCandidates(2, 100e-6, 150e-6);
    noisy.adjust = [](const std::string& algo, int place, double t) {
      return algo == "halving_doubling" && place % 4 == 0 ? 1.5 * t : t;
    };
    noisy.calls(8);
    auto scattered = noisy.calls(6000);
    EXPECT(scattered["ring"] <= 60, "a scattering choice had the rival run %d of 6000 calls",
           scattered["ring"]);
    EXPECT(!r.divergent && !noisy.divergent, "ranks ran different algorithms");
  }
  {  // Reserves: a lone near tie is watched, and the algorithms priced further off race only
     // once it runs far slower than usual (the VM's vCPUs apart), then go back to waiting.
    Ranks r(2);
    r.candidates = {{"halving_doubling", 100e-6},  // the reserves beyond kOnceWindowAcross
                    {"direct", 350e-6, false, /*reserve=*/true},
                    {"ring", 450e-6, false, /*reserve=*/true}};
    r.setAll("halving_doubling", 100e-6);
    r.setAll("direct", 150e-6);
    r.setAll("ring", 200e-6);
    auto calm = r.calls(3000);
    EXPECT(calm["halving_doubling"] == 3000, "the reserves ran %d calls with nothing changed",
           3000 - calm["halving_doubling"]);
    EXPECT(r.choices[0].describe(r.shape, 0).find("raced should they run") != std::string::npos,
           "%s", r.choices[0].describe(r.shape, 0).c_str());
    r.setAll("halving_doubling", 140e-6);
    auto slower = r.calls(500);
    EXPECT(slower["halving_doubling"] == 500, "a 1.4x slowdown raced the reserves (%d calls)",
           500 - slower["halving_doubling"]);
    r.setAll("halving_doubling", 500e-6);
    r.calls(64 + 2 * 5 + 8);
    EXPECT(r.settledOn() == "direct", "5x slower, still on %s", r.settledOn().c_str());
    r.setAll("halving_doubling", 100e-6);
    r.calls(5000);
    EXPECT(r.settledOn() == "halving_doubling", "after the recovery still on %s",
           r.settledOn().c_str());
    auto after = r.calls(3000);
    EXPECT(after["direct"] + after["ring"] == 0, "the reserves ran %d calls after the recovery",
           after["direct"] + after["ring"]);
    EXPECT(!r.divergent, "ranks ran different algorithms");
    // A process that starts while the machine is slow: its first usual time is the slow one,
    // which the model's price shows for what it is, once a second window of calls says the
    // same.
    Ranks apart(2);
    apart.candidates = r.candidates;
    apart.setAll("halving_doubling", 500e-6);
    apart.setAll("direct", 150e-6);
    apart.setAll("ring", 200e-6);
    apart.calls(2 + 4 + 4 + 2 * 5 + 8);
    EXPECT(apart.settledOn() == "direct", "started slow, still on %s", apart.settledOn().c_str());
    // First calls that only warm up (fresh pages) do not race the reserves.
    Ranks warming(2);
    warming.candidates = r.candidates;
    warming.setAll("halving_doubling", 500e-6);
    warming.setAll("direct", 150e-6);
    warming.setAll("ring", 200e-6);
    warming.calls(2 + 4);
    warming.setAll("halving_doubling", 110e-6);
    auto warmed = warming.calls(3000);
    EXPECT(warmed["halving_doubling"] == 3000, "a slow first window raced the reserves (%d calls)",
           3000 - warmed["halving_doubling"]);
    EXPECT(!warming.divergent, "ranks ran different algorithms");
  }
  {  // A reserve priced just outside the window (1.25x-2x the near ties) is checked once, after
     // the shape's first kOnceAfter calls: the model misses by that much (6 replicas x 1 MiB:
     // `direct` priced 1.25x over `inline` and measured 1.1x-1.2x faster), and by no more than that
     // would stay unseen.
    // Priced at a millisecond and more (kCheapCallSeconds): the check waits kOnceAfter calls.
    Ranks r(2);
    r.candidates = {{"inline", 5000e-6},
                    {"direct", 6300e-6, false, /*reserve=*/true},
                    {"ring", 16000e-6, false, /*reserve=*/true}};
    r.setAll("inline", 5500e-6);
    r.setAll("direct", 4700e-6);
    r.setAll("ring", 3000e-6);  // priced over 3x: waits for a slowdown, however fast it runs
    auto early = r.calls(kOnceAfter - 1);
    EXPECT(early["inline"] == kOnceAfter - 1, "%d calls of the reserves before their check",
           static_cast<int>(kOnceAfter - 1) - early["inline"]);
    auto check = r.calls(4 + 5 + 8);
    EXPECT(r.settledOn() == "direct", "the reserve 1.17x faster was not taken: %s",
           r.choices[0].describe(r.shape, 0).c_str());
    EXPECT(check["ring"] == 0, "the reserve priced over 3x ran %d calls", check["ring"]);
    auto later = r.calls(3000);
    EXPECT(later["direct"] >= 2950, "after the check direct ran %d of 3000 calls", later["direct"]);
    // One that runs no faster goes back to waiting after that check.
    Ranks slower(2);
    slower.candidates = r.candidates;
    slower.setAll("inline", 5000e-6);
    slower.setAll("direct", 6400e-6);
    slower.setAll("ring", 16000e-6);
    auto calm = slower.calls(3000);
    // Its first check, of a candidate the shape has not run (kColdCalls more not counted), and
    // as it ran within 2x of the choice, a second one: then it waits.
    EXPECT(calm["direct"] ==
               2 * (AgreedChoices::kUnfairCalls + kCheckCalls) + AgreedChoices::kColdCalls,
           "the reserve within 2x ran %d of 3000 calls, not two checks", calm["direct"]);
    EXPECT(!r.divergent && !slower.divergent, "ranks ran different algorithms");
    // Priced under a millisecond, the check comes after kOnceAfterCheap calls (2 ranks x 256
    // KiB on an EPYC VM: halving-doubling priced 1.53x `staged`, ran 2x faster).
    Ranks cheap(2);
    cheap.candidates = {{"staged", 34e-6},
                        {"halving_doubling", 52e-6, false, /*reserve=*/true},
                        {"ring", 100e-6, false, /*reserve=*/true}};
    cheap.setAll("staged", 40e-6);
    cheap.setAll("halving_doubling", 20e-6);
    cheap.setAll("ring", 25e-6);
    auto first = cheap.calls(kOnceAfterCheap - 1);
    EXPECT(first["staged"] == kOnceAfterCheap - 1, "%d calls of the reserves before their check",
           static_cast<int>(kOnceAfterCheap - 1) - first["staged"]);
    cheap.calls(4 + 2 * 9 + 8);  // both reserves within kOnceWindowAcross: 9 calls each
    EXPECT(cheap.settledOn() == "halving_doubling", "the reserve 2x faster was not taken: %s",
           cheap.choices[0].describe(cheap.shape, 0).c_str());
    EXPECT(!cheap.divergent, "ranks ran different algorithms");
    // Priced 2.1x the choice, within kOnceWindowAcross (2 ranks x 16 MiB on the EPYC VM:
    // halving-doubling priced 3.99 ms against `staged`'s 1.9, ran 2.3-2.6 ms against 3.1-3.2):
    // checked after kOnceAfterCheap calls, as the choice is priced under kCheapCallSeconds.
    Ranks wide(2);
    wide.candidates = {{"staged", 1900e-6},
                       {"halving_doubling", 3990e-6, false, /*reserve=*/true},
                       {"ring", 7000e-6, false, /*reserve=*/true}};
    wide.setAll("staged", 3200e-6);
    wide.setAll("halving_doubling", 2400e-6);
    wide.setAll("ring", 2000e-6);  // priced over 3x: not checked, however fast it runs
    auto before = wide.calls(kOnceAfterCheap - 1);
    EXPECT(before["staged"] == kOnceAfterCheap - 1, "%d calls of the reserves before the check",
           static_cast<int>(kOnceAfterCheap - 1) - before["staged"]);
    auto widened = wide.calls(4 + 9 + 8);
    EXPECT(wide.settledOn() == "halving_doubling", "the reserve priced 2.1x was not taken: %s",
           wide.choices[0].describe(wide.shape, 0).c_str());
    EXPECT(widened["ring"] == 0, "the reserve priced over 3x ran %d calls", widened["ring"]);
    EXPECT(!wide.divergent, "ranks ran different algorithms");
    // A reserve still warming up in its check (its counted calls 2.4x, 1.8x, 1.5x its settled
    // time: 2 ranks x 2 MiB in the benchmark) loses it, and wins the second one, which comes
    // after as many calls again; one 2x slower than the choice has no second.
    for (const double warmFactor : {1.0, 2.5}) {
      Ranks warming(2);
      warming.candidates = {{"staged", 240e-6},
                            {"halving_doubling", 373e-6, false, /*reserve=*/true},
                            {"ring", 800e-6, false, /*reserve=*/true}};  // over 3x
      warming.setAll("staged", 165e-6);
      warming.setAll("halving_doubling", 125e-6 * warmFactor);
      warming.setAll("ring", 300e-6);
      int hdTimes = 0;  // halving-doubling's counted times so far, on both ranks
      warming.adjust = [&hdTimes](const std::string& algo, int, double t) {
        if (algo != "halving_doubling") return t;
        const int counted = hdTimes++ / 2;  // the same call on each of the 2 ranks
        const double warm[] = {2.4, 1.8, 1.5};
        return counted < 3 ? t * warm[counted] : t;
      };
      const int firstCheck = AgreedChoices::kUnfairCalls + AgreedChoices::kColdCalls + kCheckCalls;
      auto lost = warming.calls(kOnceAfterCheap + RecentTimes::kRecent + firstCheck);
      EXPECT(warming.settledOn() == "staged", "won a check on its warm-up (factor %.1f): %s",
             warmFactor, warming.choices[0].describe(warming.shape, 0).c_str());
      auto second = warming.calls(2 * kOnceAfterCheap + 2 * firstCheck + 8);
      const bool retried = second["halving_doubling"] > 0;
      EXPECT(retried == (warmFactor == 1.0), "second check %s for a reserve %.1fx its settled time",
             retried ? "came" : "did not come", warmFactor);
      EXPECT(warming.settledOn() == (warmFactor == 1.0 ? "halving_doubling" : "staged"),
             "factor %.1f: settled on %s", warmFactor, warming.settledOn().c_str());
      EXPECT(!warming.divergent, "ranks ran different algorithms");
    }
  }
  {  // Calls priced under kMinModelSeconds (with several candidates: from 5 us, or any price on
     // a crowded host, algorithms/agreed_auto.cc): their reserves priced within 2x race from the
     // trial on, the others never run, and nothing is watched (an agreement a trial or a check).
    Ranks tiny(3);
    tiny.candidates = {{"slots", 12e-6},
                       {"staged", 20e-6, false, /*reserve=*/true},
                       {"ring", 40e-6, false, /*reserve=*/true}};
    tiny.setAll("slots", 15e-6);
    tiny.setAll("staged", 10e-6);
    tiny.setAll("ring", 5e-6);  // priced over 2x: never run, however fast
    const int each = AgreedChoices::kUnfairCalls + tiny.trialsEach;
    auto trial = tiny.calls(2 * each);
    EXPECT(trial["slots"] == each && trial["staged"] == each, "the trial ran slots %d, staged %d",
           trial["slots"], trial["staged"]);
    EXPECT(tiny.settledOn() == "staged", "settled on %s", tiny.settledOn().c_str());
    auto later = tiny.calls(3000);
    EXPECT(later["ring"] == 0, "the reserve priced over 2x ran %d calls", later["ring"]);
    EXPECT(later["staged"] >= 2950, "staged ran %d of 3000 calls", later["staged"]);
    // The trial's agreement and the checks, 64, 128, 256, ... calls apart: 6 in all.
    EXPECT(tiny.rounds <= 7, "%d agreements in 3000 calls", tiny.rounds);
    EXPECT(!tiny.divergent, "ranks ran different algorithms");
    Ranks one = twoCandidates(2, 100e-6, 60e-6);
    one.candidates.resize(1);
    EXPECT(one.call().empty(), "a single candidate was measured");
    Ranks none = twoCandidates(2, 100e-6, 60e-6);
    none.trialsEach = 0;
    EXPECT(none.call().empty(), "calls were measured without trials");
    EXPECT(none.choices[0].describe(none.shape, 0).empty(), "an unmeasured shape was described");
  }
  std::printf("%d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}

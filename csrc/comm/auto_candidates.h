#pragma once
// What algo="auto" times where it measures -- in-process replicas (local/measured_choice.h) and
// groups across processes (comm/agreed_choice.h): the algorithms the model prices near its best,
// and each one's recent calls.
#include <cstddef>
#include <string>
#include <vector>

#include "transport/frame.h"

namespace pycollective {

// The collectives with more than one algorithm to choose from (the others have one path each).
bool autoMeasures(CollectiveKind kind);

struct TunedChoice;

struct AutoCandidate {
  std::string algo;
  double modelSeconds = 0;
  bool tuned = false;  // the tuned table's entry (PYCOLLECTIVE_TUNING), not the model's pick
  // Priced too far from the best to race; timed only once the choice runs far slower than its
  // usual time, or its first timed calls than its price (in-process auto:
  // local/measured_choice.h).
  bool reserve = false;
  // Priced by a model of its own (in process, `inline`: one thread streaming through every
  // replica's buffers) rather than by the link costs that price the algorithms: its price and
  // theirs carry separate errors, and a near tie across the two takes kAcrossModelsWindow.
  bool ownModel = false;
};

// Where the model's pick lost to another algorithm in both passes of a sweep (sixteenth session,
// EPYC VM: 8 replicas x 1 MiB, in three runs of four), it had priced the two 1.05x apart; a 2x
// window also measured choices the model was sure of (2 x 64 MiB: `direct` against
// halving-doubling at 1.33x), and watching those slower calls cost 1-2% (docs/benchmarks-log.md).
constexpr double kCandidateWindow = 1.25;
// Two prices from separate models are a near tie within this. Their ratio carries both models'
// errors: on a Xeon VM the link costs priced `direct` 1.4x-1.6x above its measured time where
// `inline`'s streaming rates came within 10% of its own (6 replicas x 1 MiB: `direct` priced
// 630 us, 1.25x `inline`'s 503, and measured at 445-448 against 542-566, thirtieth session),
// and on an EPYC VM `inline` ran up to 1.43x faster than priced (twenty-second session). A
// ratio r is a trap when the errors, e, reach 1.15 r; 1.5 covers e up to 1.7, and keeps out
// the cells priced 1.55x-1.65x apart there and measured 1.2x-1.6x apart the same way (6 and 8
// replicas x 512 KiB, 7 and 8 x 1 MiB): a trial of the slower one is a few calls lost.
constexpr double kAcrossModelsWindow = 1.5;
constexpr size_t kMaxCandidates = 4;
// A candidate must run this much faster than the current choice to replace it (or the first
// candidate, in a trial): timed calls on a shared VM differ by a few percent at random, and a
// near tie keeps the choice.
constexpr double kMoveMargin = 1.1;
// Counted calls of another candidate per check once the choice is settled, judged by their
// median: an odd number, whose median is one of them. Of two, the estimate (the lower median)
// was the faster call, and one lucky call per check moved the choice to a slower rival.
constexpr int kCheckCalls = 3;
// Calls the model prices under this are not timed where timing is optional (a lone near tie's
// calls, timed only to call up its reserves should it slow; across processes the watch of a
// settled choice, comm/agreed_choice.cc, and every call priced under 5 us unless a host's ranks
// outnumber its cores, algorithms/agreed_auto.cc): the bookkeeping (a lock, a lookup, two clock
// reads) would show on a call of a few microseconds.
constexpr double kMinModelSeconds = 20e-6;
// The choice's calls, once settled, are watched against its usual time: all of its last calls
// this much slower (its fastest too: not a few calls that paid for other work) and the machine
// changed, so every other racing candidate is checked at once; this much slower and the
// reserves race as well (the VM's two vCPUs apart: the in-process link algorithms 4-6x slower).
constexpr double kCloseRatio = 1.3;
constexpr double kWidenRatio = 2.0;
// A slowdown is judged against the choice's usual time, not its fastest moment: with 4
// replicas on 2 vCPUs calls scatter +-30%, and a choice held to its fastest median looked
// slowed by 1.3x every few calls, each time checking every rival (in the test's model of it
// a rival 1.2x slower ran 23% of the calls, 11% with this). The usual time moves this far
// toward each new estimate.
constexpr double kLevelWeight = 1.0 / 16;

// Whether candidates[i] is a reserve priced within kWidenRatio of the cheapest near tie: checked
// once, after the shape's first kOnceAfter calls, then back to waiting like any reserve that
// lost. The window keeps near ties racing for good, and the model misses by more than its 1.25x:
// 6 replicas x 1 MiB on a Xeon VM priced `direct` at 630 us, 1.25x `inline`'s 503 and just out
// of the window, and measured it at 448-513 us against `inline`'s 542-562 (thirtieth session;
// that pair, of two models, races from the trial on since: kAcrossModelsWindow).
// Not sooner: calls of a reserve up to 2x slower cost most where calls are long and few (with
// the check at 32 calls, 5-8 replicas x 64 MiB ran 2.1x-2.3x `direct` in the benchmark's
// second look, which times a handful of calls), and after kOnceAfter calls its five calls are
// at most 4% of the shape's.
constexpr uint64_t kOnceAfter = 256;
// Between processes a choice priced under kCheapCallSeconds has that check after
// kOnceAfterCheap calls: the check's calls of a reserve (9 at most, each at most
// kOnceWindowAcross slower) cost tens of milliseconds once per shape, and the model's link
// costs can be wrong by more than 2x on a machine they were not measured on (an EPYC VM, 2
// ranks x 256 KiB: halving-doubling priced 52 us, 1.53x `staged`'s 34, ran 19-23 us against
// `staged`'s 39-52; waiting 256 calls, a benchmark's 100 timed calls never saw it; at 16 MiB
// `staged` priced 1.9 ms ran 1.21x-1.37x halving-doubling in sweeps whose 60-100 timed calls
// never reached the 256th).
constexpr uint64_t kOnceAfterCheap = 32;
constexpr double kCheapCallSeconds = 4e-3;
// Between processes that check takes the reserves priced within this of the near ties: the
// link costs, measured on another machine, priced halving-doubling at 2.5x-3x its time there
// (256 KiB-16 MiB; `staged` within 1.15x of its own), and at 16 MiB, priced 2.1x `staged`, it
// ran 1.2x-1.4x faster. A reserve 3x slower costs its check's calls once per shape.
constexpr double kOnceWindowAcross = 3.0;
// Whether candidates[i] is a reserve priced within `window` of the cheapest near tie.
bool checkedOnce(const std::vector<AutoCandidate>& candidates, size_t i,
                 double window = kWidenRatio);

// From every algorithm that can run a call, priced by the model: those within kCandidateWindow
// of the cheapest -- or, where the cheapest is priced by the other model (`ownModel`), of the
// cheapest of their own model and within kAcrossModelsWindow of the cheapest --, the cheapest
// first, at most kMaxCandidates. Where the tuned table has an
// entry for the call (`tuned`, or nullptr), that algorithm leads (a near tie stays with it) and
// the model's near ties race it: `pycollective tune` measured one size per row, into given
// outputs, at another time.
std::vector<AutoCandidate> nearCandidates(std::vector<AutoCandidate> priced,
                                          const TunedChoice* tuned);

// nearCandidates, then every other priced algorithm, cheapest first, marked `reserve`.
std::vector<AutoCandidate> candidatesWithReserves(std::vector<AutoCandidate> priced,
                                                  const TunedChoice* tuned);

// A candidate's last few counted calls; its estimate is their median (one slow call, another
// tenant's moment on the core, does not move it).
class RecentTimes {
 public:
  static constexpr int kRecent = 4;
  void add(double seconds) { recent_[count_++ % kRecent] = seconds; }
  int count() const { return count_; }
  double estimate() const;  // infinity before any call
  double fastest() const;   // the fastest call kept; infinity before any call
  // The calls kept (the last min(count(), kRecent)), in no particular order.
  int filled() const { return count_ < kRecent ? count_ : kRecent; }
  double value(int i) const { return recent_[i]; }

 private:
  double recent_[kRecent] = {};
  int count_ = 0;
};

// What auto runs for a measured shape and why, for `explain`: of the candidates racing now
// (`racing`, one flag per candidate), the one it runs (`runs`), whether the trial is over
// (`settled`), and each one's estimate ("?" before its first counted call) beside the model's
// price. A lone racer is said to have nothing to measure, or, where its calls are `watched`
// while others wait in reserve, to be timed for their sake.
std::string describeRacing(const std::vector<AutoCandidate>& candidates,
                           const std::vector<double>& estimates, const std::vector<bool>& racing,
                           size_t runs, bool settled, bool watched);

}  // namespace pycollective

#include "comm/auto_candidates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "comm/communicator.h"

namespace pycollective {

bool autoMeasures(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kReduce:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kBroadcast: return true;
    default: return false;
  }
}

std::vector<AutoCandidate> nearCandidates(std::vector<AutoCandidate> priced,
                                          const TunedChoice* tuned) {
  std::vector<AutoCandidate> c;
  if (priced.empty()) return c;
  std::stable_sort(priced.begin(), priced.end(),
                   [](const auto& a, const auto& b) { return a.modelSeconds < b.modelSeconds; });
  // Near the cheapest of its own model (whose errors it shares), and near the cheapest of all:
  // within kCandidateWindow where that is of the same model, kAcrossModelsWindow if not.
  double cheapestOf[2] = {std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::infinity()};
  for (const AutoCandidate& a : priced)
    cheapestOf[a.ownModel] = std::min(cheapestOf[a.ownModel], a.modelSeconds);
  const double cheapest = priced.front().modelSeconds;
  auto within = [&](const AutoCandidate& a) {
    return a.modelSeconds <= kCandidateWindow * cheapestOf[a.ownModel] &&
           a.modelSeconds <= kAcrossModelsWindow * cheapest;
  };
  if (tuned != nullptr) {
    auto entry = std::find_if(priced.begin(), priced.end(),
                              [tuned](const auto& a) { return a.algo == tuned->algo; });
    if (entry != priced.end()) {
      c.push_back(*entry);
      c.back().tuned = true;
    }
  }
  for (const auto& a : priced) {
    if (c.size() == kMaxCandidates) break;
    if (within(a) && (c.empty() || a.algo != c.front().algo)) c.push_back(a);
  }
  return c;
}

std::vector<AutoCandidate> candidatesWithReserves(std::vector<AutoCandidate> priced,
                                                  const TunedChoice* tuned) {
  std::vector<AutoCandidate> c = nearCandidates(priced, tuned);
  std::stable_sort(priced.begin(), priced.end(),
                   [](const auto& a, const auto& b) { return a.modelSeconds < b.modelSeconds; });
  for (AutoCandidate& a : priced)
    if (std::none_of(c.begin(), c.end(), [&](const auto& n) { return n.algo == a.algo; })) {
      a.reserve = true;
      c.push_back(std::move(a));
    }
  return c;
}

bool checkedOnce(const std::vector<AutoCandidate>& candidates, size_t i, double window) {
  if (i >= candidates.size() || !candidates[i].reserve) return false;
  double cheapest = std::numeric_limits<double>::infinity();
  for (const AutoCandidate& c : candidates)
    if (!c.reserve) cheapest = std::min(cheapest, c.modelSeconds);
  return candidates[i].modelSeconds <= window * cheapest;
}

double RecentTimes::estimate() const {
  if (count_ == 0) return std::numeric_limits<double>::infinity();
  // At most kRecent values: an insertion sort (std::sort on so short an array trips GCC 12's
  // -Warray-bounds, which the -Werror build turns into an error).
  const int n = std::min(count_, kRecent);
  double sorted[kRecent] = {};
  for (int i = 0; i < n; ++i) {
    int j = i;
    for (; j > 0 && sorted[j - 1] > recent_[i]; --j) sorted[j] = sorted[j - 1];
    sorted[j] = recent_[i];
  }
  return sorted[(n - 1) / 2];
}

double RecentTimes::fastest() const {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < filled(); ++i) best = std::min(best, recent_[i]);
  return best;
}

namespace {

// The racers' line of describeRacing: a lone racer is said to have nothing to measure, or, where
// its calls are `watched` for the sake of its reserves, to be timed.
std::string describeMeasured(const std::vector<AutoCandidate>& candidates,
                             const std::vector<double>& estimates, size_t runs, bool settled,
                             bool watched) {
  std::ostringstream s;
  if (candidates.size() == 1) {
    s << candidates[0].algo
      << (candidates[0].tuned ? " (tuned table, PYCOLLECTIVE_TUNING; model " : " (model ")
      << candidates[0].modelSeconds * 1e6 << "us; no other algorithm priced near it";
    if (watched)
      s << ": its calls are timed, and the other algorithms raced should they run "
        << static_cast<int>(kWidenRatio) << "x slower than usual)";
    else
      s << ", nothing to measure)";
    return s.str();
  }
  s << candidates[runs].algo
    << (settled ? " (measured, the median of each one's recent calls of this shape:"
                : " (trial under way, the median of each one's calls so far:");
  for (size_t i = 0; i < candidates.size(); ++i) {
    s << " " << candidates[i].algo << "=";
    if (i < estimates.size() && std::isfinite(estimates[i]))
      s << estimates[i] * 1e6 << "us";
    else
      s << "?";
    s << (candidates[i].tuned ? " (tuned table; model " : " (model ")
      << candidates[i].modelSeconds * 1e6 << "us)";
  }
  s << ")";
  return s.str();
}

}  // namespace

std::string describeRacing(const std::vector<AutoCandidate>& candidates,
                           const std::vector<double>& estimates, const std::vector<bool>& racing,
                           size_t runs, bool settled, bool watched) {
  std::vector<AutoCandidate> racers;
  std::vector<double> shown;
  size_t shownRuns = 0;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (racing[i] || i == runs) {
      if (i == runs) shownRuns = racers.size();
      racers.push_back(candidates[i]);
      shown.push_back(i < estimates.size() ? estimates[i]
                                           : std::numeric_limits<double>::infinity());
    }
  return describeMeasured(racers, shown, shownRuns, settled,
                          watched && racers.size() < candidates.size());
}

}  // namespace pycollective

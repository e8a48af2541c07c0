#include "transport/ring_stores.h"

namespace pycollective {

namespace {
// Weight of the newest piece in a kind's moving average: a change of placement shows within a
// few pieces of the kind in use, and one preempted copy moves the average by only an eighth.
constexpr double kNewest = 1.0 / 8;
}  // namespace

bool RingStoreChoice::streamNext(size_t bytes) {
  if (bytes < kMinTimedBytes) return false;
  // Until both kinds have a rate, alternate; then the other kind once a period.
  if (rate_[0] == 0 || rate_[1] == 0) return rate_[0] != 0;
  const bool explore = timed_ % kExplorePeriod == kExplorePeriod - 1;
  return explore ? !streaming_ : streaming_;
}

void RingStoreChoice::record(bool streamed, size_t bytes, double seconds) {
  if (bytes < kMinTimedBytes || seconds <= 0) return;
  ++timed_;
  const double rate = static_cast<double>(bytes) / seconds;
  double& r = rate_[streamed ? 1 : 0];
  r = r == 0 ? rate : r + kNewest * (rate - r);
  if (rate_[0] > 0 && rate_[1] > 0) streaming_ = rate_[1] > kStreamWhenSlower * rate_[0];
}

}  // namespace pycollective

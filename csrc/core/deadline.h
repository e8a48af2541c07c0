#pragma once
// A point in time after which a blocking call gives up. Every wait in pycollective takes one,
// so that nothing can block forever.
#include <chrono>
#include <limits>

namespace pycollective {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // seconds <= 0 or infinite means "no deadline" (only used where a caller bounds the wait itself).
  static Deadline after(double seconds) {
    Deadline d;
    if (seconds > 0 && seconds < 1e9) {
      d.at_ = Clock::now() +
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
      d.bounded_ = true;
    }
    d.seconds_ = seconds;
    return d;
  }

  bool expired() const { return bounded_ && Clock::now() >= at_; }
  double remainingSeconds() const {
    if (!bounded_) return std::numeric_limits<double>::infinity();
    return std::chrono::duration<double>(at_ - Clock::now()).count();
  }
  double totalSeconds() const { return seconds_; }
  bool bounded() const { return bounded_; }

 private:
  Clock::time_point at_{};
  bool bounded_ = false;
  double seconds_ = 0;
};

}  // namespace pycollective

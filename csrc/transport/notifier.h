#pragma once
// A doorbell a rank sleeps on while it waits for its links. Peers in the same process ring it
// when they hand over data, so an idle rank sleeps instead of spinning a core away, and wakes as
// soon as something arrives.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace pycollective {

class Notifier {
 public:
  uint64_t generation() {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }
  void ring() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generation_;
    }
    cv_.notify_all();
  }
  // Returns when the generation moved past `seen` or after `timeout`.
  template <typename Duration>
  void waitPast(uint64_t seen, Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return generation_ != seen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

}  // namespace pycollective

#pragma once
// Work: the handle of an asynchronous collective. wait() rethrows the rank's error.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace pycollective {

class Work {
 public:
  void markDone(std::exception_ptr error, double seconds) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(error);
      seconds_ = seconds;
    }
    cv_.notify_all();
  }

  bool isCompleted() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  // Waits at most timeoutSeconds (< 0: until done). Returns false if it is still running; on
  // completion rethrows the error the collective raised, if any.
  bool wait(double timeoutSeconds) {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeoutSeconds < 0) {
      cv_.wait(lock, [&] { return done_; });
    } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeoutSeconds),
                             [&] { return done_; })) {
      return false;
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  double seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  double seconds_ = 0;
};
using WorkPtr = std::shared_ptr<Work>;

}  // namespace pycollective

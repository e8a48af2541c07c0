#pragma once
// One FIFO worker thread per communicator: collectives run in the order they were issued, which
// is the order every rank must agree on, while the caller's thread stays free (async API).
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/work.h"

namespace pycollective {

class Executor {
 public:
  Executor() = default;
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues fn; the returned Work completes when fn returns (or throws).
  WorkPtr submit(std::function<void()> fn);

  // Runs fn on the calling thread when nothing is queued or running, so that a synchronous
  // collective costs no thread hand-off (two wake-ups, ~10 us); otherwise queues it behind the
  // earlier work and waits for it. Either way issue order is run order. Rethrows fn's error.
  void run(const std::function<void()>& fn);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, WorkPtr>> queue_;
  bool stopping_ = false;
  bool running_ = false;  // an item (queued or inline) is executing
  std::thread thread_;    // started on first submit
};

}  // namespace pycollective

#include "comm/executor.h"

#include <chrono>

namespace pycollective {

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Queued work still runs; every collective has a deadline, so the join is bounded.
  if (thread_.joinable()) thread_.join();
}

WorkPtr Executor::submit(std::function<void()> fn) {
  auto work = std::make_shared<Work>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(fn), work);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
  return work;
}

void Executor::run(const std::function<void()>& fn) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!queue_.empty() || running_) {
      lock.unlock();
      submit(fn)->wait(-1);  // bounded: every collective has a deadline
      return;
    }
    running_ = true;
  }
  struct Done {
    Executor* self;
    ~Done() {
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->running_ = false;
      }
      self->cv_.notify_all();
    }
  } done{this};
  fn();
}

void Executor::loop() {
  for (;;) {
    std::pair<std::function<void()>, WorkPtr> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    auto start = std::chrono::steady_clock::now();
    std::exception_ptr error;
    try {
      item.first();
    } catch (...) {
      error = std::current_exception();
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
    item.second->markDone(error, seconds);
  }
}

}  // namespace pycollective

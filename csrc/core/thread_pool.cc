#include "core/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <system_error>

#include "core/knobs.h"

namespace pycollective {

// One parallelFor call. It lives on the caller's stack: the caller returns only when every piece
// has been taken (so the job is off the queue) and every taken piece has finished.
struct ThreadPool::Job {
  const std::function<void(int)>* fn = nullptr;
  int nPieces = 0;
  int nextPiece = 0;   // next piece nobody has taken yet
  int unfinished = 0;  // pieces not finished yet, taken or not
  std::exception_ptr error;
  std::condition_variable done;  // signalled by the worker that finishes the last piece
};

namespace {

// Runs all pieces on this thread with the same exception rule as the parallel path: every piece
// runs, the first exception is rethrown at the end.
void runInline(int nPieces, const std::function<void(int)>& fn) {
  std::exception_ptr error;
  for (int p = 0; p < nPieces; ++p) {
    try {
      fn(p);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

int availableCpus() {
#if defined(__linux__)
  // The affinity mask, not the machine size: containers and taskset restrict it.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

constexpr int kMaxReductionThreads = 1024;

int reductionThreads() {
  const int fallback = availableCpus();
  const std::string setting = knobs::text(knobs::kReduceThreads);
  if (setting == "0") return fallback;  // the default: automatic
  const char* env = setting.c_str();
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(env, &end, 10);
  if (errno != 0 || *end != '\0' || value < 1 || value > kMaxReductionThreads) {
    std::fprintf(stderr,
                 "pycollective: WARNING: ignoring PYCOLLECTIVE_REDUCE_THREADS=%s (expected an "
                 "integer from 1 to %d); using %d\n",
                 env, kMaxReductionThreads, fallback);
    return fallback;
  }
  return static_cast<int>(value);
}

}  // namespace

ThreadPool::ThreadPool(int numWorkers) : ownerPid_(getpid()), state_(new State) {
  workers_.reserve(static_cast<size_t>(std::max(0, numWorkers)));
  for (int i = 0; i < numWorkers; ++i) {
    try {
      workers_.emplace_back([this] { workerLoop(); });
    } catch (const std::system_error& e) {
      // Fewer workers only means less parallelism; every caller can still finish on its own.
      std::fprintf(stderr,
                   "pycollective: WARNING: could not start reduction worker %d of %d (%s); "
                   "continuing with %d\n",
                   i + 1, numWorkers, e.what(), i);
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  if (getpid() != ownerPid_) {
    // A fork()ed child inherits this object but not the threads. Joining them, or destroying the
    // condition variable they were waiting on, would wait forever; the mutex may have been copied
    // locked. So the child forgets the threads and leaks the state.
    for (std::thread& t : workers_) t.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->workAvailable.notify_all();
  for (std::thread& t : workers_) t.join();
  delete state_;
}

int ThreadPool::claimPieceLocked(Job* job) {
  const int piece = job->nextPiece++;
  if (job->nextPiece == job->nPieces) {
    state_->queue.erase(std::find(state_->queue.begin(), state_->queue.end(), job));
  }
  return piece;
}

void ThreadPool::finishPieceLocked(Job* job) {
  // Notified with the mutex held: the caller cannot wake, return and destroy the job (and its
  // condition variable) before this thread releases the mutex.
  if (--job->unfinished == 0) job->done.notify_one();
}

void ThreadPool::workerLoop() {
  std::unique_lock<std::mutex> lock(state_->mu);
  for (;;) {
    state_->workAvailable.wait(lock, [this] { return state_->stop || !state_->queue.empty(); });
    // Jobs still queued at stop are safe to abandon: their callers run the remaining pieces.
    if (state_->stop) return;
    Job* job = state_->queue.front();
    const int piece = claimPieceLocked(job);
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job->fn)(piece);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !job->error) job->error = error;
    finishPieceLocked(job);
  }
}

void ThreadPool::parallelFor(int nPieces, const std::function<void(int)>& fn) {
  if (nPieces <= 0) return;
  // In a fork()ed child the workers do not exist (and the mutex may have been copied locked).
  if (nPieces == 1 || workers_.empty() || getpid() != ownerPid_) {
    runInline(nPieces, fn);
    return;
  }

  Job job;
  job.fn = &fn;
  job.nPieces = nPieces;
  job.unfinished = nPieces;

  std::unique_lock<std::mutex> lock(state_->mu);
  if (state_->stop) {
    lock.unlock();
    runInline(nPieces, fn);
    return;
  }
  state_->queue.push_back(&job);
  lock.unlock();
  // Wake only as many workers as there are pieces beyond the caller's own.
  const int helpers = std::min(nPieces - 1, numWorkers());
  if (helpers == numWorkers()) {
    state_->workAvailable.notify_all();
  } else {
    for (int i = 0; i < helpers; ++i) state_->workAvailable.notify_one();
  }

  // The caller takes pieces until none is left, so it never waits for a piece that nobody runs.
  lock.lock();
  while (job.nextPiece < job.nPieces) {
    const int piece = claimPieceLocked(&job);
    lock.unlock();
    std::exception_ptr error;
    try {
      fn(piece);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !job.error) job.error = error;
    --job.unfinished;  // the caller is the only waiter: nobody to notify
  }
  // Only pieces that workers are running right now remain.
  job.done.wait(lock, [&job] { return job.unfinished == 0; });
  lock.unlock();
  if (job.error) std::rethrow_exception(job.error);
}

ThreadPool& ThreadPool::reductionPool() {
  // Started on first use (thread-safe static initialization), joined at process exit.
  static ThreadPool pool(reductionThreads() - 1);
  return pool;
}

int hostCores() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace pycollective

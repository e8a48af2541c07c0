#pragma once
// A small fixed pool of worker threads for splitting one large elementwise job (a reduction of a
// big chunk) into pieces. Several callers may use one pool at once: each call is a job in a FIFO
// that idle workers help with, and the calling thread itself runs every piece that no worker has
// taken, so a call always finishes even when all workers are busy with other callers' jobs (or
// when it is made from inside a piece). A caller only ever waits for pieces already running.
//
// fork(): a child process inherits the object but not its threads, so in a child parallelFor runs
// inline and the destructor does not wait for the parent's workers.
#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pycollective {

// The host's cores, at least 1: all of them, not this process's affinity mask. A launcher that
// binds each rank to its own cores (Slurm's --cpus-per-task, mpirun --bind-to) narrows the mask
// to the rank's share, and dividing that by the ranks on the host again would undercount. (A
// container that narrows every rank's mask to the same few cores is not seen as oversubscribed.)
int hostCores();

class ThreadPool {
 public:
  // Starts numWorkers threads; 0 is allowed (every parallelFor then runs inline).
  explicit ThreadPool(int numWorkers);
  // Stops and joins the workers. Pieces already running finish first; pieces not yet taken are
  // run by their callers.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int numWorkers() const { return static_cast<int>(workers_.size()); }

  // Runs fn(0) ... fn(nPieces - 1), on the calling thread and on idle workers, and returns when
  // all have returned. If pieces throw, the first exception caught is rethrown here after every
  // piece has finished.
  void parallelFor(int nPieces, const std::function<void(int)>& fn);

  // The one pool shared by all reductions in the process, started on first use. Its size is the
  // number of CPUs this process may run on minus one (the caller is the remaining thread), or
  // PYCOLLECTIVE_REDUCE_THREADS minus one: that variable counts all threads a reduction may use.
  static ThreadPool& reductionPool();

 private:
  struct Job;
  // Everything the workers synchronize on. On the heap so that a fork()ed child can abandon it:
  // destroying a condition variable that (in the parent's copied memory) still has waiters
  // blocks forever in glibc.
  struct State {
    std::mutex mu;
    std::condition_variable workAvailable;
    std::deque<Job*> queue;  // jobs with pieces not yet taken, oldest first
    bool stop = false;
  };

  void workerLoop();
  // Takes the next piece of job; the caller holds state_->mu and has checked that one is left.
  int claimPieceLocked(Job* job);
  void finishPieceLocked(Job* job);

  const pid_t ownerPid_;  // the process that started the workers
  State* const state_;    // owned; deliberately leaked in a fork()ed child
  std::vector<std::thread> workers_;
};

}  // namespace pycollective

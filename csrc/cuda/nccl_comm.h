#pragma once
// NcclComm: one NCCL communicator (one rank on one device), with everything needed so that
// nothing hangs:
//  - init is non-blocking (ncclCommInitRankConfig with blocking=0) and polled under a deadline,
//    so a rank that never joins makes init fail with CollectiveTimeout instead of blocking;
//  - every collective is enqueued on the caller's stream and followed by an event; a watchdog
//    thread polls those events and ncclCommGetAsyncError, and aborts the communicator
//    (ncclCommAbort, which also ends its kernels) when a collective outlives its deadline or
//    NCCL reports an asynchronous error. The next call, or synchronize(), raises the reason.
//
// No CUDA header: NCCL is reached through nccl_api.h and events through DeviceOps, so this file
// is built on every Linux build; without CUDA, constructing a communicator raises
// NcclUnavailable (get_unique_id and the loader still work).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "core/dtype.h"
#include "cuda/device_ops.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_loader.h"

namespace pycollective {

class NcclComm {
 public:
  // Joins the communicator of `id` as `rank` of `nranks` on CUDA device `device`. Every rank
  // must call this with the same id and nranks within timeoutSeconds.
  NcclComm(int nranks, const nccl::UniqueId& id, int rank, int device, double timeoutSeconds);
  // One communicator per device of this process, rank i on devices[i] (ncclCommInitAll, made
  // non-blocking). Devices must be distinct.
  static std::vector<std::unique_ptr<NcclComm>> initAll(const std::vector<int>& devices,
                                                        double timeoutSeconds);
  // A fresh unique id (ncclGetUniqueId); rank 0 makes it and every rank gets a copy.
  static nccl::UniqueId uniqueId();

  // Flushes outstanding work (bounded by a short deadline; aborts past it) and destroys.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  double timeoutSeconds() const { return timeoutSeconds_; }
  void setTimeoutSeconds(double s) { timeoutSeconds_ = s; }

  // Collectives, enqueued on `stream` (a cudaStream_t; 0 = the legacy default stream). They
  // return once enqueued; results are ready in stream order. Buffers follow ncclAllReduce & co.
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                 cuda::Stream stream);
  void reduceScatter(const void* send, void* recv, size_t recvCount, DType dtype, ReduceOp op,
                     cuda::Stream stream);
  void allgather(const void* send, void* recv, size_t sendCount, DType dtype, cuda::Stream stream);
  void broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                 cuda::Stream stream);
  void reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op, int root,
              cuda::Stream stream);

  // Waits until every collective enqueued so far finished. timeoutSeconds < 0 waits until done
  // or failed (the watchdog bounds that). Returns false when the wait itself timed out; throws
  // the communicator's failure (CollectiveTimeout, NcclError, CudaError or Aborted).
  bool synchronize(double timeoutSeconds);
  // True when nothing is outstanding (throws the failure, like synchronize).
  bool isCompleted();

  // ncclCommGetAsyncError described ("" while healthy); never throws.
  std::string asyncError();
  // Aborts: outstanding kernels end, every later call raises Aborted with `reason`.
  void abort(const std::string& reason) noexcept;
  bool aborted() const { return aborted_.load(); }
  // "" while usable, else why it is not.
  std::string failure();

  // ncclGroupStart/End for this thread: collectives in between are fused into one launch.
  // groupEnd waits (bounded) until NCCL accepted them, then starts watching them.
  static void groupStart();
  static void groupEnd();

  // "[nccl rank 1/4 on cuda:1]"
  std::string who() const;

  // Names one collective in messages ("allreduce#12 (1024 float32)"). Kept as its parts and
  // formatted only when a message needs it, instead of building and copying a string on every
  // call for the rare error.
  struct CallLabel {
    const char* collective = "";
    uint64_t seq = 0;
    size_t count = 0;
    DType dtype = DType::kFloat32;
    std::string str() const;
  };

 private:
  enum class Failure { kNone, kTimeout, kNccl, kCuda, kAborted };
  struct Pending {
    cuda::Event event;
    cuda::Stream stream;
    Deadline deadline;
    CallLabel label;
  };

  NcclComm(const nccl::Library& lib, cuda::DeviceOps& ops, int rank, int size, int device,
           double timeoutSeconds);

  // One collective: checks, enqueues with `call(comm)`, settles, starts watching it.
  template <typename Call>
  void collective(const char* name, size_t count, DType dtype, cuda::Stream stream, Call&& call);
  // Runs one NCCL call on the communicator handle (shared lock: abort waits for it).
  template <typename Call>
  nccl::Result callNccl(Call&& call);
  // Handles a call's result: success; in progress (polls until NCCL settled); or an error.
  void settle(nccl::Result r, const CallLabel& label, const Deadline& deadline);
  // Polls ncclCommGetAsyncError until it is no longer ncclInProgress.
  void waitReady(const std::string& what, const Deadline& deadline);
  // Starts watching the collective just enqueued on `stream` (deferred to groupEnd in a group).
  void enqueued(cuda::Stream stream, const CallLabel& label);
  void watch(cuda::Stream stream, const CallLabel& label);
  std::string describe(nccl::Result r);
  // Starts a call: throws the communicator's failure, else names the call (one lock).
  CallLabel admit(const char* collective, size_t count, DType dtype);
  void checkUsable();
  // Throws the communicator's failure, if any; `lock` holds mu_ (released before throwing).
  void throwIfFailed(std::unique_lock<std::mutex>& lock);
  [[noreturn]] void throwFailure(Failure kind, const std::string& message);
  void fail(Failure kind, const std::string& message) noexcept;
  void startWatchdog();
  void watchdogLoop();
  // One watchdog pass over collectives taken out of pending_: which finished (by position in
  // `taken`), and the first failure or expired deadline, described.
  struct Examined {
    std::vector<bool> finished;
    std::string cudaFailure, expired;
  };
  Examined examine(const std::deque<Pending>& taken);
  // How many of one stream's collectives (positions in `taken`, oldest first) finished;
  // `queried` is the position of the last event queried (for a failure's message).
  size_t finishedPrefix(const std::deque<Pending>& taken, const std::vector<size_t>& stream,
                        size_t& queried);

  const nccl::Library& lib_;
  cuda::DeviceOps& ops_;
  nccl::Comm comm_ = nullptr;
  int rank_, size_, device_;
  double timeoutSeconds_;
  uint64_t seq_ = 0;

  std::shared_mutex callMu_;  // shared around NCCL calls, exclusive to abort/destroy
  std::atomic<bool> aborted_{false};

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  size_t examining_ = 0;  // collectives a watchdog pass holds outside pending_ (still pending)
  std::vector<cuda::Event> freeEvents_;
  Failure failure_ = Failure::kNone;
  std::string failureMessage_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace pycollective

// NcclComm's watchdog, checked without a GPU: the core linked with a fake DeviceOps whose events
// finish when the test says so, and a stand-in libnccl.so.2 (fake_nccl.cc, named by
// PYCOLLECTIVE_NCCL_LIBRARY) whose calls all succeed at once. On a GPU the same code runs under
// tests/test_cuda.py, but a collective that never finishes there needs two GPUs; here it is a
// stream the test never completes.
//
//   test_nccl_watchdog                      ordering, progress, retiring on few queries, a
//                                           partly finished stream, enqueues beside a stuck
//                                           query, timeout
//   test_nccl_watchdog --no-communicator    (with FAKE_NCCL_NO_COMM=1) init without a communicator
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "cuda/device_ops.h"
#include "cuda/nccl_api.h"
#include "cuda/nccl_comm.h"

using namespace pycollective;

namespace {

int gFailures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++gFailures;
  }
}

// An event marks a position in its stream's order; a stream has finished everything up to the
// position the test completed it to.
struct FakeEvent {
  cuda::Stream stream = nullptr;
  uint64_t position = 0;
};

class FakeDeviceOps final : public cuda::DeviceOps {
 public:
  std::string describe() override { return "fake device (events the test completes)"; }
  int deviceCount() override { return 1; }
  int pointerDevice(const void*) override { return 0; }
  void setDevice(int) override {}
  int currentDevice() override { return 0; }
  int beginCall(int, cuda::Stream) override { unused("beginCall"); }
  void endCall(int) noexcept override {}
  void enablePeerAccess(const std::vector<int>&) override { unused("enablePeerAccess"); }
  CopyFn copyFn() override { unused("copyFn"); }
  ReduceFn reduceFn(DType, ReduceOp) override { unused("reduceFn"); }
  void scale(void*, size_t, DType, double) override { unused("scale"); }
  void reduceAsync(void*, const void*, const void*, size_t, DType, ReduceOp,
                   cuda::Stream) override {
    unused("reduceAsync");
  }
  void scaleAsync(void*, size_t, DType, double, cuda::Stream) override { unused("scaleAsync"); }
  void copyAsync(void*, const void*, size_t, cuda::Stream) override { unused("copyAsync"); }
  void streamSynchronize(cuda::Stream) override { unused("streamSynchronize"); }
  void* alloc(size_t, int) override { unused("alloc"); }
  void free(void*, int) noexcept override {}

  cuda::Event createEvent(int) override { return new FakeEvent; }
  void recordEvent(cuda::Event event, cuda::Stream stream, int) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* e = static_cast<FakeEvent*>(event);
    e->stream = stream;
    e->position = ++recorded_[stream];
  }
  bool eventDone(cuda::Event event) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (holdQueries_) {  // a slow driver: the query returns when the test lets it
      queryHeld_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !holdQueries_; });
      queryHeld_ = false;
    }
    auto* e = static_cast<FakeEvent*>(event);
    const bool done = e->position <= completed_[e->stream];
    ++queries_[e->stream];
    if (done) {
      seenDone_[e->stream] = std::max(seenDone_[e->stream], e->position);
    } else {
      waitingQueried_[e->stream].insert({e, e->position});
    }
    return done;
  }
  void destroyEvent(cuda::Event event, int) noexcept override {
    delete static_cast<FakeEvent*>(event);
  }

  // The test's controls and readings.
  void completeAll(cuda::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    completed_[stream] = recorded_[stream];
  }
  // While held, every event query blocks until released.
  void holdQueries(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    holdQueries_ = hold;
    cv_.notify_all();
  }
  bool waitForHeldQuery(int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return queryHeld_; });
  }
  void completeTo(cuda::Stream stream, uint64_t position) {
    std::lock_guard<std::mutex> lock(mu_);
    completed_[stream] = position;
  }
  // How many distinct positions of `stream` were queried while still unfinished.
  size_t unfinishedQueried(cuda::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    return waitingQueried_[stream].size();
  }
  // The latest position of `stream` a query found finished.
  uint64_t seenDone(cuda::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    return seenDone_[stream];
  }
  // Events of `stream` queried so far, finished or not.
  uint64_t queries(cuda::Stream stream) {
    std::lock_guard<std::mutex> lock(mu_);
    return queries_[stream];
  }

 private:
  [[noreturn]] static void unused(const char* what) {
    throw std::logic_error(std::string("fake device: ") + what + " is not used by NcclComm");
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool holdQueries_ = false, queryHeld_ = false;
  std::map<cuda::Stream, uint64_t> recorded_, completed_, seenDone_, queries_;
  std::map<cuda::Stream, std::set<std::pair<const void*, uint64_t>>> waitingQueried_;
};

FakeDeviceOps& fake() {
  static FakeDeviceOps ops;
  return ops;
}

cuda::Stream streamNamed(uintptr_t n) {
  return reinterpret_cast<cuda::Stream>(n);
}

// Any non-null addresses: the fake NCCL never touches them.
float gSend[4], gRecv[4];

void allreduce(NcclComm& comm, cuda::Stream stream) {
  comm.allreduce(gSend, gRecv, 4, DType::kFloat32, ReduceOp::kSum, stream);
}

nccl::UniqueId someId() {
  nccl::UniqueId id{};
  for (int i = 0; i < nccl::kUniqueIdBytes; ++i) id.internal[i] = static_cast<char>(i);
  return id;
}

void sleepMs(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Polls `done` until it holds or 5 s passed: a watchdog pass comes every millisecond, but a
// loaded machine (a sanitizer build, other jobs) may not run the thread for a while.
template <typename Pred>
void waitUntil(Pred done) {
  for (int waited = 0; waited < 5000 && !done(); waited += 5) sleepMs(5);
}

// A stalled stream holds the watchdog at its first unfinished collective: the 499 behind it
// are never queried, however many passes the watchdog makes; another stream progresses
// meanwhile. Once the stalled stream finishes, its 500 collectives retire on a few queries (the
// oldest and the newest: a stream finishes in order), not one query each.
void testOrderAndProgress() {
  NcclComm comm(1, someId(), 0, 0, 30.0);
  const cuda::Stream stalled = streamNamed(0x10), moving = streamNamed(0x20);
  for (int i = 0; i < 500; ++i) allreduce(comm, stalled);
  for (int i = 0; i < 3; ++i) allreduce(comm, moving);
  fake().completeAll(moving);
  sleepMs(100);  // about a hundred watchdog passes
  waitUntil([&] { return fake().seenDone(moving) == 3; });
  check(fake().unfinishedQueried(stalled) == 1,
        "the watchdog queried " + std::to_string(fake().unfinishedQueried(stalled)) +
            " unfinished collectives of a stalled stream; only its first should be");
  check(fake().seenDone(moving) == 3,
        "the moving stream's last collective was not seen finished (latest seen: " +
            std::to_string(fake().seenDone(moving)) + " of 3) while another stream stalled");
  check(!comm.synchronize(0.05), "synchronize() returned true with a stream still stalled");
  const uint64_t before = fake().queries(stalled);
  fake().completeAll(stalled);
  check(comm.synchronize(10.0), "synchronize() did not see the stalled stream finish");
  const uint64_t retiring = fake().queries(stalled) - before;
  check(retiring <= 4, "retiring 500 finished collectives of one stream took " +
                           std::to_string(retiring) + " event queries; 2 should do");
  check(fake().seenDone(stalled) == 500, "the stalled stream's last collective was not seen");
  check(comm.isCompleted(), "isCompleted() is false with nothing outstanding");
}

// A stream finished part of the way retires exactly its finished collectives (a binary search
// between the oldest and the newest), and the rest still count as outstanding.
void testPartlyFinishedStream() {
  NcclComm comm(1, someId(), 0, 0, 30.0);
  const cuda::Stream partly = streamNamed(0x40);
  for (int i = 0; i < 300; ++i) allreduce(comm, partly);
  fake().completeTo(partly, 137);
  waitUntil([&] { return fake().seenDone(partly) >= 137; });
  check(fake().seenDone(partly) == 137, "after 137 of 300 finished, the latest seen finished is " +
                                            std::to_string(fake().seenDone(partly)));
  check(!comm.isCompleted(), "isCompleted() is true with 163 collectives outstanding");
  fake().completeAll(partly);
  check(comm.synchronize(10.0), "synchronize() did not see the rest finish");
}

// The watchdog queries events without the lock an enqueue takes: with its query stuck in the
// driver, the caller still enqueues (before, every enqueue waited for the query to return).
void testEnqueueDuringQuery() {
  NcclComm comm(1, someId(), 0, 0, 30.0);
  const cuda::Stream s = streamNamed(0x50);
  fake().holdQueries(true);
  allreduce(comm, s);  // wakes the watchdog, whose query of it then blocks
  check(fake().waitForHeldQuery(5000), "the watchdog never queried the collective's event");
  std::mutex mu;
  std::condition_variable cv;
  bool enqueued = false;
  std::thread caller([&] {
    for (int i = 0; i < 100; ++i) allreduce(comm, s);
    std::lock_guard<std::mutex> lock(mu);
    enqueued = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return enqueued; });
    check(enqueued, "100 enqueues did not return while the watchdog's event query was stuck");
  }
  fake().holdQueries(false);
  caller.join();
  fake().completeAll(s);
  check(comm.synchronize(10.0), "synchronize() did not see the 101 collectives finish");
}

// A collective that never finishes aborts the communicator at its deadline: synchronize()
// raises CollectiveTimeout naming it, and so does every later call.
void testTimeout() {
  NcclComm comm(1, someId(), 0, 0, 0.3);
  const cuda::Stream never = streamNamed(0x30);
  allreduce(comm, never);
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    comm.synchronize(10.0);
  } catch (const CollectiveTimeout& e) {
    message = e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(message.find("allreduce#0") != std::string::npos &&
            message.find("did not finish within") != std::string::npos,
        "the timeout's message does not name the collective: '" + message + "'");
  check(waited < 3.0, "the 0.3 s deadline took " + std::to_string(waited) + " s to fire");
  bool refused = false;
  try {
    allreduce(comm, never);
  } catch (const CollectiveTimeout&) {
    refused = true;
  }
  check(refused, "a call after the timeout was accepted");
  check(!comm.failure().empty(), "failure() is empty after the timeout");
}

void testNoCommunicator() {
  std::string message;
  try {
    NcclComm comm(1, someId(), 0, 0, 5.0);
  } catch (const NcclError& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = std::string("another exception: ") + e.what();
  }
  check(message.find("no communicator") != std::string::npos,
        "init without a communicator did not raise NcclError naming it: '" + message + "'");
}

}  // namespace

namespace pycollective {
namespace cuda {
DeviceOps* deviceOps() {
  return &fake();
}
}  // namespace cuda
}  // namespace pycollective

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--no-communicator") == 0) {
    testNoCommunicator();
  } else {
    testOrderAndProgress();
    testPartlyFinishedStream();
    testEnqueueDuringQuery();
    testTimeout();
  }
  if (gFailures == 0) std::printf("test_nccl_watchdog: all checks passed\n");
  return gFailures == 0 ? 0 : 1;
}

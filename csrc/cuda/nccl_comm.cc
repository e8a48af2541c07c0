#include "cuda/nccl_comm.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"
#include "core/logging.h"

namespace pycollective {

namespace {

using Clock = std::chrono::steady_clock;

const char* resultName(nccl::Result r) {
  switch (r) {
    case nccl::kSuccess: return "ncclSuccess";
    case nccl::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case nccl::kSystemError: return "ncclSystemError";
    case nccl::kInternalError: return "ncclInternalError";
    case nccl::kInvalidArgument: return "ncclInvalidArgument";
    case nccl::kInvalidUsage: return "ncclInvalidUsage";
    case nccl::kRemoteError: return "ncclRemoteError";
    case nccl::kInProgress: return "ncclInProgress";
  }
  return "ncclResult(?)";
}

nccl::DataType dataType(DType t) {
  switch (t) {
    case DType::kFloat16: return nccl::kFloat16;
    case DType::kBFloat16: return nccl::kBfloat16;
    case DType::kFloat32: return nccl::kFloat32;
    case DType::kFloat64: return nccl::kFloat64;
    case DType::kInt8: return nccl::kInt8;
    case DType::kUInt8: return nccl::kUint8;
    case DType::kInt32: return nccl::kInt32;
    case DType::kInt64: return nccl::kInt64;
  }
  throw InvalidArgument(makeMessage("unknown dtype value ", static_cast<int>(t)));
}

nccl::RedOp redOp(DType t, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return nccl::kSum;
    case ReduceOp::kProd: return nccl::kProd;
    case ReduceOp::kMin: return nccl::kMin;
    case ReduceOp::kMax: return nccl::kMax;
    case ReduceOp::kAvg:
      // Same rule as the other algorithms (NCCL would divide integers, truncating).
      if (!isFloating(t))
        throw InvalidType(makeMessage("avg is not defined for ", dtypeName(t),
                                      ": use sum and divide, or convert to a floating type"));
      return nccl::kAvg;
  }
  throw InvalidArgument(makeMessage("unknown reduce op value ", static_cast<int>(op)));
}

// What init says when NCCL reported success but handed back no communicator (a stand-in
// library, or a broken build of NCCL): nothing could be enqueued on it.
std::string noCommunicator(const nccl::Library& lib) {
  return "ncclCommInitRankConfig reported success but returned no communicator; is " + lib.path() +
         " a working NCCL? Point PYCOLLECTIVE_NCCL_LIBRARY at a real libnccl.so.2";
}

// A short pause that grows: polling NCCL's state costs little, but a tight loop would take a
// core from NCCL's own proxy thread.
void pause(int& round) {
  if (round < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 50 : 1000));
  }
  ++round;
}

// The collectives of this thread between groupStart and groupEnd (NCCL's groups are per thread
// too): their events can only be recorded once ncclGroupEnd launched them.
struct GroupState {
  int depth = 0;
  struct Op {
    NcclComm* comm;
    cuda::Stream stream;
    NcclComm::CallLabel label;
  };
  std::vector<Op> ops;
};
thread_local GroupState tlGroup;

cuda::DeviceOps& opsForNccl() {
  cuda::DeviceOps* ops = cuda::deviceOps();
  if (ops == nullptr)
    throw NcclUnavailable(
        "NCCL communicators need a CUDA build of pycollective, and this one has no CUDA "
        "(built with PYCOLLECTIVE_CUDA=OFF, or AUTO without nvcc); rebuild with "
        "PYCOLLECTIVE_CUDA=ON and the CUDA toolkit on PATH");
  return *ops;
}

// Makes `device` current for a scope (NCCL init uses the thread's current device).
class CurrentDevice {
 public:
  CurrentDevice(cuda::DeviceOps& ops, int device) : ops_(ops), previous_(ops.currentDevice()) {
    if (previous_ != device) ops_.setDevice(device);
  }
  ~CurrentDevice() {
    try {
      ops_.setDevice(previous_);
    } catch (...) {
    }
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  cuda::DeviceOps& ops_;
  int previous_;
};

}  // namespace

// ---- construction ----

NcclComm::NcclComm(const nccl::Library& lib, cuda::DeviceOps& ops, int rank, int size, int device,
                   double timeoutSeconds)
    : lib_(lib),
      ops_(ops),
      rank_(rank),
      size_(size),
      device_(device),
      timeoutSeconds_(timeoutSeconds) {}

NcclComm::NcclComm(int nranks, const nccl::UniqueId& id, int rank, int device,
                   double timeoutSeconds)
    : NcclComm(nccl::library(), opsForNccl(), rank, nranks, device, timeoutSeconds) {
  PC_CHECK(nranks >= 1, "nranks must be positive, got ", nranks);
  PC_CHECK(rank >= 0 && rank < nranks, "rank ", rank, " is out of range for nranks ", nranks);
  PC_CHECK(device >= 0 && device < ops_.deviceCount(), "CUDA device ", device,
           " does not exist (this process sees ", ops_.deviceCount(), ")");
  const Deadline deadline = Deadline::after(timeoutSeconds_);
  nccl::ConfigV21400 config;
  config.blocking = 0;
  nccl::Result r;
  {
    CurrentDevice current(ops_, device);
    r = lib_.api().commInitRankConfig(&comm_, nranks, id, rank, &config);
  }
  if (r != nccl::kSuccess && r != nccl::kInProgress) {
    std::string why = describe(r);
    if (comm_ != nullptr) lib_.api().commAbort(comm_);
    comm_ = nullptr;
    throw NcclError(who() + " ncclCommInitRankConfig failed: " + why);
  }
  if (comm_ == nullptr) throw NcclError(who() + " " + noCommunicator(lib_));
  try {
    waitReady("communicator init", deadline);
  } catch (const CollectiveTimeout&) {
    throw CollectiveTimeout(
        who() + " NCCL communicator init did not complete within " +
        std::to_string(timeoutSeconds_) + " s: every one of the " + std::to_string(nranks) +
        " ranks must create its communicator with the same unique id, nranks and a distinct "
        "rank; check that they all started and can reach each other (NCCL_DEBUG=INFO shows "
        "how far init got)");
  }
  startWatchdog();
  PC_INFO(kNccl, who(), " NCCL ", lib_.versionString(), " communicator ready (", lib_.path(), ")");
}

std::vector<std::unique_ptr<NcclComm>> NcclComm::initAll(const std::vector<int>& devices,
                                                         double timeoutSeconds) {
  const nccl::Library& lib = nccl::library();
  cuda::DeviceOps& ops = opsForNccl();
  const int n = static_cast<int>(devices.size());
  PC_CHECK(n >= 1, "initAll needs at least one device");
  for (int i = 0; i < n; ++i) {
    PC_CHECK(devices[i] >= 0 && devices[i] < ops.deviceCount(), "CUDA device ", devices[i],
             " does not exist (this process sees ", ops.deviceCount(), ")");
    for (int j = 0; j < i; ++j)
      PC_CHECK(devices[i] != devices[j], "device ", devices[i],
               " appears twice: NCCL needs one communicator rank per device");
  }
  const nccl::UniqueId id = uniqueId();
  std::vector<std::unique_ptr<NcclComm>> comms;
  for (int i = 0; i < n; ++i)
    comms.emplace_back(new NcclComm(lib, ops, i, n, devices[i], timeoutSeconds));
  const Deadline deadline = Deadline::after(timeoutSeconds);
  const nccl::Api& api = lib.api();
  nccl::Result r = api.groupStart();
  if (r != nccl::kSuccess) throw NcclError("ncclGroupStart failed: " + std::to_string(r));
  std::string failure;
  {
    CurrentDevice current(ops, devices[0]);
    for (int i = 0; i < n && failure.empty(); ++i) {
      ops.setDevice(devices[i]);
      nccl::ConfigV21400 config;
      config.blocking = 0;
      r = api.commInitRankConfig(&comms[i]->comm_, n, id, i, &config);
      if (r != nccl::kSuccess && r != nccl::kInProgress)
        failure = "ncclCommInitRankConfig for device " + std::to_string(devices[i]) +
                  " failed: " + comms[i]->describe(r);
    }
  }
  r = api.groupEnd();
  if (failure.empty() && r != nccl::kSuccess && r != nccl::kInProgress)
    failure =
        std::string("ncclGroupEnd failed: ") + resultName(r) + " (" + api.getErrorString(r) + ")";
  for (int i = 0; i < n && failure.empty(); ++i)
    if (comms[i]->comm_ == nullptr) failure = comms[i]->who() + " " + noCommunicator(lib);
  if (!failure.empty()) {
    for (auto& c : comms) c->abort(failure);
    throw NcclError(failure);
  }
  try {
    for (auto& c : comms) c->waitReady("communicator init", deadline);
  } catch (...) {
    for (auto& c : comms) c->abort("init of a sibling communicator failed");
    throw;
  }
  for (auto& c : comms) c->startWatchdog();
  return comms;
}

nccl::UniqueId NcclComm::uniqueId() {
  const nccl::Library& lib = nccl::library();
  nccl::UniqueId id{};
  const nccl::Result r = lib.api().getUniqueId(&id);
  if (r != nccl::kSuccess)
    throw NcclError(std::string("ncclGetUniqueId failed: ") + resultName(r) + " (" +
                    lib.api().getErrorString(r) + ")");
  return id;
}

NcclComm::~NcclComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (!aborted_.load() && comm_ != nullptr) {
    // Let outstanding work finish (finalize), but never wait long in a destructor.
    const Deadline deadline = Deadline::after(std::min(timeoutSeconds_, 10.0));
    bool flushed = false;
    try {
      const nccl::Result r = lib_.api().commFinalize(comm_);
      if (r == nccl::kSuccess || r == nccl::kInProgress) {
        int round = 0;
        nccl::Result state = nccl::kInProgress;
        while (lib_.api().commGetAsyncError(comm_, &state) == nccl::kSuccess &&
               state == nccl::kInProgress && !deadline.expired())
          pause(round);
        flushed = state == nccl::kSuccess;
      }
    } catch (...) {
    }
    if (flushed) {
      lib_.api().commDestroy(comm_);
    } else {
      PC_WARN(kNccl, who(), " outstanding NCCL work did not finish while closing; aborting it");
      lib_.api().commAbort(comm_);
    }
    comm_ = nullptr;
  }
  for (auto& p : pending_) ops_.destroyEvent(p.event, device_);
  for (auto e : freeEvents_) ops_.destroyEvent(e, device_);
}

// ---- calls ----

template <typename Call>
nccl::Result NcclComm::callNccl(Call&& call) {
  std::shared_lock<std::shared_mutex> lock(callMu_);
  if (aborted_.load() || comm_ == nullptr) {
    lock.unlock();
    checkUsable();
    throw Aborted(who() + " this communicator was aborted");
  }
  return call(comm_);
}

std::string NcclComm::who() const {
  return "[nccl rank " + std::to_string(rank_) + "/" + std::to_string(size_) +
         " on cuda:" + std::to_string(device_) + "]";
}

std::string NcclComm::describe(nccl::Result r) {
  std::string s = std::string(resultName(r)) + " (" + lib_.api().getErrorString(r) + ")";
  if (comm_ != nullptr) {
    const char* last = lib_.api().getLastError(comm_);
    if (last != nullptr && *last != '\0') s += "; NCCL's last error: " + std::string(last);
  }
  return s;
}

void NcclComm::throwIfFailed(std::unique_lock<std::mutex>& lock) {
  if (failure_ == Failure::kNone) return;
  const Failure kind = failure_;
  const std::string message = failureMessage_;
  lock.unlock();
  throwFailure(kind, message);
}

void NcclComm::checkUsable() {
  std::unique_lock<std::mutex> lock(mu_);
  throwIfFailed(lock);
}

void NcclComm::throwFailure(Failure kind, const std::string& message) {
  switch (kind) {
    case Failure::kTimeout: throw CollectiveTimeout(message);
    case Failure::kNccl: throw NcclError(message);
    case Failure::kCuda: throw CudaError(message);
    default: throw Aborted(message);
  }
}

void NcclComm::waitReady(const std::string& what, const Deadline& deadline) {
  int round = 0;
  while (true) {
    nccl::Result state = nccl::kSuccess;
    const nccl::Result r =
        callNccl([&](nccl::Comm c) { return lib_.api().commGetAsyncError(c, &state); });
    if (r != nccl::kSuccess) {
      const std::string msg = who() + " " + what + ": ncclCommGetAsyncError failed: " + describe(r);
      fail(Failure::kNccl, msg);
      throw NcclError(msg);
    }
    if (state == nccl::kSuccess) return;
    if (state != nccl::kInProgress) {
      const std::string msg = who() + " " + what + " failed: " + describe(state);
      fail(Failure::kNccl, msg);
      throw NcclError(msg);
    }
    if (deadline.expired()) {
      const std::string msg = who() + " " + what + " did not complete within " +
                              std::to_string(deadline.totalSeconds()) + " s; aborted";
      fail(Failure::kTimeout, msg);
      throw CollectiveTimeout(msg);
    }
    pause(round);
  }
}

void NcclComm::settle(nccl::Result r, const CallLabel& label, const Deadline& deadline) {
  if (r == nccl::kSuccess) return;
  if (r == nccl::kInProgress) {
    waitReady(label.str(), deadline);
    return;
  }
  const std::string msg = who() + " " + label.str() + " failed: " + describe(r);
  // Argument errors leave the communicator usable; anything else does not.
  if (r != nccl::kInvalidArgument && r != nccl::kInvalidUsage) fail(Failure::kNccl, msg);
  throw NcclError(msg);
}

std::string NcclComm::CallLabel::str() const {
  return std::string(collective) + "#" + std::to_string(seq) + " (" + std::to_string(count) + " " +
         dtypeName(dtype) + ")";
}

NcclComm::CallLabel NcclComm::admit(const char* collective, size_t count, DType dtype) {
  std::unique_lock<std::mutex> lock(mu_);
  throwIfFailed(lock);
  return {collective, seq_++, count, dtype};
}

void NcclComm::enqueued(cuda::Stream stream, const CallLabel& label) {
  if (tlGroup.depth > 0) {
    tlGroup.ops.push_back({this, stream, label});
    return;
  }
  watch(stream, label);
}

void NcclComm::watch(cuda::Stream stream, const CallLabel& label) {
  cuda::Event event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!freeEvents_.empty()) {
      event = freeEvents_.back();
      freeEvents_.pop_back();
    }
  }
  try {
    if (event == nullptr) event = ops_.createEvent(device_);
    ops_.recordEvent(event, stream, device_);
  } catch (const CudaError& e) {
    if (event != nullptr) ops_.destroyEvent(event, device_);
    fail(Failure::kCuda, who() + " " + label.str() + ": " + e.what());
    throw;
  }
  bool wasIdle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wasIdle = pending_.empty() && examining_ == 0;
    pending_.push_back({event, stream, Deadline::after(timeoutSeconds_), label});
  }
  // Only an idle watchdog sleeps until told; a busy one polls on its own. Waking it on every
  // call put a pass over the pending events (driver calls, under mu_) beside each enqueue.
  if (wasIdle) cv_.notify_all();
}

template <typename Call>
void NcclComm::collective(const char* name, size_t count, DType dtype, cuda::Stream stream,
                          Call&& call) {
  const CallLabel label = admit(name, count, dtype);
  const Deadline deadline = Deadline::after(timeoutSeconds_);
  settle(callNccl(std::forward<Call>(call)), label, deadline);
  enqueued(stream, label);
}

void NcclComm::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                         cuda::Stream stream) {
  const auto t = dataType(dtype);
  const auto o = redOp(dtype, op);
  collective("allreduce", count, dtype, stream, [&](nccl::Comm c) {
    return lib_.api().allReduce(send, recv, count, t, o, c, stream);
  });
}

void NcclComm::reduceScatter(const void* send, void* recv, size_t recvCount, DType dtype,
                             ReduceOp op, cuda::Stream stream) {
  const auto t = dataType(dtype);
  const auto o = redOp(dtype, op);
  collective("reduce_scatter", recvCount, dtype, stream, [&](nccl::Comm c) {
    return lib_.api().reduceScatter(send, recv, recvCount, t, o, c, stream);
  });
}

void NcclComm::allgather(const void* send, void* recv, size_t sendCount, DType dtype,
                         cuda::Stream stream) {
  const auto t = dataType(dtype);
  collective("allgather", sendCount, dtype, stream, [&](nccl::Comm c) {
    return lib_.api().allGather(send, recv, sendCount, t, c, stream);
  });
}

void NcclComm::broadcast(const void* send, void* recv, size_t count, DType dtype, int root,
                         cuda::Stream stream) {
  const auto t = dataType(dtype);
  PC_CHECK(root >= 0 && root < size_, "root ", root, " is out of range for ", size_, " ranks");
  collective("broadcast", count, dtype, stream, [&](nccl::Comm c) {
    return lib_.api().broadcast(send, recv, count, t, root, c, stream);
  });
}

void NcclComm::reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      int root, cuda::Stream stream) {
  const auto t = dataType(dtype);
  const auto o = redOp(dtype, op);
  PC_CHECK(root >= 0 && root < size_, "root ", root, " is out of range for ", size_, " ranks");
  collective("reduce", count, dtype, stream, [&](nccl::Comm c) {
    return lib_.api().reduce(send, recv, count, t, o, root, c, stream);
  });
}

void NcclComm::groupStart() {
  const nccl::Library& lib = nccl::library();
  const nccl::Result r = lib.api().groupStart();
  if (r != nccl::kSuccess)
    throw NcclError(std::string("ncclGroupStart failed: ") + resultName(r) + " (" +
                    lib.api().getErrorString(r) + ")");
  ++tlGroup.depth;
}

void NcclComm::groupEnd() {
  const nccl::Library& lib = nccl::library();
  PC_CHECK(tlGroup.depth > 0, "group_end() without a matching group_start() on this thread");
  const nccl::Result r = lib.api().groupEnd();
  if (--tlGroup.depth > 0) return;  // nested: NCCL launches at the outermost end
  std::vector<GroupState::Op> ops = std::move(tlGroup.ops);
  tlGroup.ops.clear();
  if (r != nccl::kSuccess && r != nccl::kInProgress) {
    std::string msg = std::string("ncclGroupEnd failed: ") + resultName(r) + " (" +
                      lib.api().getErrorString(r) + ")";
    for (auto& op : ops)
      op.comm->fail(Failure::kNccl, op.comm->who() + " " + op.label.str() + ": " + msg);
    throw NcclError(msg);
  }
  std::vector<NcclComm*> comms;
  for (auto& op : ops)
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
  for (NcclComm* c : comms) c->waitReady("group", Deadline::after(c->timeoutSeconds_));
  for (auto& op : ops) op.comm->watch(op.stream, op.label);
}

// ---- completion, failure, watchdog ----

bool NcclComm::synchronize(double timeoutSeconds) {
  const Deadline deadline = Deadline::after(timeoutSeconds < 0 ? 0 : timeoutSeconds);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    throwIfFailed(lock);
    if (pending_.empty() && examining_ == 0) return true;
    if (deadline.bounded() && deadline.expired()) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

bool NcclComm::isCompleted() {
  return synchronize(1e-9);
}

std::string NcclComm::failure() {
  std::lock_guard<std::mutex> lock(mu_);
  return failureMessage_;
}

std::string NcclComm::asyncError() {
  try {
    nccl::Result state = nccl::kSuccess;
    const nccl::Result r =
        callNccl([&](nccl::Comm c) { return lib_.api().commGetAsyncError(c, &state); });
    if (r != nccl::kSuccess) return describe(r);
    if (state != nccl::kSuccess && state != nccl::kInProgress) return describe(state);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

void NcclComm::abort(const std::string& reason) noexcept {
  fail(Failure::kAborted, who() + " aborted: " + reason);
}

void NcclComm::fail(Failure kind, const std::string& message) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_ == Failure::kNone) {
      failure_ = kind;
      failureMessage_ = message;
    }
  }
  if (!aborted_.exchange(true)) {
    PC_WARN(kNccl, message);
    // Exclusive: waits for NCCL calls in flight on other threads (non-blocking communicators
    // return promptly), so the handle is never used after NCCL freed it.
    std::unique_lock<std::shared_mutex> lock(callMu_);
    if (comm_ != nullptr) lib_.api().commAbort(comm_);
    comm_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : pending_) ops_.destroyEvent(p.event, device_);
    pending_.clear();
  }
  cv_.notify_all();
}

void NcclComm::startWatchdog() {
  watchdog_ = std::thread([this] { watchdogLoop(); });
}

// How many of one stream's collectives (oldest first) have finished: a stream runs its work in
// order, so the finished ones are a prefix, found with a query of the oldest, one of the newest,
// and a binary search between them when neither settles it. Retiring a thousand finished
// collectives costs a few queries, not a thousand, and a stalled stream costs one: its oldest.
size_t NcclComm::finishedPrefix(const std::deque<Pending>& taken, const std::vector<size_t>& stream,
                                size_t& queried) {
  auto done = [&](size_t i) {
    queried = stream[i];
    return ops_.eventDone(taken[stream[i]].event);
  };
  const size_t n = stream.size();
  if (!done(0)) return 0;
  if (n == 1 || done(n - 1)) return n;
  size_t lo = 1, hi = n - 1;  // entries below lo finished; hi has not
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (done(mid)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

NcclComm::Examined NcclComm::examine(const std::deque<Pending>& taken) {
  Examined result;
  result.finished.assign(taken.size(), false);
  // Positions in `taken` of each stream's collectives, oldest first.
  std::vector<std::pair<cuda::Stream, std::vector<size_t>>> streams;
  for (size_t i = 0; i < taken.size(); ++i) {
    auto it = std::find_if(streams.begin(), streams.end(),
                           [&](const auto& s) { return s.first == taken[i].stream; });
    if (it == streams.end()) it = streams.insert(streams.end(), {taken[i].stream, {}});
    it->second.push_back(i);
  }
  for (const auto& [stream, positions] : streams) {
    size_t queried = positions.front(), finished = 0;
    try {
      finished = finishedPrefix(taken, positions, queried);
    } catch (const std::exception& e) {
      result.cudaFailure =
          who() + " " + taken[queried].label.str() + " failed on the device: " + e.what();
      return result;
    }
    for (size_t k = 0; k < finished; ++k) result.finished[positions[k]] = true;
  }
  for (size_t i = 0; i < taken.size() && result.expired.empty(); ++i) {
    const Pending& p = taken[i];
    if (!result.finished[i] && p.deadline.expired())
      result.expired = who() + " " + p.label.str() + " did not finish within " +
                       std::to_string(p.deadline.totalSeconds()) +
                       " s; the communicator was aborted. Every rank must call the same "
                       "collectives in the same order; raise timeout= (PYCOLLECTIVE_TIMEOUT) if "
                       "ranks are legitimately slow";
  }
  return result;
}

void NcclComm::watchdogLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (pending_.empty() || failure_ != Failure::kNone) {
      cv_.wait(lock, [&] { return stop_ || (!pending_.empty() && failure_ == Failure::kNone); });
      continue;
    }
    // The pass takes the pending collectives out of the list and queries their events without
    // mu_, so an enqueue (which takes mu_) never waits behind a driver call, even one that does
    // not return. What is left unfinished goes back in front, in order; examining_ keeps the
    // taken ones counted as outstanding meanwhile.
    std::deque<Pending> taken;
    taken.swap(pending_);
    examining_ = taken.size();
    lock.unlock();
    Examined examined = examine(taken);
    lock.lock();
    examining_ = 0;
    if (failure_ != Failure::kNone) {  // fail() ran meanwhile and dropped what it saw
      for (auto& p : taken) ops_.destroyEvent(p.event, device_);
      cv_.notify_all();
      continue;
    }
    bool progressed = false;
    for (size_t i = taken.size(); i-- > 0;) {
      if (examined.finished[i]) {
        freeEvents_.push_back(taken[i].event);
        progressed = true;
      } else {
        pending_.push_front(std::move(taken[i]));
      }
    }
    if (progressed) cv_.notify_all();
    if (!examined.cudaFailure.empty() || !examined.expired.empty()) {
      lock.unlock();
      if (!examined.cudaFailure.empty()) {
        fail(Failure::kCuda, examined.cudaFailure);
      } else {
        fail(Failure::kTimeout, examined.expired);
      }
      lock.lock();
      continue;
    }
    if (pending_.empty()) continue;
    // A peer that died or a network failure shows up here, long before any deadline.
    lock.unlock();
    const std::string asyncFailure = asyncError();
    if (!asyncFailure.empty() && !aborted_.load())
      fail(Failure::kNccl, who() + " NCCL reported an asynchronous error: " + asyncFailure);
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

}  // namespace pycollective

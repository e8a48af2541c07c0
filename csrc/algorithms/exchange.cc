#include "algorithms/exchange.h"

#include <algorithm>

#include "core/error.h"
#include "core/params.h"
#include "core/stream_copy.h"
#include "cuda/device_ops.h"

namespace pycollective {

namespace {
// The bookkeeping vectors of this thread's last finished call, empty but with their capacity:
// the next call takes them instead of allocating its own. A small collective is a few
// microseconds, and these were four to six of the allocations it paid each time (perf put
// malloc and free at about 15% of a 2-rank 8-byte call). A call that finds them taken (another
// call alive on this thread) allocates as before.
struct SpareVectors {
  std::vector<uint32_t> sendSteps, recvSteps;
  std::vector<Pending> inFlight;
  std::vector<Link*> activeLinks;
};
thread_local SpareVectors spareVectors;

template <typename T>
void takeSpare(std::vector<T>& mine, std::vector<T>& spare) {
  if (spare.capacity() > mine.capacity()) mine.swap(spare);
}
template <typename T>
void giveSpare(std::vector<T>& mine, std::vector<T>& spare) {
  mine.clear();  // inFlight's requests are released here, not kept alive by the spare
  if (mine.capacity() > spare.capacity()) mine.swap(spare);
}
}  // namespace

Exchange::Exchange(Group group, const CollectiveArgs& args, uint8_t algoIndex, uint64_t seq)
    : group_(std::move(group)), state_(std::make_shared<CallState>()) {
  Communicator& comm = group_.comm();
  CallState& s = *state_;
  s.comm = &comm;
  s.header.seq = seq;
  s.header.count = args.count;
  s.header.shapeHash = args.shapeHash;
  s.header.kind = static_cast<uint8_t>(args.kind);
  s.header.dtype = static_cast<uint8_t>(args.dtype);
  s.header.op = static_cast<uint8_t>(args.op);
  s.header.algo = algoIndex;
  s.header.root = args.root;
  s.header.updateRule = args.updateRule;
  s.header.wire = static_cast<uint8_t>(args.wire);
  s.wire = args.wire;
  bool reduces = reducesData(args.kind);
  s.dtype = args.dtype;
  s.elemSize = elementSize(args.dtype);
  if (args.device < 0) {
    s.reduce = reduces ? lookupReduce(args.dtype, args.op) : nullptr;
    s.segmentBytes = args.segmentBytes ? args.segmentBytes : params::segmentBytes();
    s.reduceThreads = comm.reduceThreads();
  } else {
    // Device buffers: peers must share this address space (their links copy and reduce
    // straight between device buffers), and every local step is a device operation. A failure
    // here (no CUDA, a CUDA error) aborts the communicator, so peers stop waiting for this rank.
    try {
      cuda::DeviceOps& ops = cuda::requireDeviceOps("a collective on device buffers");
      for (int p = 0; p < group_.size(); ++p)
        PC_CHECK(p == group_.rank() || group_.link(p).sharesMemory(), comm.who(),
                 " device buffers need peers in this process (in-process replicas), but rank ",
                 group_.globalRank(p), " is reached over ", group_.link(p).describe(),
                 "; use algo=\"nccl\" for device buffers across processes");
      s.device = args.device;
      s.copy = ops.copyFn();
      s.reduce = reduces ? ops.reduceFn(args.dtype, args.op) : nullptr;
      s.segmentBytes = args.segmentBytes ? args.segmentBytes : params::deviceSegmentBytes();
      s.previousDevice = ops.beginCall(args.device, args.stream);
    } catch (const std::exception& e) {
      comm.abort(e.what());
      throw;
    }
  }
  double timeout = args.timeoutSeconds > 0 ? args.timeoutSeconds : comm.timeoutSeconds();
  s.deadline = Deadline::after(timeout);
  SpareVectors& spare = spareVectors;
  takeSpare(s.sendSteps, spare.sendSteps);
  takeSpare(s.recvSteps, spare.recvSteps);
  takeSpare(s.inFlight, spare.inFlight);
  takeSpare(s.activeLinks, spare.activeLinks);
  s.sendSteps.assign(comm.size(), 0);
  s.recvSteps.assign(comm.size(), 0);
}

Exchange::CallState::~CallState() {
  SpareVectors& spare = spareVectors;
  giveSpare(sendSteps, spare.sendSteps);
  giveSpare(recvSteps, spare.recvSteps);
  giveSpare(inFlight, spare.inFlight);
  giveSpare(activeLinks, spare.activeLinks);
  if (wireArena != nullptr) wireArena->release();
  if (device >= 0 && previousDevice >= 0) {
    if (cuda::DeviceOps* ops = cuda::deviceOps()) ops->endCall(previousDevice);
  }
}

Exchange Exchange::on(Group subgroup) const {
  return Exchange(std::move(subgroup), state_);
}

RequestPtr Exchange::track(int globalPeer, RequestPtr request, bool isSend) {
  Link* link = &state_->comm->link(globalPeer);
  state_->inFlight.push_back({link, request, globalPeer, isSend});
  auto& active = state_->activeLinks;
  if (std::find(active.begin(), active.end(), link) == active.end()) active.push_back(link);
  return request;
}

namespace {
RequestPtr completed() {
  auto r = std::make_shared<Request>();
  r->done.store(true);
  return r;
}
}  // namespace

bool Exchange::encodes(int peer) {
  return state_->wire != WireFormat::kNative && group_.link(peer).isNetwork();
}

uint16_t* Exchange::wireBuffer(size_t count) {
  CallState& s = *state_;
  if (s.wireArena == nullptr && s.wireBuffers.empty()) s.wireArena = WireArena::acquire();
  if (s.wireArena != nullptr) return s.wireArena->take(count);
  s.wireBuffers.emplace_back(new uint16_t[count]);
  return s.wireBuffers.back().get();
}

RequestPtr Exchange::send(int peer, const void* data, size_t bytes) {
  if (bytes == 0) return completed();
  int g = group_.globalRank(peer);
  FrameHeader h = state_->header;
  h.step = state_->sendSteps[g]++;
  if (encodes(peer)) {
    // Encoded now, while the data is what the algorithm means to send: the link reads the
    // encoded copy later, at its own pace.
    const size_t count = bytes / sizeof(float);
    uint16_t* wire = wireBuffer(count);
    encodeWire(state_->wire, wire, static_cast<const float*>(data), count);
    data = wire;
    bytes = count * sizeof(uint16_t);
  }
  h.bytes = bytes;
  return track(g, group_.link(peer).postSend(data, bytes, h), true);
}

RequestPtr Exchange::recv(int peer, void* dst, size_t bytes) {
  return postRecv(peer, dst, nullptr, bytes, false);
}

RequestPtr Exchange::recvReduce(int peer, void* dst, const void* accum, size_t bytes) {
  PC_ASSERT(state_->reduce != nullptr, "recvReduce in a collective that does not reduce");
  return postRecv(peer, dst, accum, bytes, true);
}

RequestPtr Exchange::postRecv(int peer, void* dst, const void* accum, size_t bytes, bool reduce) {
  if (bytes == 0) return completed();
  int g = group_.globalRank(peer);
  FrameHeader h = state_->header;
  h.step = state_->recvSteps[g]++;
  if (encodes(peer)) {
    const size_t count = bytes / sizeof(float);
    uint16_t* wire = wireBuffer(count);
    RecvSpec spec;
    spec.dst = wire;
    spec.bytes = count * sizeof(uint16_t);
    spec.elemSize = sizeof(uint16_t);
    h.bytes = spec.bytes;
    RequestPtr request = track(g, group_.link(peer).postRecv(spec, h), false);
    state_->decodes.push_back(Decode{request, static_cast<float*>(dst),
                                     static_cast<const float*>(accum != nullptr ? accum : dst),
                                     wire, count, reduce});
    return request;
  }
  h.bytes = bytes;
  RecvSpec spec;
  spec.dst = dst;
  spec.bytes = bytes;
  spec.elemSize = state_->elemSize;
  spec.threads = state_->reduceThreads;
  spec.copy = state_->copy;
  if (reduce) {
    spec.reduce = state_->reduce;
    spec.accum = accum;
  }
  return track(g, group_.link(peer).postRecv(spec, h), false);
}

void Exchange::reduceLocal(void* dst, const void* a, const void* b, size_t bytes) const {
  if (bytes == 0) return;
  if (state_->wire != WireFormat::kNative) {
    reduceRounded(state_->wire, state_->reduce, static_cast<float*>(dst),
                  static_cast<const float*>(a), static_cast<const float*>(b),
                  bytes / sizeof(float));
    return;
  }
  reduceParallel(state_->reduce, dst, a, b, bytes / state_->elemSize, state_->elemSize,
                 state_->reduceThreads);
}

void Exchange::store(void* dst, const void* src, size_t bytes) const {
  if (state_->copy == nullptr)
    streamCopy(dst, src, bytes);
  else
    copy(dst, src, bytes);
}

void* Exchange::scratch(int slot, size_t bytes) {
  if (state_->device < 0) return state_->comm->scratch(slot, bytes);
  return state_->comm->deviceScratch(slot, bytes, state_->device);
}

void Exchange::roundToWire(void* data, size_t count) const {
  if (compressed()) pycollective::roundToWire(state_->wire, static_cast<float*>(data), count);
}

void Exchange::scale(void* data, size_t count, double factor) const {
  if (state_->device < 0) {
    scaleInPlace(data, count, state_->dtype, factor);
  } else {
    cuda::requireDeviceOps("scaling device buffers").scale(data, count, state_->dtype, factor);
  }
}

void Exchange::prune() {
  auto& f = state_->inFlight;
  f.erase(
      std::remove_if(f.begin(), f.end(), [](const Pending& p) { return p.request->done.load(); }),
      f.end());
}

void Exchange::decode(Decode& d) {
  if (d.done) return;
  d.done = true;
  if (d.reduce)
    decodeReduce(state_->wire, state_->reduce, d.dst, d.accum, d.incoming, d.count);
  else
    decodeWire(state_->wire, d.dst, d.incoming, d.count);
}

void Exchange::wait(const RequestPtr& request) {
  if (!request->done.load(std::memory_order_acquire)) {
    const Pending* mine = nullptr;
    for (const auto& p : state_->inFlight)
      if (p.request == request) mine = &p;
    PC_ASSERT(mine != nullptr, "waiting for a request this call did not post");
    Pending copy = *mine;
    state_->comm->waitAll({copy}, state_->activeLinks, state_->deadline, state_->header);
    prune();
  }
  for (Decode& d : state_->decodes)
    if (d.request == request) decode(d);
}

void Exchange::waitAll() {
  prune();
  state_->comm->waitAll(state_->inFlight, state_->activeLinks, state_->deadline, state_->header);
  state_->inFlight.clear();
  for (Decode& d : state_->decodes) decode(d);
  state_->decodes.clear();
}

}  // namespace pycollective

#include "transport/frame.h"

#include <atomic>
#include <sstream>

#include "reduce/wire_codec.h"

namespace pycollective {

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllreduceUpdate: return "allreduce_update";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kSendRecv: return "send/recv";
  }
  return "?";
}

namespace {

std::atomic<HeaderFieldNamer> algorithmNamer{nullptr};
std::atomic<HeaderFieldNamer> updateRuleNamer{nullptr};

std::string nameOf(const std::atomic<HeaderFieldNamer>& namer, const char* what, uint8_t index) {
  HeaderFieldNamer f = namer.load(std::memory_order_acquire);
  return f != nullptr ? std::string(f(index)) : std::string(what) + " " + std::to_string(index);
}

std::string algorithmName(uint8_t index) {
  return nameOf(algorithmNamer, "algorithm", index);
}
std::string updateRuleName(uint8_t rule) {
  return nameOf(updateRuleNamer, "rule", rule);
}

}  // namespace

void registerAlgorithmNamer(HeaderFieldNamer namer) {
  algorithmNamer.store(namer, std::memory_order_release);
}

void registerUpdateRuleNamer(HeaderFieldNamer namer) {
  updateRuleNamer.store(namer, std::memory_order_release);
}

std::string describeCall(const FrameHeader& h) {
  std::ostringstream os;
  os << collectiveName(static_cast<CollectiveKind>(h.kind)) << "#" << h.seq << " ("
     << algorithmName(h.algo) << ", " << dtypeName(static_cast<DType>(h.dtype)) << ", " << h.count
     << " elems";
  auto kind = static_cast<CollectiveKind>(h.kind);
  if (reducesData(kind)) os << ", op " << opName(static_cast<ReduceOp>(h.op));
  if (kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce ||
      kind == CollectiveKind::kGather || kind == CollectiveKind::kScatter)
    os << ", root " << h.root;
  if (kind == CollectiveKind::kSendRecv) os << ", from group rank " << h.root;
  if (kind == CollectiveKind::kAllreduceUpdate)
    os << ", update rule " << updateRuleName(h.updateRule);
  if (h.wire != 0) os << ", compressed to " << wireFormatName(static_cast<WireFormat>(h.wire));
  os << ")";
  return os.str();
}

namespace {
// Every field a header carries, compared without building a word: this runs for every message,
// and the sentence below (an ostringstream and a dozen strings) cost more than a small
// collective's whole transfer.
bool sameFrame(const FrameHeader& a, const FrameHeader& b) {
  return a.magic == b.magic && a.step == b.step && a.seq == b.seq && a.count == b.count &&
         a.bytes == b.bytes && a.shapeHash == b.shapeHash && a.kind == b.kind &&
         a.dtype == b.dtype && a.op == b.op && a.algo == b.algo && a.root == b.root &&
         a.updateRule == b.updateRule && a.wire == b.wire;
}
}  // namespace

std::string headerMismatch(const FrameHeader& expected, const FrameHeader& got) {
  if (sameFrame(expected, got)) return "";  // `expected` carries the magic
  if (got.magic != FrameHeader::kMagic)
    return "the frame is not a pycollective frame (bad magic): the byte stream is corrupt or "
           "something else is connected to this port";
  std::ostringstream os;
  auto field = [&](const char* name, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) os << "; " << name << ": here " << mine << ", peer " << theirs;
  };
  field("collective", collectiveName(static_cast<CollectiveKind>(expected.kind)),
        collectiveName(static_cast<CollectiveKind>(got.kind)));
  field("sequence number", std::to_string(expected.seq), std::to_string(got.seq));
  field("algorithm", algorithmName(expected.algo), algorithmName(got.algo));
  if (expected.algo != got.algo)  // the same algo="auto" call may be set up differently per rank
    os << " (algo=\"auto\" chooses alike on every rank only where PYCOLLECTIVE_AUTO_TRIALS and "
          "PYCOLLECTIVE_TUNING are the same on each)";
  field("dtype", dtypeName(static_cast<DType>(expected.dtype)),
        dtypeName(static_cast<DType>(got.dtype)));
  field("element count", std::to_string(expected.count), std::to_string(got.count));
  if (expected.count == got.count && expected.shapeHash != got.shapeHash)
    os << "; shape: the same element count in a different shape";
  field("op", opName(static_cast<ReduceOp>(expected.op)), opName(static_cast<ReduceOp>(got.op)));
  field("root", std::to_string(expected.root), std::to_string(got.root));
  field("update rule", updateRuleName(expected.updateRule), updateRuleName(got.updateRule));
  field("compress", wireFormatName(static_cast<WireFormat>(expected.wire)),
        wireFormatName(static_cast<WireFormat>(got.wire)));
  std::string fields = os.str();
  if (fields.empty()) {
    // Same call: only the step or size can differ, which is a pycollective bug.
    if (expected.step != got.step || expected.bytes != got.bytes)
      return "same call but message step/size differ (step " + std::to_string(expected.step) +
             " vs " + std::to_string(got.step) + ", bytes " + std::to_string(expected.bytes) +
             " vs " + std::to_string(got.bytes) + ")";
    return "";
  }
  return fields.substr(2);
}

std::string frameError(int rank, int peer, const FrameHeader& expected, const FrameHeader& got,
                       size_t expectedBytes) {
  if (got.bytes == expectedBytes && sameFrame(expected, got)) return "";
  std::string mismatch = headerMismatch(expected, got);
  if (mismatch.empty() && got.bytes != expectedBytes)
    mismatch = "message of " + std::to_string(got.bytes) + " bytes where " +
               std::to_string(expectedBytes) + " were expected";
  if (mismatch.empty()) return "";
  return "rank " + std::to_string(rank) + " expected " + describeCall(expected) + " but rank " +
         std::to_string(peer) + " sent " + describeCall(got) + ": " + mismatch +
         ". Every rank must call the same collectives, in the same order, with the same "
         "arguments.";
}

}  // namespace pycollective

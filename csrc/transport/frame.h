#pragma once
// Every message between two ranks carries a FrameHeader describing the call that sent it. The
// receiver compares it with the header it expects, so ranks that called different collectives
// (or the same one with other arguments) fail loudly instead of mixing data or hanging.
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace pycollective {

enum class CollectiveKind : uint8_t {
  kAllreduce = 0,
  kReduceScatter = 1,
  kAllgather = 2,
  kBroadcast = 3,
  kReduce = 4,
  kBarrier = 5,
  // An allreduce consumed by an optimizer step as it is made (optim/allreduce_update.h):
  // reduce-scatter of the gradients, then allgather of the updated state.
  kAllreduceUpdate = 6,
  // Pairwise exchanges (algorithms/pairwise.cc): every rank sends its own buffer to each peer
  // and receives each peer's into its own (CollectiveArgs::peers says which and how much).
  kAlltoall = 7,
  kGather = 8,     // every rank's buffer to the root
  kScatter = 9,    // one buffer from the root to each rank
  kSendRecv = 10,  // point to point in a group of two: `root` (group rank) sends to the other
};
constexpr int kNumCollectiveKinds = 11;  // keep after the last kind
const char* collectiveName(CollectiveKind kind);
// Whether the collective combines the ranks' data with a reduction op.
inline bool reducesData(CollectiveKind kind) {
  return kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllreduceUpdate;
}

// Collectives made of one message per pair of ranks, each with its own buffers and sizes; only
// the pairwise algorithm runs them.
inline bool isPairwise(CollectiveKind kind) {
  return kind == CollectiveKind::kAlltoall || kind == CollectiveKind::kGather ||
         kind == CollectiveKind::kScatter || kind == CollectiveKind::kSendRecv;
}

struct FrameHeader {
  static constexpr uint32_t kMagic = 0x4c4f4350;  // "PCOL"
  uint32_t magic = kMagic;
  uint32_t step = 0;       // message index within the call, same on both sides
  uint64_t seq = 0;        // collective sequence number within the communicator
  uint64_t count = 0;      // elements of the whole call (per rank)
  uint64_t bytes = 0;      // payload bytes that follow this header
  uint32_t shapeHash = 0;  // hash of the caller's shape: same count, other shape is an error
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t algo = 0;        // index in the algorithm registry
  int32_t root = 0;        // broadcast/reduce/gather/scatter: the root; send/recv: the sender
  uint8_t updateRule = 0;  // allreduce_update: the optimizer rule (optim/replicated_update.h)
  uint8_t wire = 0;        // how values cross network links (reduce/wire_codec.h WireFormat)
  uint8_t reserved[2] = {0, 0};
};
static_assert(sizeof(FrameHeader) == 48, "FrameHeader is part of the wire format");

// The header carries indices that belong to the layers above (the algorithm registry, the
// optimizer's update rules). Error messages name them through functions those layers register
// at start-up, so that the transport depends on nothing above it; unregistered, an index is
// printed as a number.
using HeaderFieldNamer = const char* (*)(uint8_t index);
void registerAlgorithmNamer(HeaderFieldNamer namer);
void registerUpdateRuleNamer(HeaderFieldNamer namer);

// One line describing the call a header belongs to: "allreduce#17 (ring, float32, 4096 elems)".
std::string describeCall(const FrameHeader& h);

// Returns "" when `got` matches `expected`, else a sentence naming every field that differs.
std::string headerMismatch(const FrameHeader& expected, const FrameHeader& got);

// What every transport checks when a frame arrives: "" if it is the one `rank` expected (header
// and `expectedBytes`), else the whole ProtocolError message, naming both ranks, both calls and
// what differed.
std::string frameError(int rank, int peer, const FrameHeader& expected, const FrameHeader& got,
                       size_t expectedBytes);

}  // namespace pycollective

#pragma once
// An Algorithm is a schedule of point-to-point steps over a Group. It never sees transports,
// dtypes or ops beyond the reduce function the Exchange hands it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "reduce/wire_codec.h"
#include "transport/frame.h"

namespace pycollective {

class Exchange;

// What one rank asked for. Buffer sizes per collective (count = elements of `in`):
//   allreduce       in[count] -> out[count]                 (out may equal in)
//   reduce_scatter  in[count] -> out[chunk(rank)]           (chunking.h splits count)
//   allgather       in[count] -> out[size * count]
//   broadcast       root: in[count] -> everyone's out[count] (in == out allowed)
//   reduce          in[count] -> out[count] at root only (out unused elsewhere)
//   pairwise kinds  (alltoall, gather, scatter, send/recv; isPairwise): in/out unused, `peers`
//                   holds what goes to and comes from each group rank (count: see PeerBuffer)

// One rank's buffers for one peer of a pairwise exchange: `sendCount` elements at `send` go to
// the peer, `recvCount` elements from it land at `recv` (0: nothing moves that way). The entry
// for this rank itself is a local copy (its two counts must agree).
struct PeerBuffer {
  const void* send = nullptr;
  size_t sendCount = 0;
  void* recv = nullptr;
  size_t recvCount = 0;
};

// A prepared allreduce over buffers that every rank of a host maps (pycollective.shared_empty):
// every group rank's input and output at this process's addresses, and a key that the ranks of
// one plan share. direct reads and writes them in place of swapping addresses.
struct MappedBuffers {
  std::vector<const void*> in;
  std::vector<void*> out;
  uint64_t key = 0;
};

struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  uint8_t updateRule = 0;  // allreduce_update: the optimizer rule (its own header field)
  uint32_t shapeHash = 0;
  size_t segmentBytes = 0;    // pipeline segment; 0 = PYCOLLECTIVE_SEGMENT_BYTES
  double timeoutSeconds = 0;  // 0 = the communicator's timeout
  // CUDA device holding in/out, or -1 for host memory. Device buffers reach the algorithms
  // through the same Exchange calls (copy, scratch, reduce), which then use DeviceOps.
  int device = -1;
  void* stream = nullptr;  // with device >= 0: the stream in/out are ordered on
  // float32 allreduce/reduce_scatter: how values cross network links (Exchange applies it).
  WireFormat wire = WireFormat::kNative;
  // Pairwise kinds: one entry per group rank (owned by the caller for the whole call).
  const PeerBuffer* peers = nullptr;
  // Allreduce prepared on mapped buffers (owned by the PreparedCollective), or nullptr.
  const MappedBuffers* mapped = nullptr;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  // "" if this algorithm can run the call on this group, else why not (shown to the user).
  virtual std::string unsupported(const Group& group, const CollectiveArgs& args) const = 0;
  // Estimated seconds under the alpha-beta-gamma model (used by algo="auto").
  virtual double cost(const Group& group, const CollectiveArgs& args) const = 0;
  virtual void run(Exchange& ex, const CollectiveArgs& args) const = 0;
};

}  // namespace pycollective

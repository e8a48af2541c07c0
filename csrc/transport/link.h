#pragma once
// A Link moves bytes between this rank and one peer. Algorithms see nothing else of a transport:
// the same ring runs over threads of one process, processes of one host, or hosts of a network.
//
// Contract:
//  - postSend / postRecv never block; they return a Request that completes later.
//  - Messages in one direction are delivered in the order they were posted; each postRecv is
//    matched with the next postSend of the peer, and its header is checked (ProtocolError).
//  - progress() advances posted requests without blocking. The caller's wait loop calls it on
//    every link it waits for; transports without a background thread do their I/O here.
//  - A receive may reduce instead of copy: dst = accum OP incoming (accum may be dst itself),
//    which lets transports reduce straight out of the peer's memory or their own staging area.
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "core/host_copy.h"
#include "reduce/reduce.h"
#include "transport/frame.h"

namespace pycollective {

class Notifier;

struct Request {
  std::atomic<bool> done{false};
};
using RequestPtr = std::shared_ptr<Request>;

struct RecvSpec {
  void* dst = nullptr;
  size_t bytes = 0;
  ReduceFn reduce = nullptr;    // nullptr: plain copy
  const void* accum = nullptr;  // with reduce: dst = accum OP incoming (nullptr means dst)
  size_t elemSize = 1;          // element size for reduce
  int threads = 1;              // threads a reduction may use (reduceParallel)
  CopyFn copy = nullptr;        // nullptr: hostCopy (device buffers: a device copy). Only
                                // links that share memory (sharesMemory()) get device buffers.
};

// Applies a whole incoming payload (spec.bytes at `src`) to a receive: copy, or reduce into
// spec.dst. Links that have the payload in one piece use it; streaming links apply pieces.
inline void applyPayload(const RecvSpec& s, const void* src) {
  if (s.bytes == 0) return;
  if (s.reduce != nullptr) {
    reduceParallel(s.reduce, s.dst, s.accum != nullptr ? s.accum : s.dst, src, s.bytes / s.elemSize,
                   s.elemSize, s.threads);
  } else if (s.copy != nullptr) {
    s.copy(s.dst, src, s.bytes);
  } else {
    hostCopy(s.dst, src, s.bytes);
  }
}

class Link {
 public:
  virtual ~Link() = default;

  virtual RequestPtr postSend(const void* data, size_t bytes, const FrameHeader& header) = 0;
  virtual RequestPtr postRecv(const RecvSpec& spec, const FrameHeader& expected) = 0;

  // Advances posted requests; returns true if anything moved. Throws RemoteError when the peer
  // failed or closed the link, ProtocolError when a header does not match.
  virtual bool progress() = 0;

  // Fails every pending and future request on both ends (as far as the transport can reach
  // the peer). Never throws, never blocks for long.
  virtual void abort(const std::string& reason) noexcept = 0;

  // "inproc -> rank 2", "tcp 10.0.0.5:4101 -> rank 2"
  virtual std::string describe() const = 0;

  // The doorbell this link rings when data arrives, or nullptr if the waiter must poll.
  virtual Notifier* notifier() { return nullptr; }

  // A socket the waiter may poll() for `pollEvents()` instead of spinning (-1: none). Links
  // without a notifier or socket are polled with a growing pause.
  virtual int pollFd() const { return -1; }
  virtual short pollEvents() const { return 0; }

  // True when the peer lives in this address space, so its buffers may be read and written
  // directly (the "direct" algorithm); pointers then travel as ordinary messages.
  virtual bool sharesMemory() const { return false; }

  // True when bytes cross a network (tcp, the grpc bridge) rather than memory: only such links
  // carry a compressed wire format (reduce/wire_codec.h); encoding for memory would only cost.
  virtual bool isNetwork() const { return false; }
};

}  // namespace pycollective

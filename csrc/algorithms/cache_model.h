#pragma once
// Whether a call's buffers stay in the CPU's cache from one call to the next: the cost model and
// the direct algorithm's choice of stores change with it.
#include "comm/communicator.h"

namespace pycollective {

// The model changes regime at the communicator's line (Communicator::cacheBytes: bytes a call
// reads and writes in all, every rank's input and output, 2 * n * S), so a cost may jump there
// (direct gets cheaper by its accumulator's passes, halving-doubling dearer by its own part's
// copy) where the measured times change smoothly: near the line `auto` may take either.
inline bool callStaysInCache(double lineBytes, double ranks, double bytesPerRank) {
  return 2 * ranks * bytesPerRank <= lineBytes;
}
inline bool callStaysInCache(const Communicator& comm, double ranks, double bytesPerRank) {
  return callStaysInCache(comm.cacheBytes(), ranks, bytesPerRank);
}

}  // namespace pycollective

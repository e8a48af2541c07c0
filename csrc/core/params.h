#pragma once
// Typed, checked accessors for the knobs native code uses (the table: core/knobs.h). Arguments
// beat the environment, the environment beats the default.
#include <cstddef>

namespace pycollective {
namespace params {

// Bytes per pipeline segment of the ring and chain algorithms (PYCOLLECTIVE_SEGMENT_BYTES).
size_t segmentBytes();
// The same for collectives on device buffers (PYCOLLECTIVE_DEVICE_SEGMENT_BYTES): larger,
// because every device step is a kernel launch plus a stream synchronization.
size_t deviceSegmentBytes();
// Default collective timeout in seconds (PYCOLLECTIVE_TIMEOUT).
double timeoutSeconds();
// Threads a single large reduction may use (PYCOLLECTIVE_REDUCE_THREADS, 0 = automatic).
int reduceThreads();
// Largest call algo "slots" runs through the host segment, bytes per rank
// (PYCOLLECTIVE_HOST_SLOT_BYTES).
size_t hostSlotBytes();

}  // namespace params
}  // namespace pycollective

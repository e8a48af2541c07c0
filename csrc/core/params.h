#pragma once
// The one table of PYCOLLECTIVE_* knobs read by native code. Python mirrors it in
// pycollective/config.py. Arguments beat the environment, the environment beats the default.
#include <cstddef>
#include <string>

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

// Reads an integer / floating / string environment variable, or returns the fallback.
long long envInt(const char* name, long long fallback);
double envDouble(const char* name, double fallback);
std::string envString(const char* name, const std::string& fallback);

}  // namespace params
}  // namespace pycollective

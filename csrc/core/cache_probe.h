#pragma once
// Where this machine's cache ends, as the cost model needs it (algorithms/cache_model.h): the
// bytes a call may read and write in all and still find in cache on its next run. Caches as the
// OS reports them do not say it: a 2-vCPU EPYC VM reports its socket's 256 MiB of L3 and kept
// 32 MiB; a 2-vCPU Xeon VM reports 480 MiB and keeps 2 MiB (its L2), copies of larger working
// sets running at memory speed.
#include <cstddef>
#include <string>
#include <vector>

namespace pycollective {

// PYCOLLECTIVE_CACHE_BYTES if set, else measured once per process (about 80 ms, a 64 MiB
// buffer held meanwhile): the last-level cache the OS reports, when it is 8-64 MiB and a
// read-and-write pass of a quarter or an eighth of it runs 1.3x the speed of the faster of a 32
// and a 64 MiB one (in one of three tries, about 60 ms each after the first); else the line
// lineFromPasses draws from passes of 1 to 16 MiB. Only in-process groups use it (one process
// decides for every replica); groups across processes keep the fixed line, which every rank
// then shares.
size_t cacheResidentBytes();

// The line from the probe's passes: `passRates[i]` the rate of a working set of 1 MiB << i (up
// to 16 MiB), `referenceRate` the faster of a 32 and a 64 MiB pass, `reportedBytes` the
// last-level cache the OS reports (0: none). The largest set, doubling from 1 MiB, whose pass
// runs 1.5x the reference, or the reported cache where that reaches 16 MiB
// (lineWithReportedCache); a profile without a step (the 1 MiB set under 1.5x the reference)
// takes the reported cache where it is 8-64 MiB, else 1 MiB.
size_t lineFromPasses(double referenceRate, const std::vector<double>& passRates,
                      size_t reportedBytes);

// The line from the probe's `measuredLine` and the cache size the OS reports (0: none).
size_t lineWithReportedCache(size_t measuredLine, size_t reportedBytes);

// A cache size as /sys/devices/system/cpu/cpu*/cache/index*/size writes it ("32768K"), in
// bytes; 0 for text it cannot read.
size_t parseCacheSize(const std::string& text);

}  // namespace pycollective

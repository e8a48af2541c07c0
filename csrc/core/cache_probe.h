#pragma once
// Where this machine's cache ends, as the cost model needs it (algorithms/cache_model.h): the
// bytes a call may read and write in all and still find in cache on its next run. Caches as the
// OS reports them do not say it: a 2-vCPU EPYC VM reports its socket's 256 MiB of L3 and kept
// 32 MiB; a 2-vCPU Xeon VM reports 480 MiB and keeps 2 MiB (its L2), copies of larger working
// sets running at memory speed.
#include <cstddef>

namespace pycollective {

// PYCOLLECTIVE_CACHE_BYTES if set, else measured once per process (about 80 ms, a 64 MiB
// buffer held meanwhile): the largest working set from 1 MiB to 16 MiB, doubling, whose
// read-and-write pass still runs at 1.5x the speed of the faster of a 32 and a 64 MiB one. Only
// in-process groups use it (one process decides for every replica); groups across processes keep
// the fixed line, which every rank then shares.
size_t cacheResidentBytes();

}  // namespace pycollective

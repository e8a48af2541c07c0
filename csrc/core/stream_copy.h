#pragma once
// Copies with non-temporal (streaming) stores: the destination lines are written straight to
// memory instead of first being read into the cache (write-allocate), which saves a third of the
// memory traffic of a large copy whose destination nobody reads soon.
#include <cstddef>

namespace pycollective {

// dst = src over `bytes` (no overlap). Small copies fall back to memcpy.
void streamCopy(void* dst, const void* src, size_t bytes);

}  // namespace pycollective

#pragma once
// Copies with non-temporal (streaming) stores: the destination lines are written straight to
// memory instead of first being read into the cache (write-allocate), which saves a third of the
// memory traffic of a large copy whose destination nobody reads soon, and leaves no dirty line
// for another core to fetch from this one's cache (a shared-memory ring between cores that pass
// lines slowly: transport/peer_distance.h).
#include <cstddef>

namespace pycollective {

// dst = src over `bytes` (no overlap). Small copies fall back to memcpy. Returns after a store
// fence: the copy is visible to other cores before any store that follows.
void streamCopy(void* dst, const void* src, size_t bytes);

}  // namespace pycollective

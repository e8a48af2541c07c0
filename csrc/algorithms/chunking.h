#pragma once
// Splits `count` elements into `parts` contiguous pieces whose sizes differ by at most one (the
// first count % parts pieces get the extra element). Used by every algorithm, so that 0, 1 and
// counts not divisible by the group size all follow one rule.
#include <algorithm>
#include <cstddef>

namespace pycollective {

struct Chunks {
  Chunks(size_t count, size_t parts)
      : count(count),
        parts(parts),
        base(parts ? count / parts : 0),
        extra(parts ? count % parts : 0) {}
  size_t offset(size_t i) const { return i * base + std::min(i, extra); }
  size_t size(size_t i) const { return base + (i < extra ? 1 : 0); }

  size_t count, parts, base, extra;
};

// Segments per chunk so that no segment exceeds segmentBytes (at least one).
inline size_t segmentsFor(size_t chunkElems, size_t elemSize, size_t segmentBytes) {
  size_t perSeg = std::max<size_t>(1, segmentBytes / std::max<size_t>(1, elemSize));
  return std::max<size_t>(1, (chunkElems + perSeg - 1) / perSeg);
}

inline int floorPow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

inline int log2Floor(int n) {
  int l = 0;
  while ((1 << (l + 1)) <= n) ++l;
  return l;
}

}  // namespace pycollective

#pragma once
// The arithmetic of the update rules on one block of copy 0, compiled once per instruction set
// (update_kernels_{generic,avx2,avx512}.cc, the reduction kernels' -m flags plus
// -fno-math-errno so that Adam's square root vectorizes) and picked at run time at the level the
// reduction kernels use (reduce.h simdLevel()).
#include <cstddef>

#include "core/dtype.h"
#include "optim/replicated_update.h"

namespace pycollective {

// Updates n elements in place: w (weights) and s[k] (the rule's slots) point into copy 0, g is
// the gradient sum (not yet scaled by h.gradScale). Every element is read before it is written,
// so a gradient that is itself a copy is still read intact. Elementwise: the result does not
// depend on the instruction set or on how the work is split.
using UpdateBlockFn = void (*)(UpdateRule rule, const UpdateHyper& h, const void* g, void* w,
                               void* const* s, size_t n);

// The kernel for float32 or float64 (InvalidType for any other dtype).
UpdateBlockFn lookupUpdateBlock(DType dtype);

namespace detail {
// Each instruction-set build's kernels: [0] float32, [1] float64.
namespace generic {
extern const UpdateBlockFn kUpdateBlock[2];
}
namespace avx2 {
extern const UpdateBlockFn kUpdateBlock[2];
}
namespace avx512 {
extern const UpdateBlockFn kUpdateBlock[2];
}
}  // namespace detail

}  // namespace pycollective

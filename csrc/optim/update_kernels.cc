// Picks the update kernels of the instruction set the reduction kernels run at.
#include "optim/update_kernels.h"

#include <cstring>

#include "core/error.h"
#include "reduce/reduce.h"

namespace pycollective {

namespace {

const UpdateBlockFn* selectedTable() {
#if PYCOLLECTIVE_X86_KERNELS
  const char* level = simdLevel();
  if (std::strcmp(level, "avx512") == 0) return detail::avx512::kUpdateBlock;
  if (std::strcmp(level, "avx2") == 0) return detail::avx2::kUpdateBlock;
#endif
  return detail::generic::kUpdateBlock;
}

}  // namespace

UpdateBlockFn lookupUpdateBlock(DType dtype) {
  static const UpdateBlockFn* const table = selectedTable();
  switch (dtype) {
    case DType::kFloat32: return table[0];
    case DType::kFloat64: return table[1];
    default:
      throw InvalidType(makeMessage("fused optimizer updates support float32 and float64, not ",
                                    dtypeName(dtype)));
  }
}

}  // namespace pycollective

// The update rules' arithmetic as plain loops that GCC -O3 auto-vectorizes. Compiled three times,
// by update_kernels_{generic,avx2,avx512}.cc, each with its own -m flags and with
// PC_UPDATE_ISA_NS naming the namespace that keeps the three builds apart. No include guard:
// each of those files includes it once.
#include <cmath>
#include <cstddef>

#include "optim/update_kernels.h"

#ifndef PC_UPDATE_ISA_NS
#error "define PC_UPDATE_ISA_NS (generic, avx2 or avx512) before including update_kernels_impl.h"
#endif

namespace pycollective {
namespace detail {
namespace PC_UPDATE_ISA_NS {
namespace {

template <typename T>
void updateBlock(UpdateRule rule, const UpdateHyper& h, const void* gv, void* wv, void* const* sv,
                 size_t n) {
  const T* g = static_cast<const T*>(gv);
  T* w = static_cast<T*>(wv);
  T* s0 = static_cast<T*>(sv[0]);
  T* s1 = static_cast<T*>(sv[1]);
  const T scale = static_cast<T>(h.gradScale), lr = static_cast<T>(h.lr);
  switch (rule) {
    case UpdateRule::kSgd:
      for (size_t i = 0; i < n; ++i) w[i] = w[i] - lr * (scale * g[i]);
      break;
    case UpdateRule::kMomentum: {
      const T mom = static_cast<T>(h.momentum);
      for (size_t i = 0; i < n; ++i) {
        const T m = mom * s0[i] - lr * (scale * g[i]);
        s0[i] = m;
        w[i] = w[i] + m;
      }
      break;
    }
    case UpdateRule::kNesterov: {
      const T mom = static_cast<T>(h.momentum);
      for (size_t i = 0; i < n; ++i) {
        const T step = lr * (scale * g[i]);
        const T m = mom * s0[i] - step;
        s0[i] = m;
        w[i] = w[i] + (mom * m - step);
      }
      break;
    }
    case UpdateRule::kAdam: {
      const T b1 = static_cast<T>(1 - h.beta1), b2 = static_cast<T>(1 - h.beta2);
      const T eps = static_cast<T>(h.epsilon);
      for (size_t i = 0; i < n; ++i) {
        const T gi = scale * g[i];
        const T m = s0[i] + (gi - s0[i]) * b1;
        const T v = s1[i] + (gi * gi - s1[i]) * b2;
        s0[i] = m;
        s1[i] = v;
        w[i] = w[i] - lr * m / (std::sqrt(v) + eps);
      }
      break;
    }
  }
}

}  // namespace

const UpdateBlockFn kUpdateBlock[2] = {&updateBlock<float>, &updateBlock<double>};

}  // namespace PC_UPDATE_ISA_NS
}  // namespace detail
}  // namespace pycollective

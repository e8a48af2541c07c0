// CPU-only builds link this file instead of device_ops.cc: there is no device.
#include "cuda/device_ops.h"

namespace pycollective {
namespace cuda {

DeviceOps* deviceOps() {
  return nullptr;
}

}  // namespace cuda
}  // namespace pycollective

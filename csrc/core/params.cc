#include "core/params.h"

#include "core/error.h"
#include "core/knobs.h"

namespace pycollective {
namespace params {

size_t segmentBytes() {
  long long v = knobs::integer(knobs::kSegmentBytes);
  PC_CHECK(v > 0, "PYCOLLECTIVE_SEGMENT_BYTES must be positive, got ", v);
  return static_cast<size_t>(v);
}

size_t deviceSegmentBytes() {
  long long v = knobs::integer(knobs::kDeviceSegmentBytes);
  PC_CHECK(v > 0, "PYCOLLECTIVE_DEVICE_SEGMENT_BYTES must be positive, got ", v);
  return static_cast<size_t>(v);
}

double timeoutSeconds() {
  return knobs::number(knobs::kTimeout);
}

int reduceThreads() {
  return static_cast<int>(knobs::integer(knobs::kReduceThreads));
}

size_t hostSlotBytes() {
  long long v = knobs::integer(knobs::kHostSlotBytes);
  PC_CHECK(v > 0, "PYCOLLECTIVE_HOST_SLOT_BYTES must be positive, got ", v);
  return static_cast<size_t>(v);
}

}  // namespace params
}  // namespace pycollective

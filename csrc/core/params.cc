#include "core/params.h"

#include <cstdlib>

#include "core/error.h"

namespace pycollective {
namespace params {

long long envInt(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(v, &end, 10);
  PC_CHECK(end != v && *end == '\0', name, "='", v, "' is not an integer");
  return parsed;
}

double envDouble(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  double parsed = std::strtod(v, &end);
  PC_CHECK(end != v && *end == '\0', name, "='", v, "' is not a number");
  return parsed;
}

std::string envString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? fallback : std::string(v);
}

size_t segmentBytes() {
  long long v = envInt("PYCOLLECTIVE_SEGMENT_BYTES", 256 * 1024);
  PC_CHECK(v > 0, "PYCOLLECTIVE_SEGMENT_BYTES must be positive, got ", v);
  return static_cast<size_t>(v);
}

size_t deviceSegmentBytes() {
  long long v = envInt("PYCOLLECTIVE_DEVICE_SEGMENT_BYTES", 16 * 1024 * 1024);
  PC_CHECK(v > 0, "PYCOLLECTIVE_DEVICE_SEGMENT_BYTES must be positive, got ", v);
  return static_cast<size_t>(v);
}

double timeoutSeconds() {
  return envDouble("PYCOLLECTIVE_TIMEOUT", 300.0);
}

int reduceThreads() {
  return static_cast<int>(envInt("PYCOLLECTIVE_REDUCE_THREADS", 0));
}

}  // namespace params
}  // namespace pycollective

#include "core/knobs.h"

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "core/logging.h"

namespace pycollective {
namespace knobs {

namespace {

const KnobInfo kTable[kNumKnobs] = {
#define PYCOLLECTIVE_KNOB_INFO(id, name, type, def, doc) {name, type, def, doc},
    PYCOLLECTIVE_KNOB_TABLE(PYCOLLECTIVE_KNOB_INFO)
#undef PYCOLLECTIVE_KNOB_INFO
};

// Numbers are parsed when the table is read, so that integer()/number() cost an atomic load:
// the segment size is asked for by every collective.
struct Snapshot {
  std::mutex mu;
  std::atomic<bool> loaded{false};
  std::string values[kNumKnobs];
  std::atomic<long long> integers[kNumKnobs];
  std::atomic<double> numbers[kNumKnobs];
  std::atomic<bool> isInteger[kNumKnobs];
  std::atomic<bool> isNumber[kNumKnobs];
};

Snapshot& snapshot() {
  static Snapshot s;
  return s;
}

// The one place native code reads the environment.
void readLocked(Snapshot& s) {
  for (int i = 0; i < kNumKnobs; ++i) {
    const char* v = std::getenv(kTable[i].name);
    s.values[i] = (v == nullptr || *v == '\0') ? kTable[i].defaultValue : v;
    const char* text = s.values[i].c_str();
    char* end = nullptr;
    long long asInteger = std::strtoll(text, &end, 10);
    s.isInteger[i] = *text != '\0' && *end == '\0';
    s.integers[i] = asInteger;
    double asNumber = std::strtod(text, &end);
    s.isNumber[i] = *text != '\0' && *end == '\0';
    s.numbers[i] = asNumber;
  }
  s.loaded.store(true, std::memory_order_release);
}

Snapshot& loaded() {
  Snapshot& s = snapshot();
  if (!s.loaded.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.loaded.load(std::memory_order_relaxed)) readLocked(s);
  }
  return s;
}

}  // namespace

const KnobInfo& info(Knob k) {
  return kTable[k];
}

std::string text(Knob k) {
  Snapshot& s = loaded();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.values[k];
}

long long integer(Knob k) {
  Snapshot& s = loaded();
  PC_CHECK(s.isInteger[k].load(std::memory_order_relaxed), kTable[k].name, "='", text(k),
           "' is not an integer");
  return s.integers[k].load(std::memory_order_relaxed);
}

double number(Knob k) {
  Snapshot& s = loaded();
  PC_CHECK(s.isNumber[k].load(std::memory_order_relaxed), kTable[k].name, "='", text(k),
           "' is not a number");
  return s.numbers[k].load(std::memory_order_relaxed);
}

void reload() {
  {
    Snapshot& s = snapshot();
    std::lock_guard<std::mutex> lock(s.mu);
    readLocked(s);
  }
  reloadLogSettings();
}

}  // namespace knobs
}  // namespace pycollective

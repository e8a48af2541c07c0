#pragma once
// PYCOLLECTIVE_DEBUG=NONE|WARN|INFO|TRACE and PYCOLLECTIVE_DEBUG_SUBSYS=INIT,COLL,... like
// NCCL_DEBUG and NCCL_DEBUG_SUBSYS. Every line, native or Python (pycollective/log.py), has one
// format: "pycollective[rank R host:pid] LEVEL SUBSYS: message", so interleaved output of
// several ranks stays readable.
#include <string>

#include "core/error.h"

namespace pycollective {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// The subsystems; Python adds STRATEGIES and PS (parameter servers) to the same variable.
enum class LogSubsys : unsigned {
  kInit = 1u << 0,       // group formation, links, library loading
  kColl = 1u << 1,       // collectives: algorithm choices
  kTransport = 1u << 2,  // shm/tcp/grpc links
  kTuning = 1u << 3,     // the tuned table and the cost model
  kNccl = 1u << 4,       // NCCL communicators
};

bool logEnabled(LogLevel level, LogSubsys subsys);
LogLevel logLevel();
void logLine(LogLevel level, LogSubsys subsys, const std::string& message);
// This process's rank in its group, for the prefix (-1 until a group forms).
void setLogRank(int rank);
// Re-reads the level and subsystems (after knobs::reload()).
void reloadLogSettings();

}  // namespace pycollective

#define PC_LOG(level, subsys, ...)                                                          \
  do {                                                                                      \
    if (::pycollective::logEnabled((level), (subsys)))                                      \
      ::pycollective::logLine((level), (subsys), ::pycollective::makeMessage(__VA_ARGS__)); \
  } while (0)
#define PC_WARN(subsys, ...) \
  PC_LOG(::pycollective::LogLevel::kWarn, ::pycollective::LogSubsys::subsys, __VA_ARGS__)
#define PC_INFO(subsys, ...) \
  PC_LOG(::pycollective::LogLevel::kInfo, ::pycollective::LogSubsys::subsys, __VA_ARGS__)
#define PC_TRACE(subsys, ...) \
  PC_LOG(::pycollective::LogLevel::kTrace, ::pycollective::LogSubsys::subsys, __VA_ARGS__)

#pragma once
// PYCOLLECTIVE_DEBUG=WARN|INFO|TRACE, like NCCL_DEBUG. Messages go to stderr with a
// "host:pid" prefix so interleaved output of several ranks stays readable.
#include <string>

#include "core/error.h"

namespace pycollective {

enum class LogLevel : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel logLevel();
void logLine(LogLevel level, const std::string& message);

}  // namespace pycollective

#define PC_LOG(level, ...)                                                        \
  do {                                                                            \
    if (::pycollective::logLevel() >= (level))                                    \
      ::pycollective::logLine((level), ::pycollective::makeMessage(__VA_ARGS__)); \
  } while (0)
#define PC_WARN(...) PC_LOG(::pycollective::LogLevel::kWarn, __VA_ARGS__)
#define PC_INFO(...) PC_LOG(::pycollective::LogLevel::kInfo, __VA_ARGS__)
#define PC_TRACE(...) PC_LOG(::pycollective::LogLevel::kTrace, __VA_ARGS__)

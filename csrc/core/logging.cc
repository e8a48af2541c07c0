#include "core/logging.h"

#include "core/knobs.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pycollective {

namespace {
LogLevel parseLevel() {
  const std::string setting = knobs::text(knobs::kDebug);
  const char* env = setting.c_str();
  if (strcasecmp(env, "TRACE") == 0) return LogLevel::kTrace;
  if (strcasecmp(env, "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(env, "NONE") == 0) return LogLevel::kNone;
  return LogLevel::kWarn;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}
}  // namespace

LogLevel logLevel() {
  // Read once: the level is a process-wide setting, like NCCL_DEBUG.
  static const LogLevel level = parseLevel();
  return level;
}

void logLine(LogLevel level, const std::string& message) {
  static std::mutex mu;
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s:%d pycollective %s %s\n", host, static_cast<int>(getpid()),
               levelName(level), message.c_str());
  std::fflush(stderr);
}

}  // namespace pycollective

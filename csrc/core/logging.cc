#include "core/logging.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "core/knobs.h"

namespace pycollective {

namespace {

struct Setting {
  LogSubsys bit;
  const char* name;
};
constexpr Setting kSubsystems[] = {{LogSubsys::kInit, "INIT"},
                                   {LogSubsys::kColl, "COLL"},
                                   {LogSubsys::kTransport, "TRANSPORT"},
                                   {LogSubsys::kTuning, "TUNING"},
                                   {LogSubsys::kNccl, "NCCL"}};

std::atomic<int> gLevel{-1};     // -1: not read yet
std::atomic<unsigned> gMask{0};  // enabled subsystems
std::atomic<int> gRank{-1};

LogLevel parseLevel(const std::string& v) {
  if (strcasecmp(v.c_str(), "TRACE") == 0) return LogLevel::kTrace;
  if (strcasecmp(v.c_str(), "INFO") == 0) return LogLevel::kInfo;
  if (strcasecmp(v.c_str(), "NONE") == 0) return LogLevel::kNone;
  return LogLevel::kWarn;
}

// "ALL" (the default), or a comma list; "^INIT,TUNING" enables all but those (NCCL's syntax).
unsigned parseMask(const std::string& v) {
  unsigned all = 0;
  for (const Setting& s : kSubsystems) all |= static_cast<unsigned>(s.bit);
  if (v.empty() || strcasecmp(v.c_str(), "ALL") == 0) return all;
  const bool except = v[0] == '^';
  unsigned named = 0;
  std::stringstream in(except ? v.substr(1) : v);
  std::string item;
  while (std::getline(in, item, ','))
    for (const Setting& s : kSubsystems)
      if (strcasecmp(item.c_str(), s.name) == 0) named |= static_cast<unsigned>(s.bit);
  return except ? (all & ~named) : named;
}

const char* levelName(LogLevel l) {
  switch (l) {
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kTrace: return "TRACE";
    default: return "";
  }
}

const char* subsysName(LogSubsys b) {
  for (const Setting& s : kSubsystems)
    if (s.bit == b) return s.name;
  return "?";
}

void ensureRead() {
  if (gLevel.load(std::memory_order_acquire) < 0) reloadLogSettings();
}

}  // namespace

void reloadLogSettings() {
  gMask.store(parseMask(knobs::text(knobs::kDebugSubsys)), std::memory_order_relaxed);
  gLevel.store(static_cast<int>(parseLevel(knobs::text(knobs::kDebug))), std::memory_order_release);
}

LogLevel logLevel() {
  ensureRead();
  return static_cast<LogLevel>(gLevel.load(std::memory_order_relaxed));
}

bool logEnabled(LogLevel level, LogSubsys subsys) {
  if (logLevel() < level) return false;
  // Warnings always print: a subsystem filter narrows what INFO and TRACE show.
  return level == LogLevel::kWarn ||
         (gMask.load(std::memory_order_relaxed) & static_cast<unsigned>(subsys)) != 0;
}

void setLogRank(int rank) {
  gRank.store(rank, std::memory_order_relaxed);
}

void logLine(LogLevel level, LogSubsys subsys, const std::string& message) {
  static std::mutex mu;
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  const int rank = gRank.load(std::memory_order_relaxed);
  const std::string who = rank >= 0 ? "rank " + std::to_string(rank) + " " : "";
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "pycollective[%s%s:%d] %s %s: %s\n", who.c_str(), host,
               static_cast<int>(getpid()), levelName(level), subsysName(subsys), message.c_str());
  std::fflush(stderr);
}

}  // namespace pycollective

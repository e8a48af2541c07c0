#include "transport/shm_common.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pycollective {
namespace shm {

namespace {

// Fields 3 (state) and 22 (start time, clock ticks since boot) of /proc/<pid>/stat.
bool readProcStat(pid_t pid, char* state, uint64_t* startTicks) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // The command name (field 2) may contain spaces and ')': fields resume after the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ' || p[2] == '\0') return false;
  p += 2;
  *state = *p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return false;
    ++p;
  }
  *startTicks = std::strtoull(p, nullptr, 10);
  return true;
}

}  // namespace

std::string sysError(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

uint64_t ownStartTicks() {
  static const uint64_t ticks = [] {
    char state;
    uint64_t start = 0;
    return readProcStat(::getpid(), &state, &start) ? start : uint64_t(0);
  }();
  return ticks;
}

bool pidNamesPeer(pid_t pid, uint64_t startTicks) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) == -1 && errno == ESRCH) return false;
  char state;
  uint64_t start;
  if (startTicks != 0 && readProcStat(pid, &state, &start) && start != startTicks) return false;
  return true;
}

bool processDied(pid_t pid, uint64_t startTicks) {
  // An abort would have said so already; this is for deaths that could not say so (kill -9).
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  char state;
  uint64_t start;
  if (readProcStat(pid, &state, &start)) {
    if (state == 'Z' || state == 'X') return true;            // dead, not yet reaped by its parent
    if (startTicks != 0 && start != startTicks) return true;  // pid reused since
  }
  return false;
}

void storeReason(char* dst, const std::string& reason) noexcept {
  size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(dst, reason.data(), n);
  if (n < reason.size()) std::memcpy(dst + n - 3, "...", 3);
  dst[n] = '\0';
}

std::string loadReason(const char* src) {
  return std::string(src, ::strnlen(src, kReasonBytes));
}

bool sameDigest(const unsigned char* a, const unsigned char* b) {
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < kDigestBytes; ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace shm
}  // namespace pycollective

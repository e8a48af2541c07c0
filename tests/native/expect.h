#pragma once
// Check counting for the native test programs: EXPECT(cond, printf-format, ...) counts a check
// and, when cond is false, a failure, printing the first 40 with the process id (the shm test
// forks, and each side reports its own).
#include <unistd.h>

#include <cstdio>

inline int gChecks = 0;
inline int gFailures = 0;

#define EXPECT(cond, ...)                                                                       \
  do {                                                                                          \
    ++gChecks;                                                                                  \
    if (!(cond)) {                                                                              \
      if (++gFailures <= 40) {                                                                  \
        std::fprintf(stderr, "[pid %d] FAIL %s:%d: %s: ", static_cast<int>(getpid()), __FILE__, \
                     __LINE__, #cond);                                                          \
        std::fprintf(stderr, __VA_ARGS__);                                                      \
        std::fputc('\n', stderr);                                                               \
      }                                                                                         \
    }                                                                                           \
  } while (0)

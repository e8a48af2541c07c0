#pragma once
// Forked children for the native tests that need several processes (test_shm, test_host_segment):
// spawn() runs a body in a child, reap() collects the children under a hard deadline.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "expect.h"

// Runs body in a child process; its return value is the exit status.
inline pid_t spawn(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(2);
  }
  if (pid == 0) {
    gChecks = gFailures = 0;  // the child reports only its own failures
    int rc = 3;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[pid %d] uncaught %s\n", static_cast<int>(getpid()), e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  return pid;
}

// Reaps the children as they exit (promptly, so a dead child is not left a zombie), killing all
// of them after `seconds`. Returns their wait statuses in order.
inline std::vector<int> reap(const std::vector<pid_t>& pids, double seconds = 120) {
  std::vector<int> status(pids.size(), -1);
  size_t left = pids.size();
  auto start = std::chrono::steady_clock::now();
  bool killed = false;
  while (left > 0) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (pids[i] == p) {
          status[i] = st;
          --left;
        }
      continue;
    }
    if (!killed &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      std::fprintf(stderr, "FAIL: children still running after %.0f s: killing them\n", seconds);
      ++gFailures;
      for (pid_t q : pids) kill(q, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return status;
}

inline bool exitedOk(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

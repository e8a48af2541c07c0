#include "core/memory_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/host_copy.h"
#include "core/stream_copy.h"

namespace pycollective {

double measureCopyBandwidth(size_t bytesPerThread, int threads, int reps) {
  PC_CHECK(threads >= 1 && reps >= 1 && bytesPerThread > 0, "bad bandwidth measurement request");
  std::vector<std::unique_ptr<char[]>> src(threads), dst(threads);
  for (int t = 0; t < threads; ++t) {
    src[t].reset(new char[bytesPerThread]);
    dst[t].reset(new char[bytesPerThread]);
    std::memset(src[t].get(), t + 1, bytesPerThread);  // touch: no page faults while timed
    std::memset(dst[t].get(), 0, bytesPerThread);
  }
  double best = 0;
  for (int rep = 0; rep < 2 * reps; ++rep) {
    const bool streaming = rep % 2 == 1;
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (!go.load()) std::this_thread::yield();
        if (streaming)
          streamCopy(dst[t].get(), src[t].get(), bytesPerThread);
        else
          hostCopy(dst[t].get(), src[t].get(), bytesPerThread);
      });
    while (ready.load() < threads) std::this_thread::yield();
    auto start = std::chrono::steady_clock::now();
    go.store(true);
    for (auto& th : pool) th.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * bytesPerThread * threads / s);
  }
  return best;
}

}  // namespace pycollective

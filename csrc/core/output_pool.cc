#include "core/output_pool.h"

#include <sys/mman.h>

#include <new>
#include <utility>

#include "core/knobs.h"

namespace pycollective {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;

// Requests are rounded to whole huge pages, so that steps asking for nearly the same size
// share blocks.
size_t roundedCapacity(size_t bytes) {
  return bytes < OutputPool::kMinPooledBytes ? bytes : (bytes + kHugePage - 1) & ~(kHugePage - 1);
}

}  // namespace

OutputPool& OutputPool::instance() {
  static OutputPool* pool = new OutputPool();  // never destroyed: arrays may outlive statics
  return *pool;
}

void* OutputPool::take(size_t bytes, size_t* capacity) {
  const size_t want = roundedCapacity(bytes == 0 ? 1 : bytes);
  if (want >= kMinPooledBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(want);
    if (it != free_.end()) {
      void* block = it->second.block;
      free_.erase(it);
      cached_ -= want;
      *capacity = want;
      return block;
    }
  }
  void* block = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (want >= kHugePage) madvise(block, want, MADV_HUGEPAGE);  // a hint; refusal is harmless
#endif
  *capacity = want;
  return block;
}

void OutputPool::give(void* block, size_t capacity) noexcept {
  if (capacity >= kMinPooledBytes) {
    long long limit = 0;
    try {
      limit = knobs::integer(knobs::kOutputPoolBytes);
    } catch (...) {  // a malformed value was reported when the group was made; keep nothing
    }
    if (limit > 0 && capacity <= static_cast<size_t>(limit)) {
      std::unique_lock<std::mutex> lock(mu_);
      while (cached_ + capacity > static_cast<size_t>(limit)) {
        const std::pair<void*, size_t> evicted = takeOldest();
        lock.unlock();  // unmapping 64 MiB takes a while: other threads' take() need not wait
        munmap(evicted.first, evicted.second);
        lock.lock();
      }
      free_.emplace(capacity, Kept{block, releases_++});
      cached_ += capacity;
      return;
    }
  }
  munmap(block, capacity);
}

std::pair<void*, size_t> OutputPool::takeOldest() {
  // A linear scan: it runs only when the pool is full, over at most limit / 1 MiB blocks.
  auto oldest = free_.begin();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second.released < oldest->second.released) oldest = it;
  const std::pair<void*, size_t> taken{oldest->second.block, oldest->first};
  cached_ -= oldest->first;
  free_.erase(oldest);
  return taken;
}

size_t OutputPool::cachedBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

}  // namespace pycollective

#pragma once
// Memory for the result arrays collectives return (y = allreduce(x)). Fresh memory costs its
// page faults on first touch, and for a 64 MiB result they cost as much as the all-reduce
// itself; a training loop asks for the same sizes every step. So blocks of at least
// kMinPooledBytes that the user released come back here and serve the next request of the same
// rounded size, up to PYCOLLECTIVE_OUTPUT_POOL_BYTES in all. A block released into a full pool
// evicts the blocks released longest ago (unmapped), whatever their size: the sizes a loop
// asks for now are the ones it released last, and blocks of sizes it no longer asks for must
// not fill the pool (a benchmark's sweep up to 8 x 64 MiB results found it full of smaller
// blocks, and every 64 MiB call page-faulted). New blocks are mapped with transparent huge pages
// requested (madvise), which this kind of kernel grants only on request.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace pycollective {

class OutputPool {
 public:
  static constexpr size_t kMinPooledBytes = size_t(1) << 20;

  static OutputPool& instance();

  // A block of at least `bytes` (page aligned); `bytes` below kMinPooledBytes come from it too
  // but are never kept. Throws std::bad_alloc.
  void* take(size_t bytes, size_t* capacity);
  // Returns a block from take() with the capacity it reported.
  void give(void* block, size_t capacity) noexcept;

  size_t cachedBytes();

 private:
  OutputPool() = default;
  struct Kept {
    void* block;
    uint64_t released;  // when, in releases counted so far: the oldest goes first
  };
  // The block released longest ago, out of the pool (the caller unmaps it); with mu_ held and
  // something kept.
  std::pair<void*, size_t> takeOldest();

  std::mutex mu_;
  std::multimap<size_t, Kept> free_;  // capacity -> block
  size_t cached_ = 0;
  uint64_t releases_ = 0;
};

}  // namespace pycollective

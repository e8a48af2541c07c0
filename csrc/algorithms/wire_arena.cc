#include "algorithms/wire_arena.h"

#include <algorithm>

namespace pycollective {

namespace {
constexpr size_t kBlockElements = size_t{2} << 20;  // 4 MiB: a few dozen segments each
constexpr size_t kAlignElements = 32;               // 64 bytes: buffers never share a line
}  // namespace

WireArena* WireArena::acquire() {
  thread_local WireArena arena;
  if (arena.busy_) return nullptr;
  arena.busy_ = true;
  arena.block_ = 0;
  arena.used_ = 0;
  return &arena;
}

void WireArena::release() {
  busy_ = false;
}

uint16_t* WireArena::take(size_t count) {
  const size_t rounded = (count + kAlignElements - 1) / kAlignElements * kAlignElements;
  for (; block_ < blocks_.size(); ++block_, used_ = 0) {
    Block& b = blocks_[block_];
    if (b.size - used_ >= rounded) {
      uint16_t* p = b.data.get() + used_;
      used_ += rounded;
      return p;
    }
  }
  const size_t size = std::max(kBlockElements, rounded);
  blocks_.push_back(Block{std::unique_ptr<uint16_t[]>(new uint16_t[size]), size});
  used_ = rounded;
  return blocks_.back().data.get();
}

}  // namespace pycollective

#pragma once
// Memory for a compressed call's encoded payloads (Exchange, reduce/wire_codec.h). A call needs a
// buffer per message it encodes or receives encoded; allocating them fresh every call would
// page-fault tens of megabytes of new memory per large all-reduce. The blocks are kept by the
// thread that ran the call and handed out again to its next compressed call on that thread (a
// communicator's executor thread, or the caller's thread for a call it runs inline), so a
// training loop reuses the same blocks every step. A call's CallState takes the arena and gives
// it back on the same thread (it is made and destroyed where the call runs). The blocks stay
// allocated for the thread's lifetime, as large as its largest call's payloads.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace pycollective {

class WireArena {
 public:
  // This thread's arena, empty, for one call; nullptr while another call on this thread holds
  // it (the caller then allocates for itself).
  static WireArena* acquire();
  // Ends the call: its buffers are free for the next one.
  void release();
  // Room for `count` encoded elements, valid until release().
  uint16_t* take(size_t count);

 private:
  struct Block {
    std::unique_ptr<uint16_t[]> data;
    size_t size;
  };
  std::vector<Block> blocks_;
  size_t block_ = 0;  // the block being filled
  size_t used_ = 0;   // elements taken from it
  bool busy_ = false;
};

}  // namespace pycollective

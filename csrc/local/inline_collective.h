#pragma once
// Collectives over in-process replicas computed by the calling thread alone ("inline"). Every
// replica's buffer is at hand, so a small collective is a few loops over memory; the threaded
// algorithms pay replica-thread wake-ups and messages between them (tens of microseconds on a
// loaded machine) that dwarf the arithmetic below a few hundred KiB.
#include <vector>

#include "algorithms/algorithm.h"

namespace pycollective {

// Model seconds of the inline run: one thread reads every input (reducing as it goes) and
// writes every output. `lineBytes` is the group's cache line (Communicator::cacheBytes, the
// traffic a call may have and still find its buffers in cache). (`pycollective tune`
// measures it against the threaded algorithms.)
double inlineCost(const std::vector<CollectiveArgs>& args, double lineBytes);

// Runs the collective described by args (replica r's call in args[r]) on this thread. Host
// buffers only. Reductions sum in replica order, as `direct` and `reduce_to_one` do (the ring
// and halving_doubling sum in other orders, so float16/bfloat16 results may differ from
// theirs in the last bit); avg's scale included.
void runInline(const std::vector<CollectiveArgs>& args);

}  // namespace pycollective

#pragma once
// The machine's memory bandwidth as a copy of private buffers by `threads` threads at once:
// the ceiling every in-process or shared-memory figure is read against (bench/).
#include <cstddef>

namespace pycollective {

// Bytes read + written per second, best of `reps`, each thread copying `bytesPerThread`, with
// the better of hostCopy (memcpy) and streaming stores (a ceiling must not sit below what the
// collectives themselves reach).
double measureCopyBandwidth(size_t bytesPerThread, int threads, int reps);

}  // namespace pycollective

#pragma once
// Whether a call's buffers stay in the CPU's cache from one call to the next: the cost model and
// the direct algorithm's choice of stores change with it.
namespace pycollective {

// Bytes a call reads and writes in all (every rank's input and output, 2 * n * S) up to which
// its buffers stay in cache: the 32 MiB of L3 this project's EPYC VM reports. (sysconf's L3
// size there is the whole socket's 256 MiB, which no VM gets, so it is not asked.)
constexpr double kCacheResidentBytes = 32 << 20;

// The model changes regime at this line, so a cost may jump there (direct gets cheaper by its
// accumulator's passes, halving-doubling dearer by its own part's copy) where the measured
// times change smoothly: near the line `auto` may take either.
inline bool callStaysInCache(double ranks, double bytesPerRank) {
  return 2 * ranks * bytesPerRank <= kCacheResidentBytes;
}

}  // namespace pycollective

#pragma once
// How far apart two CPUs are, as the time a cache line takes to pass from one to the other and
// back. Everything that hands data between cores through shared memory runs at a pace this
// sets: on the 2-vCPU EPYC VM this probe read 70-91 ns and 330-361 ns as the hypervisor placed
// the vCPUs (each batch timed on the steady clock; single round trips timed alone, 50-60 and
// 320-370), and a shared-memory all-reduce of 1 MiB with ordinary stores into its ring took
// between 0.064 and 0.47 ms (docs/benchmarks-log.md, "Two vCPUs that drift apart"). The benchmark
// prints it beside its rows.

namespace pycollective {

// Nanoseconds per round trip of a cache line between threads pinned to `cpuA` and `cpuB`,
// median of `batches` batches of `rounds` round trips each; -1 when either CPU cannot be used,
// both are the same, or the partner thread does not answer within two seconds.
double cacheLineRoundTripNs(int cpuA, int cpuB, int rounds, int batches);

}  // namespace pycollective

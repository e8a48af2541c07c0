// algo="auto" measured on a group across processes (comm/agreed_choice.h): each call of a shape
// the model prices near a tie (or alone, with reserves to call up) runs the candidate its
// schedule names, is timed where the schedule counts it, and after a trial, check or watch
// every rank agrees on the times with one small allreduce.
#include <algorithm>
#include <chrono>
#include <limits>

#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "core/error.h"
#include "core/logging.h"

namespace pycollective {

namespace {

// Calls priced under this are not measured on a host with a core for each of the group's ranks:
// of a few microseconds, they would carry the schedule's bookkeeping (two lookups under a lock)
// and gain little. Calls priced from it race their near ties (unwatched under kMinModelSeconds,
// comm/agreed_choice.cc), where until the forty-second session the line was kMinModelSeconds:
// at 2 processes x 16-64 KiB the model prices halving-doubling, `slots` and `staged` within
// 1.1x (6.7-17.5 us), and the faster of them changed from run to run, 1.3x-1.5x either way (2
// vCPUs, forty-first session: `staged` 4.4-8.8 us against halving-doubling's 6.6-13.0 in one
// run, 1.1x-1.7x slower in another). At 8 KiB and under the cheapest is priced under this
// (`slots` 4.4 us) and runs alone.
constexpr double kMinMeasuredAcrossProcesses = 5e-6;

// The candidates to measure, or one alone (its first: the tuned entry, else the model's pick)
// where the call is not measured: priced under kMinMeasuredAcrossProcesses on a host with a
// core for each of its ranks. Where ranks outnumber the cores (shared_cores.h), the model's
// small-call prices miss by what the scheduler does, which no link cost captures: 3 processes
// on 2 vCPUs x 16 KiB, priced `slots` 16.9 us under `staged` 23.2, ran 15.7 us against 12.7 in
// the benchmark, and such calls take 7 us and more, beside which the bookkeeping is small.
std::vector<AutoCandidate> candidatesFor(const Group& group, const CollectiveArgs& args) {
  std::vector<AutoCandidate> priced;
  double cheapest = std::numeric_limits<double>::infinity();
  for (const PricedAlgorithm& p : modelCosts(group, args)) {
    priced.push_back({p.name, p.seconds});
    cheapest = std::min(cheapest, p.seconds);
  }
  std::vector<AutoCandidate> c = candidatesWithReserves(std::move(priced), tunedEntry(group, args));
  if (c.size() > 1 && cheapest < kMinMeasuredAcrossProcesses && parkedPeerWait(group) == 0)
    c.resize(1);
  return c;
}

bool measurable(const Communicator& comm, const CollectiveArgs& args) {
  return comm.autoTrials() > 0 && autoMeasures(args.kind) && args.device < 0 &&
         args.mapped == nullptr;
}

// Each recent call's time on its slowest rank: what a benchmark that times a call on every rank
// reports, and what the next call waits for. One rank's median would not do: the rank that
// arrives last waits least (taking each candidate's highest median over the ranks, a first
// version found 4 ranks x 128 KiB of halving-doubling at 1.39 ms against ring's 0.19 ms,
// the ranks slowed unevenly by a test's numpy work between calls), and the rank an algorithm
// lets finish first, as reduce_to_one's root, is not done with the call for the others
// (taking the lowest, 4 ranks x 32 KiB settled on reduce_to_one, up to 1.25x behind
// halving-doubling in the benchmark's timing).
std::vector<double> agree(Group& group, int groupId, std::vector<double> samples) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllreduce;
  a.dtype = DType::kFloat64;
  a.op = ReduceOp::kMax;
  a.count = samples.size();
  a.in = samples.data();
  a.out = samples.data();
  runWith(group, groupId, a, chooseAlgorithm(group, groupId, a, "auto"));
  return samples;
}

}  // namespace

bool measuresAuto(const Group& group, int groupId, const CollectiveArgs& args) {
  const Communicator& comm = group.comm();
  if (!measurable(comm, args)) return false;
  return comm.agreedChoices().measures(callShape(kAgreedTrial, group, groupId, args),
                                       comm.autoChoices().epoch(), comm.autoTrials(),
                                       [&] { return candidatesFor(group, args); });
}

bool runMeasuredAuto(Group& group, int groupId, const CollectiveArgs& args) {
  Communicator& comm = group.comm();
  if (!measurable(comm, args)) return false;
  AgreedChoices& choices = comm.agreedChoices();
  const CallShape shape = callShape(kAgreedTrial, group, groupId, args);
  const uint64_t epoch = comm.autoChoices().epoch();
  AgreedChoices::Step step;
  if (!choices.next(
          shape, epoch, comm.autoTrials(), [&] { return candidatesFor(group, args); }, &step))
    return false;
  // A candidate is an algorithm the model priced for this call, which it prices only where it
  // can run; the call itself was checked before it came here (chooseAlgorithm).
  const Algorithm* algo = algorithmNamed(step.algo);
  PC_ASSERT(algo != nullptr, "auto's candidate '", step.algo, "' is not an algorithm");
  if (!step.counted) {
    runWith(group, groupId, args, *algo);
  } else {
    const auto start = std::chrono::steady_clock::now();
    runWith(group, groupId, args, *algo);
    choices.record(shape, step,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (step.closesRound && choices.decide(shape, agree(group, groupId, choices.samples(shape))))
    PC_INFO(kColl, comm.who(), " auto for ", collectiveName(args.kind), " of ",
            args.count * elementSize(args.dtype), " bytes now runs ",
            choices.describe(shape, epoch));
  return true;
}

std::string runningMeasuredAuto(const Group& group, int groupId, const CollectiveArgs& args) {
  const Communicator& comm = group.comm();
  return comm.agreedChoices().running(callShape(kAgreedTrial, group, groupId, args),
                                      comm.autoChoices().epoch());
}

std::string describeMeasuredAuto(const Group& group, int groupId, const CollectiveArgs& args) {
  const Communicator& comm = group.comm();
  return comm.agreedChoices().describe(callShape(kAgreedTrial, group, groupId, args),
                                       comm.autoChoices().epoch());
}

}  // namespace pycollective

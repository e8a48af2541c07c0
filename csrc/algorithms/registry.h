#pragma once
// Algorithms by name, the choice made by algo="auto", and the one entry point that runs a
// collective on a communicator.
#include <functional>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/exchange.h"

namespace pycollective {

class HostSegment;
struct Chunks;

// Names users can pass as algo=, "inline" (in-process replicas only, local/inline_collective.h)
// and "auto" included, in a stable order.
std::vector<std::string> algorithmNames();
constexpr const char* kInlineAlgorithm = "inline";

// The algorithm of this name, or nullptr (also for "inline" and "auto", which are not
// Algorithms). No checks: for names already checked against the call (chooseAlgorithm checks a
// user's).
const Algorithm* algorithmNamed(const std::string& name);
// The tuned table's entry covering this call (any algorithm name), or nullptr.
const TunedChoice* tunedEntry(const Group& group, const CollectiveArgs& args);
// The model's cost of the algorithm algo="auto" would pick by the model.
double bestModelCost(const Group& group, const CollectiveArgs& args);
// Every algorithm that can run the call, with the model's cost, in registry order.
struct PricedAlgorithm {
  const char* name;
  double seconds;
};
std::vector<PricedAlgorithm> modelCosts(const Group& group, const CollectiveArgs& args);
// Name of the algorithm with this wire index ("?" if unknown).
const char* algorithmName(uint8_t index);

// The cost parameters of the links a call uses (remote if the group spans hosts), with its wire
// format applied to remote links.
LinkCost costOf(const Group& group, const CollectiveArgs& args);
// A network link's cost for a call with this wire format: 16-bit values halve the bytes and add
// an encoding and a decoding pass.
LinkCost onWire(LinkCost network, const CollectiveArgs& args);

// Checks the call, picks the algorithm ("auto" = cheapest by the cost model among those that
// support the call; PYCOLLECTIVE_DEBUG=INFO prints the table), runs it on this rank and applies
// the final scale of avg. Throws InvalidArgument for unknown/unsupported algorithms before any
// data moves; any later failure aborts the communicator (its peers stop waiting for it).
void runCollective(Communicator& comm, const CollectiveArgs& args, const std::string& algo);
// The same on a subgroup of the communicator's ranks (members are global ranks, ascending, and
// include this rank); groupId keeps the subgroup's sequence numbers apart.
void runCollective(Communicator& comm, const std::vector<int>& members, int groupId,
                   const CollectiveArgs& args, const std::string& algo);

// A compressed call (args.wire) that cannot be compressed -- not a float32 allreduce or
// reduce_scatter of host buffers -- throws InvalidArgument saying why; `who` names the rank.
void checkCompressible(const std::string& who, const CollectiveArgs& args);

// The questions auto answers once per call shape (Communicator::autoChoices()).
enum AutoQuestion : int {
  kWhichAlgorithm = 1,  // answer: the algorithm's registry index
  kInlineBeatsAll = 2,  // answer: 1 if a LocalGroup's inline path beats every algorithm, else 0
  kMeasuredTrial = 3,   // a LocalGroup's trial of the model's candidates (local/measured_choice.h)
  kAgreedTrial = 4,     // a process group's (comm/agreed_choice.h)
};
CallShape callShape(AutoQuestion question, const Group& group, int groupId,
                    const CollectiveArgs& args);

// The algorithm a call runs: by name, or auto's choice (the tuned table, else the cost model).
// Checks the call (root, integer avg, whether the algorithm can run it) and throws
// InvalidArgument/InvalidType before anything moves.
const Algorithm& chooseAlgorithm(const Group& group, int groupId, const CollectiveArgs& args,
                                 const std::string& algo);
// Runs a checked call with `algo` on this rank, avg's final scale included.
void runWith(Group& group, int groupId, const CollectiveArgs& args, const Algorithm& algo);

// algo="auto" measured across processes where the model prices a near tie (agreed_auto.cc,
// comm/agreed_choice.h). runMeasuredAuto runs a checked call (chooseAlgorithm passed it) with
// the algorithm its shape's schedule names, times it, and after a trial or a check agrees on
// the times with the other ranks (one small allreduce); false, having run nothing, where the
// shape is not measured: the caller runs the model's choice.
bool runMeasuredAuto(Group& group, int groupId, const CollectiveArgs& args);
// Whether runMeasuredAuto measures calls of this shape (a prepared call asks once).
bool measuresAuto(const Group& group, int groupId, const CollectiveArgs& args);
// What the measured schedule runs and why, or "" where calls of this shape are not measured.
std::string describeMeasuredAuto(const Group& group, int groupId, const CollectiveArgs& args);
// The algorithm the measured schedule runs now, or "" where calls of this shape are not measured.
std::string runningMeasuredAuto(const Group& group, int groupId, const CollectiveArgs& args);

// A call prepared once and run many times, like MPI's persistent collectives
// (MPI_Allreduce_init): the group, the checks and auto's first choice are settled when it is
// made, so each run is the schedule alone. The buffers in `args` must stay valid while it is
// used. With `keepMeasuring`, an auto call whose shape auto measures (runMeasuredAuto) goes on
// measuring on every run, as the plain call it stands for would: how a group remembers plain
// calls (bindings/bind_known_calls.cc), and pycollective.prepare_allreduce's plans (a choice
// the model got wrong on this machine is moved as a plain call's is).
class PreparedCollective {
 public:
  PreparedCollective(Communicator& comm, std::vector<int> members, int groupId,
                     const CollectiveArgs& args, const std::string& algo,
                     bool keepMeasuring = false);
  // An allreduce over buffers every rank mapped (MappedBuffers): runs `direct` on them.
  PreparedCollective(Communicator& comm, std::vector<int> members, int groupId,
                     const CollectiveArgs& args, MappedBuffers mapped);
  PreparedCollective(const PreparedCollective&) = delete;  // args_ may point at mapped_
  PreparedCollective& operator=(const PreparedCollective&) = delete;
  // Runs the call on this thread (the caller orders it with the communicator's executor).
  void run();
  // The same call on other buffers of the same size and type (not for mapped buffers).
  void runOn(const void* in, void* out);
  // The algorithm the next run takes: auto's choice when prepared, or, where auto measures
  // calls of this shape, its schedule's current choice.
  std::string algorithm() const;
  Communicator& comm() { return group_.comm(); }

 private:
  Group group_;
  int groupId_;
  CollectiveArgs args_;
  MappedBuffers mapped_;
  const Algorithm* algo_ = nullptr;
  bool measured_ = false;
};

// Runs `schedule` as one collective `args` of the group (groupId: see runCollective), its
// messages stamped with `algo`'s wire index; any failure aborts the communicator. For
// collectives made of an algorithm's schedules that no single Algorithm::run covers (a fused
// optimizer step, optim/allreduce_update.h). Returns the call's Exchange (for a final scale).
Exchange runSchedule(Group& group, int groupId, const CollectiveArgs& args, const Algorithm& algo,
                     const std::function<void(Exchange&)>& schedule);

// The algorithm runCollective would use for algo="auto" in group `groupId`, with the reason.
std::string explainChoice(const Group& group, int groupId, const CollectiveArgs& args);

// The cost model alone, with no group formed: every algorithm's estimate for `args` on ranks laid
// out as hostOf (host of each rank) with these link costs (see link_load.h for what remote means)
// and `cores` per host (shared_cores.h; -1: this host's, 0: a core for every rank), or why it
// cannot run there; and auto's pick by the model. For planning beyond the machines at
// hand (docs/benchmarks.md extrapolates to 64 hosts x 8 ranks) and for setting the model beside
// measurements.
struct ModelEstimate {
  std::string algo;
  double seconds = 0;  // when whyNot is empty
  std::string whyNot;
};
std::vector<ModelEstimate> modelEstimates(const std::vector<int>& hostOf, const LinkCost& local,
                                          const LinkCost& remote, const CollectiveArgs& args,
                                          int cores, std::string* autoPick);

namespace ring {
const Algorithm& algorithm();
}
namespace halving_doubling {
const Algorithm& algorithm();
}
namespace hierarchical {
const Algorithm& algorithm();
}
namespace reduce_to_one {
const Algorithm& algorithm();
}
namespace direct {
const Algorithm& algorithm();
}
namespace pairwise {
const Algorithm& algorithm();
}
namespace slots {
const Algorithm& algorithm();
// The host segment whose members are exactly the group's ranks (its barrier and small calls
// run there), or nullptr.
HostSegment* segmentServing(const Group& group);
// Why a call of this group cannot run on its host segment at all, or "".
std::string whyNotOnSegment(const Group& group, const CollectiveArgs& args);
void runBarrier(Exchange& ex);
// acc = slot[0] OP slot[1] OP ... over `bytes` at `offset` of every slot, in rank order: the
// same to the bit on every rank that reduces the same slots.
void reduceInRankOrder(Exchange& ex, const std::vector<const char*>& slot, size_t offset,
                       size_t bytes, void* acc);
}  // namespace slots
namespace staged {
const Algorithm& algorithm();
// The host segment serving exactly the group's ranks, if this call's reduce-scatter and
// allgather can run through it (host buffers, no wire format, a slot with room for a part of
// every rank's share), or nullptr.
HostSegment* segmentFor(const Group& group, const CollectiveArgs& args);
// Reduce-scatter through the segment: this rank's share (Chunks(count, n)) of the sum of every
// rank's `count` elements at `in`, into `share` (which may be that share of `in` itself).
void reduceScatter(Exchange& ex, HostSegment& seg, const char* in, char* share, size_t count);
// Allgather through the segment: every rank's share (`shares`) into `out` at its offset, this
// rank's from `mine` (which may be its share of `out` itself).
void allgather(Exchange& ex, HostSegment& seg, const char* mine, char* out, const Chunks& shares);
}  // namespace staged

}  // namespace pycollective

// auto's remembered choices (comm/choice_memo.h): the communicator answers "which algorithm" once
// per call shape, and must answer again whenever what the answer depends on changes -- the link
// costs, the tuned table, the call's size or group -- even when it changes while an answer is
// being worked out. A memo that kept a stale answer would run a slow algorithm forever after
// `pycollective tune` or set_costs; this checks each way of going stale against the model
// evaluated afresh (modelEstimates).
#include <memory>
#include <string>
#include <vector>

#include "algorithms/registry.h"
#include "expect.h"

using namespace pycollective;

namespace {

CollectiveArgs allreduceOf(size_t count) {
  CollectiveArgs a;
  a.kind = CollectiveKind::kAllreduce;
  a.count = count;
  return a;
}

std::string chosen(Communicator& comm, const CollectiveArgs& args) {
  const Group world = Group::world(comm);
  return chooseAlgorithm(world, 0, args, "auto").name();
}

std::string modelPick(const std::vector<int>& hostOf, const LinkCost& local, const LinkCost& remote,
                      const CollectiveArgs& args) {
  std::string pick;
  modelEstimates(hostOf, local, remote, args, -1, &pick);
  return pick;
}

}  // namespace

int main() {
  // Four ranks on two hosts; a communicator without links (the costs read only the layout).
  const std::vector<int> hostOf = {0, 0, 1, 1};
  Communicator comm(0, 4, std::vector<std::unique_ptr<Link>>(4), hostOf, 0);
  // Cheap messages, slow bytes: few bytes per rank wins (ring or halving_doubling). Expensive
  // messages, fast bytes: fewest messages wins (reduce_to_one).
  const LinkCost byteBound{1e-9, 1.0 / 1e6, 1.0 / 1e12};
  const LinkCost messageBound{1.0, 1.0 / 1e15, 1.0 / 1e15};
  const CollectiveArgs big = allreduceOf(1 << 20);

  comm.setCosts(byteBound, byteBound);
  const std::string first = chosen(comm, big);
  EXPECT(first == modelPick(hostOf, byteBound, byteBound, big), "byte-bound pick %s",
         first.c_str());
  EXPECT(chosen(comm, big) == first, "the remembered answer is the same");

  comm.setCosts(messageBound, messageBound);
  const std::string second = chosen(comm, big);
  EXPECT(second == modelPick(hostOf, messageBound, messageBound, big),
         "after setCosts the model's new pick, got %s", second.c_str());
  EXPECT(second != first, "the two cost sets pick different algorithms (%s, %s)", first.c_str(),
         second.c_str());

  // Another size is another shape: its answer is its own, not the remembered one's.
  comm.setCosts(byteBound, byteBound);
  const CollectiveArgs tiny = allreduceOf(1);
  EXPECT(chosen(comm, tiny) == modelPick(hostOf, byteBound, byteBound, tiny), "tiny call");
  EXPECT(chosen(comm, big) == first, "big call after the tiny one");

  // The tuned table overrides the model, and replacing it is seen at once.
  comm.setTuned({TunedChoice{static_cast<int>(CollectiveKind::kAllreduce), size_t(1) << 40,
                             "reduce_to_one"}});
  EXPECT(std::string(chosen(comm, big)) == "reduce_to_one", "tuned reduce_to_one");
  comm.setTuned(
      {TunedChoice{static_cast<int>(CollectiveKind::kAllreduce), size_t(1) << 40, "ring"}});
  EXPECT(std::string(chosen(comm, big)) == "ring", "tuned ring");
  comm.setTuned({});
  EXPECT(chosen(comm, big) == first, "table removed: the model again");

  // A subgroup is another group: the whole world's answer is not reused for it.
  const Group pair(comm, {0, 1});
  const std::string forPair = chooseAlgorithm(pair, 7, big, "auto").name();
  EXPECT(forPair == modelPick({0, 0}, byteBound, byteBound, big), "pair pick %s", forPair.c_str());

  // The cores the model shares among ranks are an input too: 3 ranks of one host at 16 KiB
  // take the ring when each has a core, something else when they share 2 (shared_cores.h).
  Communicator three(0, 3, std::vector<std::unique_ptr<Link>>(3), {0, 0, 0}, 0);
  const LinkCost shm{3e-6, 1.0 / 8e9, 1.0 / 10e9};
  three.setCosts(shm, shm);
  three.setModelCores(0);
  const CollectiveArgs mid = allreduceOf(4096);
  EXPECT(chosen(three, mid) == "ring", "3 ranks, a core each: %s", chosen(three, mid).c_str());
  three.setModelCores(2);
  EXPECT(chosen(three, mid) != "ring", "3 ranks on 2 cores still pick the remembered ring");

  // An answer worked out while another thread changed the costs is not kept: it may rest on
  // the old ones.
  ChoiceMemo memo;
  CallShape shape;
  shape.count = 42;
  uint64_t epoch = 0;
  EXPECT(memo.find(shape, &epoch) == -1, "empty memo");
  memo.forget();  // the costs changed between the look-up and the answer
  memo.remember(shape, 3, epoch);
  EXPECT(memo.find(shape, &epoch) == -1, "a stale answer was kept");
  memo.remember(shape, 3, epoch);
  EXPECT(memo.find(shape, &epoch) == 3, "a fresh answer is kept");

  std::printf("%d checks, %d failures\n", gChecks, gFailures);
  return gFailures == 0 ? 0 : 1;
}

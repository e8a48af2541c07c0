#include "local/local_group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "algorithms/registry.h"
#include "core/cache_probe.h"
#include "core/error.h"
#include "core/host_copy.h"
#include "core/knobs.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "cuda/device_ops.h"
#include "local/inline_collective.h"
#include "reduce/reduce.h"
#include "transport/inproc.h"

namespace pycollective {

namespace {
// In-process links whose threads outnumber the cores: a message costs a doorbell and a thread
// wake-up (`pycollective tune` measured 17 us on a 2-vCPU VM with 4 replicas), and a byte one
// pass over memory at the thread's share of a core: 6 GB/s with two threads per core, so with
// t per core each pass runs at 2/t of that. (Without that share, 8 replicas on 2 cores at
// 512 KiB went to halving-doubling, modelled at 319 us and measured at 368-400, where `inline`
// took 250-260.)
constexpr double kWakeSeconds = 15e-6;
constexpr double kSecondsPerByteTwoThreadsPerCore = 1.0 / 6e9;
// Replicas of a group across processes share the host's cores with other processes' threads,
// which one process cannot count: the measured two-threads-per-core costs.
const LinkCost kInprocLink{kWakeSeconds, kSecondsPerByteTwoThreadsPerCore,
                           kSecondsPerByteTwoThreadsPerCore};
// In-process links when every replica's thread has a core of its own: the peer is running and
// its message is picked up within microseconds, and the threads' passes over memory run side by
// side. 2 replicas on 2 cores, halving-doubling at 8 B took 21 us against `inline`'s 11 (with 4
// replicas 50 against 16); these rates put the model's boundary between `inline` and the
// threaded algorithms for 2 replicas between 512 KiB and 1 MiB, where it was measured (at
// 2 MiB `inline` took 170 us and halving-doubling 115; the shared-core costs kept `inline` up
// to 2 MiB).
const LinkCost kInprocLinkOwnCores{5e-6, 1.0 / 10e9, 1.0 / 10e9};

LinkCost inprocLinkCost(int replicas) {
  const int cores = hostCores();
  if (replicas <= cores) return kInprocLinkOwnCores;
  const double threadsPerCore = static_cast<double>(replicas) / cores;
  const double perByte = kSecondsPerByteTwoThreadsPerCore * threadsPerCore / 2;
  return LinkCost{kWakeSeconds, perByte, perByte};
}
}  // namespace

LocalGroup::LocalGroup(int size, double timeoutSeconds, int groupSize)
    : autoTrials_(static_cast<int>(knobs::integer(knobs::kAutoTrials))) {
  PC_CHECK(size >= 1, "a LocalCommunicator needs at least one replica, got ", size);
  PC_CHECK(groupSize >= 0, "group_size must be positive, got ", groupSize);
  PC_CHECK(groupSize == 0 || size % groupSize == 0, "group_size ", groupSize,
           " must divide the number of replicas (", size, ")");
  InprocFabric fabric(size);
  for (int r = 0; r < size; ++r) {
    auto comm = std::make_unique<Communicator>(r, size, fabric.links(r), std::vector<int>(size, 0),
                                               timeoutSeconds);
    const LinkCost link = inprocLinkCost(size);
    comm->setCosts(link, link);
    comm->setModelCores(0);  // inprocLinkCost prices the threads' share of the cores
    comm->setCacheBytes(static_cast<double>(cacheResidentBytes()));
    comm->setHierarchicalGroupSize(groupSize);
    comm->setAutoTrials(0);  // this group measures for all its replicas (measured_choice.h)
    comms_.push_back(std::move(comm));
  }
}

LocalGroup::LocalGroup(int worker, int numWorkers,
                       std::vector<std::vector<std::unique_ptr<Link>>> crossLinks,
                       const std::vector<int>& hostOfWorker, double timeoutSeconds)
    : numWorkers_(numWorkers) {
  const int size = static_cast<int>(crossLinks.size());
  PC_CHECK(size >= 1, "a group of replicas needs at least one local replica");
  PC_CHECK(numWorkers >= 1 && worker >= 0 && worker < numWorkers, "worker ", worker,
           " is out of range for ", numWorkers, " workers");
  PC_CHECK(static_cast<int>(hostOfWorker.size()) == numWorkers, "expected ", numWorkers,
           " host entries, got ", hostOfWorker.size());
  const int world = numWorkers * size;
  std::vector<int> hostOf(world);
  for (int r = 0; r < world; ++r) hostOf[r] = hostOfWorker[r / size];
  InprocFabric fabric(size);
  for (int l = 0; l < size; ++l) {
    PC_CHECK(static_cast<int>(crossLinks[l].size()) == numWorkers, "local replica ", l,
             ": expected ", numWorkers, " link entries, got ", crossLinks[l].size());
    std::vector<std::unique_ptr<Link>> links(world);
    auto local = fabric.links(l);
    for (int m = 0; m < size; ++m) links[worker * size + m] = std::move(local[m]);
    for (int w = 0; w < numWorkers; ++w) {
      if (w == worker) continue;
      PC_CHECK(crossLinks[l][w] != nullptr, "local replica ", l, ": no link to worker ", w);
      links[w * size + l] = std::move(crossLinks[l][w]);
    }
    auto comm = std::make_unique<Communicator>(worker * size + l, world, std::move(links), hostOf,
                                               timeoutSeconds);
    // Each process's replicas form one hierarchical group, whatever the hosts say (several
    // workers may share a host).
    comm->setHierarchicalGroupSize(size);
    comm->setCosts(kInprocLink, comm->remoteCost());
    comm->setModelCores(0);  // kInprocLink is the shared-core cost, as above
    comm->setAutoTrials(0);  // it runs hierarchical alone
    comms_.push_back(std::move(comm));
  }
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::runCrossSmall(const std::vector<CollectiveArgs>& args) {
  Communicator& first = *comms_[0];
  if (first.aborted())
    throw Aborted(first.who() + " this group was aborted earlier (" + first.abortReason() +
                  "); create a new group to continue");
  // 1. This process's replicas reduced into replica 0's output, on this thread.
  // avg: sums all the way, one scale over every replica at the end.
  const bool avg = args[0].op == ReduceOp::kAvg;
  if (avg) lookupReduce(args[0].dtype, args[0].op);  // InvalidType for an integer avg, up front
  std::vector<CollectiveArgs> local = args;
  for (CollectiveArgs& a : local) {
    a.kind = CollectiveKind::kReduce;
    a.root = 0;
    if (avg) a.op = ReduceOp::kSum;
  }
  runInline(local);
  // 2. Replica 0 of every process all-reduces that, in place, over its own links.
  const int size = this->size();
  std::vector<int> firsts;
  for (int w = 0; w < numWorkers_; ++w) firsts.push_back(w * size);
  CollectiveArgs cross = local[0];
  cross.kind = CollectiveKind::kAllreduce;
  cross.in = cross.out;
  try {
    first.executor().run([&] { runCollective(first, firsts, kCrossSmallGroupId, cross, "auto"); });
  } catch (const std::exception& e) {
    abort(e.what());  // every replica's links: the other processes stop waiting for them too
    throw;
  }
  if (avg) scaleInPlace(args[0].out, args[0].count, args[0].dtype, 1.0 / (numWorkers_ * size));
  // 3. The other replicas get copies.
  const size_t bytes = args[0].count * elementSize(args[0].dtype);
  for (int r = 1; r < size; ++r)
    if (args[r].out != args[0].out) hostCopy(args[r].out, args[0].out, bytes);
}

void LocalGroup::checkCrossProcessCall(const CollectiveArgs& args, const std::string& algo) const {
  PC_CHECK(args.kind == CollectiveKind::kAllreduce,
           "a group of replicas across processes runs allreduce only (its links are the ones the "
           "hierarchical algorithm uses); got ",
           collectiveName(args.kind));
  PC_CHECK(algo == "auto" || algo == "hierarchical",
           "a group of replicas across processes runs the hierarchical algorithm (its links are "
           "the ones it uses); got algo='",
           algo, "': pass 'hierarchical' or 'auto'");
  PC_CHECK(args.device < 0, "a group of replicas across processes takes host buffers only");
  // Checked before anything moves: the small path reduces the local replicas before its
  // cross-process call would refuse the call, and a refusal there aborts the group.
  checkCompressible(comms_[0]->who(), args);
}

bool LocalGroup::inlineIsBest(const std::vector<CollectiveArgs>& args) {
  if (args[0].device >= 0) return false;
  Communicator& first = *comms_[0];
  const Group group = Group::world(first);
  const CallShape shape = callShape(kInlineBeatsAll, group, 0, args[0]);
  uint64_t epoch = 0;
  const int known = first.autoChoices().find(shape, &epoch);
  if (known >= 0) return known == 1;
  bool best;
  if (const TunedChoice* t = tunedEntry(group, args[0]))
    best = t->algo == kInlineAlgorithm;
  else
    best = inlineCost(args, first.cacheBytes()) < bestModelCost(group, args[0]);
  first.autoChoices().remember(shape, best ? 1 : 0, epoch);
  return best;
}

void LocalGroup::run(const std::vector<CollectiveArgs>& args, const std::string& algo) {
  PC_ASSERT(static_cast<int>(args.size()) == size(), "one call per replica");
  std::lock_guard<std::mutex> oneCallAtATime(runMu_);
  if (numWorkers_ > 1) {
    checkCrossProcessCall(args[0], algo);
    const size_t bytes = args[0].count * elementSize(args[0].dtype);
    if (bytes <= kCrossSmallBytes)
      runCrossSmall(args);
    else
      runOnReplicas(args, "hierarchical");
    return;
  }
  PC_CHECK(args[0].wire == WireFormat::kNative, "compress=\"", wireFormatName(args[0].wire),
           "\" changes how values cross network links, and replicas in one process have "
           "none: drop compress=");
  if (algo == "auto" && args[0].device < 0) {
    CallShape shape;
    bool trial = false;
    const std::string pick = autoPick(args, &shape, &trial);
    const auto start = std::chrono::steady_clock::now();
    runOnHost(args, pick);
    if (!trial) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (measured_.record(shape, pick, seconds))  // settled, or moved: said at INFO
      PC_INFO(kColl, comms_[0]->who(), " auto for ", collectiveName(args[0].kind), " of ",
              args[0].count * elementSize(args[0].dtype), " bytes now runs ",
              measured_.describe(shape, comms_[0]->autoChoices().epoch()));
    return;
  }
  if (algo == kInlineAlgorithm) {
    runOnHost(args, algo);
    return;
  }
  if (args[0].device >= 0) {
    // Replicas on several devices reduce straight out of each other's buffers.
    std::vector<int> devices;
    for (const auto& a : args)
      if (std::find(devices.begin(), devices.end(), a.device) == devices.end())
        devices.push_back(a.device);
    if (devices.size() > 1) cuda::requireDeviceOps("replicas on devices").enablePeerAccess(devices);
  }
  runOnReplicas(args, algo);
}

void LocalGroup::runOnHost(const std::vector<CollectiveArgs>& args, const std::string& algo) {
  if (algo != kInlineAlgorithm) {
    runOnReplicas(args, algo);
    return;
  }
  // The checks runCollective makes before anything moves.
  Communicator& first = *comms_[0];
  if (first.aborted())
    throw Aborted(first.who() + " this group was aborted earlier (" + first.abortReason() +
                  "); create a new LocalCommunicator to continue");
  PC_CHECK(args[0].root >= 0 && args[0].root < size(), "root ", args[0].root,
           " is out of range for ", size(), " replicas");
  runInline(args);
}

std::string LocalGroup::autoPick(const std::vector<CollectiveArgs>& args, CallShape* shape,
                                 bool* trial) {
  Communicator& first = *comms_[0];
  const Group group = Group::world(first);
  if (autoTrials_ <= 0 || !autoMeasures(args[0].kind))
    return inlineIsBest(args) ? kInlineAlgorithm : "auto";
  *shape = callShape(kMeasuredTrial, group, 0, args[0]);
  return measured_.pick(
      *shape, first.autoChoices().epoch(), autoTrials_, [&] { return autoCandidates(args); },
      trial);
}

std::vector<MeasuredChoices::Candidate> LocalGroup::autoCandidates(
    const std::vector<CollectiveArgs>& args) {
  const Group group = Group::world(*comms_[0]);
  std::vector<MeasuredChoices::Candidate> all;
  for (const PricedAlgorithm& p : modelCosts(group, args[0])) all.push_back({p.name, p.seconds});
  // Last, so that on a tie the threaded algorithm comes first (the sort is stable), as
  // inlineIsBest decides. Priced by its own model, whose errors are not the links'.
  all.push_back({kInlineAlgorithm, inlineCost(args, comms_[0]->cacheBytes())});
  all.back().ownModel = true;
  // The rest wait in reserve, cheapest first (measured_choice.h says when they are timed).
  return candidatesWithReserves(std::move(all), tunedEntry(group, args[0]));
}

void LocalGroup::runOnReplicas(const std::vector<CollectiveArgs>& args, const std::string& algo) {
  // Replicas 1..n-1 run on their executor threads, replica 0 on the caller's thread.
  std::vector<WorkPtr> works;
  for (int r = 1; r < size(); ++r) {
    Communicator* comm = comms_[r].get();
    CollectiveArgs a = args[r];
    works.push_back(comm->executor().submit([comm, a, algo] { runCollective(*comm, a, algo); }));
  }
  auto first = std::make_shared<Work>();
  try {
    Communicator* comm = comms_[0].get();
    comm->executor().run([&] { runCollective(*comm, args[0], algo); });
    first->markDone(nullptr, 0);
  } catch (...) {
    first->markDone(std::current_exception(), 0);
  }
  works.insert(works.begin(), first);
  // Each replica's call is bounded by its own deadline, so these waits end.
  // When one replica fails, the others fail as a consequence (RemoteError/Aborted naming it):
  // report the cause.
  std::exception_ptr cause, consequence;
  for (auto& w : works) {
    try {
      w->wait(-1);
    } catch (const RemoteError&) {
      if (!consequence) consequence = std::current_exception();
    } catch (const Aborted&) {
      if (!consequence) consequence = std::current_exception();
    } catch (...) {
      if (!cause) cause = std::current_exception();
    }
  }
  if (cause) std::rethrow_exception(cause);
  if (consequence) std::rethrow_exception(consequence);
}

void LocalGroup::abort(const std::string& reason) noexcept {
  for (auto& c : comms_) c->abort(reason);
}

std::string LocalGroup::explain(const CollectiveArgs& args) {
  if (numWorkers_ > 1) return "hierarchical (the one algorithm of a group across processes)";
  const std::vector<CollectiveArgs> all(comms_.size(), args);
  // A trial begun before set_costs/set_tuned (another epoch) no longer decides.
  const std::string measured =
      measured_.describe(callShape(kMeasuredTrial, Group::world(*comms_[0]), 0, args),
                         comms_[0]->autoChoices().epoch());
  if (!measured.empty()) return measured;
  const Group group = Group::world(*comms_[0]);
  const bool tuned = tunedEntry(group, args) != nullptr;
  if (inlineIsBest(all))
    return std::string(kInlineAlgorithm) + " (every replica's buffers on the calling thread; " +
           (tuned ? "tuned table, PYCOLLECTIVE_TUNING)" : "model:" + modelTable(all) + ")");
  const std::string choice = explainChoice(group, 0, args);
  if (tuned) return choice;
  return choice.substr(0, choice.find(' ')) + " (model:" + modelTable(all) + ")";
}

std::string LocalGroup::modelTable(const std::vector<CollectiveArgs>& args) {
  // `inline` first: priced by its own model, beside the algorithms the links' costs price.
  std::ostringstream table;
  table << " " << kInlineAlgorithm << "=" << inlineCost(args, comms_[0]->cacheBytes()) * 1e6
        << "us";
  for (const PricedAlgorithm& p : modelCosts(Group::world(*comms_[0]), args[0]))
    table << " " << p.name << "=" << p.seconds * 1e6 << "us";
  return table.str();
}

}  // namespace pycollective

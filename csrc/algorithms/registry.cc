#include "algorithms/registry.h"

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "algorithms/barrier.h"
#include "algorithms/chunking.h"
#include "algorithms/exchange.h"
#include "core/error.h"
#include "core/logging.h"
#include "reduce/reduce.h"
#include "transport/frame.h"
#include "transport/host_segment.h"

namespace pycollective {

namespace {

// The wire index of an algorithm is its position here: append only.
const std::vector<const Algorithm*>& registry() {
  static const std::vector<const Algorithm*> all = {
      &ring::algorithm(),         &halving_doubling::algorithm(),
      &hierarchical::algorithm(), &reduce_to_one::algorithm(),
      &direct::algorithm(),       &pairwise::algorithm(),
      &slots::algorithm(),        &staged::algorithm()};
  return all;
}

// auto's choice is logged once per communicator, group, collective, dtype, power-of-two size
// class and algorithm, not once per call: a training loop makes the same calls every step.
bool firstOfSizeClass(const std::string& who, int groupId, const CollectiveArgs& args,
                      const Algorithm* algo) {
  static std::mutex mu;
  static std::set<std::string> said;
  size_t bytes = args.count * elementSize(args.dtype);
  int sizeClass = 0;
  while (bytes > 1) {
    bytes >>= 1;
    ++sizeClass;
  }
  const std::string key = who + "|" + std::to_string(groupId) + "|" +
                          std::to_string(static_cast<int>(args.kind)) + "|" +
                          std::to_string(static_cast<int>(args.dtype)) + "|" +
                          std::to_string(sizeClass) + "|" + algo->name();
  std::lock_guard<std::mutex> lock(mu);
  return said.insert(key).second;
}

}  // namespace

const Algorithm* algorithmNamed(const std::string& name) {
  for (const Algorithm* a : registry())
    if (name == a->name()) return a;
  return nullptr;
}

namespace {

uint8_t indexOf(const Algorithm* algo) {
  const auto& all = registry();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == algo) return static_cast<uint8_t>(i);
  return 255;
}

std::string joinNames() {
  std::string s;
  for (const auto& n : algorithmNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

struct Choice {
  const Algorithm* algo = nullptr;
  std::string table;  // the cost table, for the log
};

// Pairwise kinds run only on the pairwise algorithm, and it runs nothing else: one schedule per
// collective, so the others need not know these kinds exist.
std::string kindMismatch(const Algorithm* a, const CollectiveArgs& args) {
  const bool pairwiseAlgo = a == &pairwise::algorithm();
  if (isPairwise(args.kind) == pairwiseAlgo) return "";
  if (pairwiseAlgo)
    return std::string("it runs alltoall, gather, scatter and send/recv only, not ") +
           collectiveName(args.kind);
  return std::string(collectiveName(args.kind)) + " runs only on the pairwise algorithm";
}

std::string whyNot(const Algorithm* a, const Group& group, const CollectiveArgs& args) {
  std::string why = kindMismatch(a, args);
  return why.empty() ? a->unsupported(group, args) : why;
}

// The tuned table's entry for this call, if the call spans the whole communicator (the table was
// measured at that size) and the entry's algorithm can run it.
const Algorithm* tunedChoice(const Group& group, const CollectiveArgs& args) {
  const TunedChoice* pick = tunedEntry(group, args);
  if (pick == nullptr) return nullptr;
  const Algorithm* a = algorithmNamed(pick->algo);
  return a != nullptr && whyNot(a, group, args).empty() ? a : nullptr;
}

// The table (for the log) is only written when asked. Runs once per call shape: the
// communicator remembers auto's answer (chooseAlgorithm).
Choice chooseAuto(const Group& group, const CollectiveArgs& args, bool withTable) {
  Choice c;
  double best = std::numeric_limits<double>::infinity();
  std::ostringstream table;
  for (const Algorithm* a : registry()) {
    if (!whyNot(a, group, args).empty()) {
      if (withTable) table << " " << a->name() << "=n/a";
      continue;
    }
    double t = a->cost(group, args);
    if (withTable) table << " " << a->name() << "=" << t * 1e6 << "us";
    if (t < best) {
      best = t;
      c.algo = a;
    }
  }
  if (withTable) c.table = table.str();
  return c;
}

void throwIfAborted(Communicator& comm) {
  if (comm.aborted())
    throw Aborted(comm.who() + " this group was aborted earlier (" + comm.abortReason() +
                  "); create a new group to continue");
}

// Runs a started collective; a failure after data may have moved aborts the communicator, so
// its peers stop waiting for this rank (their links fail at once).
template <typename Fn>
void abortOnFailure(Communicator& comm, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    comm.abort(e.what());
    throw;
  }
}

void checkRoot(const Group& group, const CollectiveArgs& args) {
  PC_CHECK(args.root >= 0 && args.root < group.size(), group.comm().who(), " root ", args.root,
           " is out of range for a group of ", group.size(), " ranks");
}

// The output of a compressed call, rounded to the wire format on every rank (wire_codec.h).
void roundOutput(const Group& group, const CollectiveArgs& args) {
  const size_t count = args.kind == CollectiveKind::kAllreduce
                           ? args.count
                           : Chunks(args.count, group.size()).size(group.rank());
  roundToWire(args.wire, static_cast<float*>(args.out), count);
}

}  // namespace

void checkCompressible(const std::string& who, const CollectiveArgs& args) {
  if (args.wire == WireFormat::kNative) return;
  const char* format = wireFormatName(args.wire);
  PC_CHECK(args.kind == CollectiveKind::kAllreduce || args.kind == CollectiveKind::kReduceScatter,
           who, " compress=\"", format, "\" applies to allreduce and reduce_scatter, not ",
           collectiveName(args.kind), "; drop compress=");
  PC_CHECK(args.dtype == DType::kFloat32, who, " compress=\"", format,
           "\" sends float32 values as 16 bits, but this tensor is ", dtypeName(args.dtype),
           "; drop compress= (or convert the tensor to float32)");
  PC_CHECK(args.device < 0, who, " compress=\"", format,
           "\" applies to host tensors on pycollective's own links; device tensors go through "
           "NCCL: drop compress=");
}

Exchange runSchedule(Group& group, int groupId, const CollectiveArgs& args, const Algorithm& algo,
                     const std::function<void(Exchange&)>& schedule) {
  Communicator& comm = group.comm();
  throwIfAborted(comm);
  Exchange ex(group, args, indexOf(&algo), comm.nextSeq(groupId));
  // The group's host segment learns of calls that go over links, so that a rank waiting there
  // for the same collective fails at once with both calls named (host_segment.h).
  if (&algo != &slots::algorithm() && &algo != &staged::algorithm())
    if (HostSegment* seg = slots::segmentServing(group)) seg->announceLinkCall(ex.callHeader());
  abortOnFailure(comm, [&] { schedule(ex); });
  return ex;
}

const Algorithm& chooseAlgorithm(const Group& group, int groupId, const CollectiveArgs& args,
                                 const std::string& algoName) {
  const Communicator& comm = group.comm();
  checkRoot(group, args);
  // Fails with InvalidType for an integer avg, before anything moves.
  if (reducesData(args.kind)) lookupReduce(args.dtype, args.op);
  checkCompressible(comm.who(), args);

  const Algorithm* algo = nullptr;
  const bool explain = logEnabled(LogLevel::kInfo, LogSubsys::kColl);
  const bool isAuto = algoName == "auto";
  const CallShape shape = isAuto ? callShape(kWhichAlgorithm, group, groupId, args) : CallShape{};
  uint64_t epoch = 0;
  if (isAuto) {
    const int known = comm.autoChoices().find(shape, &epoch);
    if (known >= 0) return *registry()[known];
  }
  if (isAuto && (algo = tunedChoice(group, args)) != nullptr) {
    if (explain && firstOfSizeClass(comm.who(), groupId, args, algo))
      PC_INFO(kColl, comm.who(), " auto chose ", algo->name(), " for ", collectiveName(args.kind),
              " of ", args.count * elementSize(args.dtype),
              " bytes from the tuned table (said once per size class)");
  } else if (isAuto) {
    Choice c = chooseAuto(group, args, explain);
    PC_ASSERT(c.algo != nullptr, "no algorithm supports ", collectiveName(args.kind));
    algo = c.algo;
    if (explain && firstOfSizeClass(comm.who(), groupId, args, algo))
      PC_INFO(kColl, comm.who(), " auto chose ", algo->name(), " for ", collectiveName(args.kind),
              " of ", args.count * elementSize(args.dtype),
              " bytes (said once per size class); model:", c.table);
  } else {
    PC_CHECK(algoName != kInlineAlgorithm, comm.who(),
             " algorithm 'inline' computes a "
             "collective from every replica's buffers on one thread, so it runs only for "
             "in-process replicas (LocalCommunicator); choose one of ",
             joinNames());
    algo = algorithmNamed(algoName);
    PC_CHECK(algo != nullptr, "unknown algorithm '", algoName, "'; choose one of ", joinNames());
    std::string why = whyNot(algo, group, args);
    PC_CHECK(why.empty(), comm.who(), " algorithm '", algoName, "' cannot run ",
             collectiveName(args.kind), " here: ", why);
  }
  if (isAuto) comm.autoChoices().remember(shape, indexOf(algo), epoch);
  return *algo;
}

void runWith(Group& group, int groupId, const CollectiveArgs& args, const Algorithm& algo) {
  Exchange ex = runSchedule(group, groupId, args, algo, [&](Exchange& e) { algo.run(e, args); });
  // Rounded before avg's scale: a value one rank kept in float32 and its rounded copy on another
  // rank round alike, but scaled first they need not.
  if (args.wire != WireFormat::kNative && !ex.outputRounded()) roundOutput(group, args);
  if (args.op == ReduceOp::kAvg) {
    const double scale = 1.0 / group.size();
    switch (args.kind) {
      case CollectiveKind::kAllreduce: ex.scale(args.out, args.count, scale); break;
      case CollectiveKind::kReduce:
        if (group.rank() == args.root) ex.scale(args.out, args.count, scale);
        break;
      case CollectiveKind::kReduceScatter:
        ex.scale(args.out, Chunks(args.count, group.size()).size(group.rank()), scale);
        break;
      default: break;
    }
  }
}

const TunedChoice* tunedEntry(const Group& group, const CollectiveArgs& args) {
  const Communicator& comm = group.comm();
  if (comm.tuned().empty() || group.size() != comm.size()) return nullptr;
  const size_t bytes = args.count * elementSize(args.dtype);
  const TunedChoice* pick = nullptr;
  for (const TunedChoice& t : comm.tuned()) {
    if (t.kind != static_cast<int>(args.kind)) continue;
    pick = &t;  // the largest entry serves anything bigger than the table covers
    if (bytes <= t.maxBytes) break;
  }
  return pick;
}

CallShape callShape(AutoQuestion question, const Group& group, int groupId,
                    const CollectiveArgs& args) {
  CallShape c;
  c.question = question;
  c.groupId = groupId;
  uint64_t members = static_cast<uint64_t>(group.size());
  for (int i = 0; i < group.size(); ++i)
    members = (members ^ static_cast<uint64_t>(group.globalRank(i))) * 0x100000001b3ull;
  c.members = members;
  c.kind = static_cast<uint8_t>(args.kind);
  c.dtype = static_cast<uint8_t>(args.dtype);
  c.op = static_cast<uint8_t>(args.op);
  c.wire = static_cast<uint8_t>(args.wire);
  c.root = args.root;
  c.device = args.device >= 0;
  c.count = args.count;
  c.segmentBytes = args.segmentBytes;
  return c;
}

double bestModelCost(const Group& group, const CollectiveArgs& args) {
  Choice c = chooseAuto(group, args, false);
  return c.algo != nullptr ? c.algo->cost(group, args) : std::numeric_limits<double>::infinity();
}

std::vector<PricedAlgorithm> modelCosts(const Group& group, const CollectiveArgs& args) {
  std::vector<PricedAlgorithm> priced;
  for (const Algorithm* a : registry())
    if (whyNot(a, group, args).empty()) priced.push_back({a->name(), a->cost(group, args)});
  return priced;
}

std::vector<std::string> algorithmNames() {
  std::vector<std::string> names;
  // pairwise is left out: it runs only alltoall, gather, scatter and send/recv, which choose it
  // themselves; the names listed are those algo= accepts for the other collectives.
  for (const Algorithm* a : registry())
    if (a != &pairwise::algorithm()) names.push_back(a->name());
  names.push_back(kInlineAlgorithm);
  names.push_back("auto");
  return names;
}

const char* algorithmName(uint8_t index) {
  const auto& all = registry();
  if (index == 255) return "barrier";
  return index < all.size() ? all[index]->name() : "?";
}

// Frame errors (transport/frame.h) name the header's algorithm index through this.
[[maybe_unused]] const bool kAlgorithmNamerRegistered =
    (registerAlgorithmNamer(&algorithmName), true);

LinkCost onWire(LinkCost network, const CollectiveArgs& args) {
  if (args.wire == WireFormat::kNative) return network;
  const double shrink = static_cast<double>(wireElementSize(args.wire)) / sizeof(float);
  network.beta *= shrink;
  network.gamma *= 2;  // the reduction also decodes, and the sender encodes
  return network;
}

LinkCost costOf(const Group& group, const CollectiveArgs& args) {
  const auto& hosts = group.comm().hostOf();
  int first = hosts[group.globalRank(0)];
  for (int i = 1; i < group.size(); ++i)
    if (hosts[group.globalRank(i)] != first) return onWire(group.comm().remoteCost(), args);
  return group.comm().localCost();
}

std::string explainChoice(const Group& group, int groupId, const CollectiveArgs& args) {
  const std::string measured = describeMeasuredAuto(group, groupId, args);
  if (!measured.empty()) return measured;
  if (const Algorithm* t = tunedChoice(group, args))
    return std::string(t->name()) + " (tuned table, PYCOLLECTIVE_TUNING)";
  Choice c = chooseAuto(group, args, true);
  return std::string(c.algo ? c.algo->name() : "none") + " (model:" + c.table + ")";
}

std::vector<ModelEstimate> modelEstimates(const std::vector<int>& hostOf, const LinkCost& local,
                                          const LinkCost& remote, const CollectiveArgs& args,
                                          int cores, std::string* autoPick) {
  const int n = static_cast<int>(hostOf.size());
  PC_CHECK(n >= 1, "the layout needs at least one rank");
  // Rank 0's view of a communicator without links: the costs read only the layout.
  Communicator comm(0, n, std::vector<std::unique_ptr<Link>>(n), hostOf, 0);
  comm.setCosts(local, remote);
  if (cores >= 0) comm.setModelCores(cores);
  const Group group = Group::world(comm);
  std::vector<ModelEstimate> out;
  for (const Algorithm* a : registry()) {
    if (a == &pairwise::algorithm() && !isPairwise(args.kind)) continue;
    ModelEstimate e{a->name(), 0, whyNot(a, group, args)};
    if (e.whyNot.empty()) e.seconds = a->cost(group, args);
    out.push_back(e);
  }
  if (autoPick != nullptr) {
    Choice c = chooseAuto(group, args, false);
    *autoPick = c.algo != nullptr ? c.algo->name() : "";
  }
  return out;
}

void runCollective(Communicator& comm, const CollectiveArgs& args, const std::string& algoName) {
  std::vector<int> all(comm.size());
  for (int i = 0; i < comm.size(); ++i) all[i] = i;
  runCollective(comm, all, 0, args, algoName);
}

void runCollective(Communicator& comm, const std::vector<int>& members, int groupId,
                   const CollectiveArgs& args, const std::string& algoName) {
  throwIfAborted(comm);
  Group group(comm, members);
  if (args.kind == CollectiveKind::kBarrier) {
    checkRoot(group, args);
    Exchange ex(group, args, 255, comm.nextSeq(groupId));
    if (slots::segmentServing(group) != nullptr)
      abortOnFailure(comm, [&] { slots::runBarrier(ex); });
    else
      abortOnFailure(comm, [&] { runBarrier(ex); });
    return;
  }
  const Algorithm& chosen = chooseAlgorithm(group, groupId, args, algoName);
  if (algoName == "auto" && runMeasuredAuto(group, groupId, args)) return;
  runWith(group, groupId, args, chosen);
}

PreparedCollective::PreparedCollective(Communicator& comm, std::vector<int> members, int groupId,
                                       const CollectiveArgs& args, const std::string& algo,
                                       bool keepMeasuring)
    : group_(comm, std::move(members)), groupId_(groupId), args_(args) {
  PC_CHECK(args.kind != CollectiveKind::kBarrier && !isPairwise(args.kind),
           "a prepared call runs allreduce, reduce_scatter, allgather, broadcast or reduce, not ",
           collectiveName(args.kind));
  throwIfAborted(comm);
  algo_ = &chooseAlgorithm(group_, groupId_, args_, algo);
  measured_ = keepMeasuring && algo == "auto" && measuresAuto(group_, groupId_, args_);
}

PreparedCollective::PreparedCollective(Communicator& comm, std::vector<int> members, int groupId,
                                       const CollectiveArgs& args, MappedBuffers mapped)
    : group_(comm, std::move(members)), groupId_(groupId), args_(args), mapped_(std::move(mapped)) {
  PC_CHECK(args.kind == CollectiveKind::kAllreduce && args.wire == WireFormat::kNative &&
               args.device < 0,
           "a call on mapped buffers is a host allreduce without compression");
  PC_CHECK(mapped_.in.size() == size_t(group_.size()) && mapped_.out.size() == mapped_.in.size(),
           "mapped buffers name ", mapped_.in.size(), " inputs and ", mapped_.out.size(),
           " outputs for a group of ", group_.size());
  throwIfAborted(comm);
  args_.mapped = &mapped_;
  algo_ = &chooseAlgorithm(group_, groupId_, args_, "direct");
}

void PreparedCollective::run() {
  if (measured_ && runMeasuredAuto(group_, groupId_, args_)) return;
  runWith(group_, groupId_, args_, *algo_);
}

void PreparedCollective::runOn(const void* in, void* out) {
  PC_ASSERT(args_.mapped == nullptr, "a call on mapped buffers runs on those buffers only");
  CollectiveArgs a = args_;
  a.in = in;
  a.out = out;
  if (measured_ && runMeasuredAuto(group_, groupId_, a)) return;
  runWith(group_, groupId_, a, *algo_);
}

std::string PreparedCollective::algorithm() const {
  if (measured_) {
    std::string now = runningMeasuredAuto(group_, groupId_, args_);
    if (!now.empty()) return now;
  }
  return algo_->name();
}

}  // namespace pycollective

// The native side of a process group: links made by the transports, a Communicator over them,
// and synchronous or asynchronous collectives on it. Connections are made (and authenticated)
// in Python; this layer takes over sockets and shared-memory names.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>

#include "algorithms/registry.h"
#include "algorithms/shared_cores.h"
#include "bindings/bindings.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "transport/aead.h"
#include "transport/bridge.h"
#include "transport/host_segment.h"
#include "transport/shm.h"
#include "transport/tcp.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

void bindGroup(py::module_& m) {
  py::class_<LinkHandle>(m, "Link").def("__repr__", &LinkHandle::describe);

  m.def(
      "tcp_link",
      [](int fd, int rank, int peer, const std::string& address, py::bytes key) {
        TcpLinkOptions o;
        o.fd = fd;
        o.rank = rank;
        o.peer = peer;
        o.peerAddress = address;
        o.key = std::string(key);
        return LinkHandle{makeTcpLink(o)};
      },
      py::kw_only(), py::arg("fd"), py::arg("rank"), py::arg("peer"), py::arg("address"),
      py::arg("key") = py::bytes(),
      "Takes over a connected, authenticated socket (the link closes it). With a 32-byte key, "
      "every byte travels in AES-256-GCM records (both ends need the same key).");
  m.def("data_cipher_library", &Aes256Gcm::describeLibrary,
        "The libcrypto that encrypted tcp links use (loaded on first use); raises when none "
        "can be loaded.");

  m.def(
      "shm_link",
      [](const std::string& name, bool create, int rank, int peer, py::bytes digest,
         size_t ringBytes, double timeout) {
        ShmLinkOptions o;
        o.name = name;
        o.create = create;
        o.rank = rank;
        o.peer = peer;
        o.authDigest = digest;
        o.ringBytes = ringBytes;
        o.connectTimeoutSeconds = timeout;
        py::gil_scoped_release release;
        return LinkHandle{connectShm(o)};
      },
      py::kw_only(), py::arg("name"), py::arg("create"), py::arg("rank"), py::arg("peer"),
      py::arg("digest"), py::arg("ring_bytes"), py::arg("timeout"),
      "Creates (lower rank) or opens a shared-memory segment; blocks until both sides attached.");

  py::class_<BridgeEnd, std::shared_ptr<BridgeEnd>>(m, "BridgeEnd",
                                                    "The pump side of a bridged (grpc) link.")
      .def(
          "take_outgoing",
          [](BridgeEnd& e, double timeout) -> py::object {
            std::string header, payload;
            bool got;
            {
              py::gil_scoped_release release;
              got = e.takeOutgoing(timeout, header, payload);
            }
            if (!got) return py::none();
            return py::make_tuple(py::bytes(header), py::bytes(payload));
          },
          py::arg("timeout"),
          "Next outgoing (header, payload), or None after `timeout` s or once the end failed.")
      .def(
          "deliver",
          [](BridgeEnd& e, const std::string& header, std::string payload) {
            e.deliver(header, std::move(payload));
          },
          py::arg("header"), py::arg("payload"))
      .def("fail", &BridgeEnd::fail, py::arg("reason"))
      .def_property_readonly("failed", &BridgeEnd::failed);

  // What the model adds per step when ranks outnumber their host's cores (shared_cores.h):
  // `pycollective tune` takes it out of the link costs it fits on such a host.
  m.attr("PARKED_PEER_SECONDS") = kParkedPeerSeconds;

  m.def(
      "model_estimates",
      [](const std::vector<int>& hostOf, const CostTuple& local, const CostTuple& remote,
         const CallSpec& spec, int cores) {
        std::string pick;
        auto estimates = modelEstimates(hostOf, processLinkCost(local), linkCost(remote),
                                        spec.args(), cores, &pick);
        py::list rows;
        for (const auto& e : estimates)
          rows.append(py::make_tuple(
              e.algo, e.whyNot.empty() ? py::object(py::float_(e.seconds)) : py::none(), e.whyNot));
        return py::make_tuple(rows, pick);
      },
      py::arg("host_of"), py::arg("local"), py::arg("remote"), py::arg("spec"),
      py::arg("cores") = -1,
      "The cost model alone, no group formed: for ranks on hosts host_of[r] with these (alpha, "
      "beta, gamma) link costs (remote beta: one host's link, shared by its ranks) and `cores` "
      "per host (-1: this host's; 0: a core for every rank), returns ([(algorithm, seconds or "
      "None, why not)], auto's pick).");

  m.def(
      "bridge_link",
      [](int rank, int peer, const std::string& via) {
        auto end = std::make_shared<BridgeEnd>(rank, peer, via);
        return py::make_tuple(LinkHandle{makeBridgeLink(end)}, end);
      },
      py::arg("rank"), py::arg("peer"), py::arg("via"),
      "A link whose frames a pump carries: returns (link, end).");

  py::class_<Work, WorkPtr>(m, "Work")
      .def(
          "wait",
          [](Work& w, double timeout) {
            py::gil_scoped_release release;
            return w.wait(timeout);
          },
          py::arg("timeout") = -1.0,
          "Waits (timeout < 0: until done); False if still running; re-raises the failure.")
      .def("is_completed", &Work::isCompleted)
      .def_property_readonly("seconds", &Work::seconds);

  py::class_<GroupMembers>(m, "Members",
                           "The global ranks of a (sub)group, ascending, and its group id (keeps "
                           "its sequence numbers apart from other groups').")
      .def(py::init([](std::vector<int> ranks, int groupId) {
             return GroupMembers{std::move(ranks), groupId};
           }),
           py::kw_only(), py::arg("ranks"), py::arg("group_id"))
      .def_readonly("ranks", &GroupMembers::ranks)
      .def_readonly("group_id", &GroupMembers::groupId);

  py::class_<PreparedCollective>(
      m, "PreparedCollective",
      "A call prepared once (Communicator.prepare): run() repeats it on the same buffers.")
      .def(
          "run",
          [](PreparedCollective& p) {
            py::gil_scoped_release release;
            p.comm().executor().run([&] { p.run(); });
          },
          "Runs the call now on this thread (after any queued async work); GIL released.")
      .def_property_readonly("algorithm", &PreparedCollective::algorithm);

  py::class_<Communicator>(m, "Communicator")
      .def(py::init([](int rank, int size, std::vector<LinkHandle*> links, std::vector<int> hostOf,
                       double timeout) {
             PC_CHECK(static_cast<int>(links.size()) == size, "expected ", size, " links");
             std::vector<std::unique_ptr<Link>> owned(size);
             for (int p = 0; p < size; ++p) {
               if (p == rank) continue;
               PC_CHECK(links[p] != nullptr && links[p]->link, "no link to rank ", p);
               owned[p] = std::move(links[p]->link);
             }
             return std::make_unique<Communicator>(rank, size, std::move(owned), std::move(hostOf),
                                                   timeout);
           }),
           py::kw_only(), py::arg("rank"), py::arg("size"), py::arg("links"), py::arg("host_of"),
           py::arg("timeout"))
      .def_property_readonly("rank", &Communicator::rank)
      .def(
          "connect_host_segment",
          [](Communicator& c, const std::string& name, std::vector<int> ranks, py::bytes digest,
             size_t slotBytes, double timeout) {
            HostSegmentOptions o;
            o.name = name;
            o.member =
                static_cast<int>(std::find(ranks.begin(), ranks.end(), c.rank()) - ranks.begin());
            o.ranks = std::move(ranks);
            o.worldSize = c.size();
            o.authDigest = digest;
            o.slotBytes = slotBytes;
            o.connectTimeoutSeconds = timeout;
            py::gil_scoped_release release;
            c.setHostSegment(HostSegment::connect(o));
          },
          py::kw_only(), py::arg("name"), py::arg("ranks"), py::arg("digest"),
          py::arg("slot_bytes"), py::arg("timeout"),
          "Creates (lowest rank) or opens the shared-memory segment of this host's ranks "
          "(`ranks`, ascending, this rank among them) and keeps it for small collectives of "
          "exactly those ranks (algo \"slots\"); blocks until every one attached.")
      .def_property_readonly(
          "host_segment",
          [](const Communicator& c) -> py::object {
            const HostSegment* s = c.hostSegment();
            if (s == nullptr) return py::none();
            return py::make_tuple(s->name(), s->ranks(), s->slotBytes());
          },
          "(name, ranks, slot bytes) of the host segment, or None.")
      .def_property_readonly(
          "host_segment_calls",
          [](const Communicator& c) -> uint64_t {
            const HostSegment* s = c.hostSegment();
            return s == nullptr ? 0 : s->calls();
          },
          "Calls this rank made on its host segment so far (0 without one).")
      .def_property_readonly(
          "host_segment_reads_peers",
          [](const Communicator& c) -> py::object {
            const HostSegment* s = c.hostSegment();
            if (s == nullptr) return py::none();
            return py::bool_(s->membersReadEachOther());
          },
          "Whether the host segment's members read each other's buffers directly, as they "
          "agreed when they connected (PYCOLLECTIVE_CROSS_MEMORY); None without a segment.")
      .def_property_readonly(
          "host_segment_streams",
          [](const Communicator& c) -> py::object {
            const HostSegment* s = c.hostSegment();
            if (s == nullptr) return py::none();
            return py::bool_(s->streamsPayloads());
          },
          "Whether the host segment's members now write what the others read past the cache "
          "(a member finds the others' cores far); None without a segment.")
      .def(
          "fix_host_segment_distance",
          [](Communicator& c, double ns) {
            HostSegment* s = c.hostSegment();
            if (s != nullptr) s->fixDistance(ns);
          },
          py::arg("ns"),
          "For tests: this rank's host segment stops timing its waits and takes `ns` for how "
          "far the other ranks' cores are (over 80 ns: far, and every member writes what the "
          "others read past the cache). Call it between collectives; no-op without a segment.")
      .def_property_readonly("size", &Communicator::size)
      .def(
          "set_costs",
          [](Communicator& c, const CostTuple& local, const CostTuple& remote) {
            c.setCosts(processLinkCost(local), linkCost(remote));
          },
          py::arg("local"), py::arg("remote"),
          "(alpha s/message, beta s/byte, gamma s/byte reduced) for same-host links (between "
          "processes: both sides copy) and cross-host links")
      .def(
          "submit",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g, py::handle in,
             py::handle out) {
            CollectiveArgs a = spec.args(dataPointer(in), dataPointer(out));
            Communicator* comm = &c;
            return c.executor().submit([comm, a, algo = spec.algo, g] {
              runCollective(*comm, g.ranks, g.groupId, a, algo);
            });
          },
          py::arg("spec"), py::arg("members"), py::arg("inp"), py::arg("out"),
          "Queues a collective on the group's executor (issue order is run order); returns Work.")
      .def(
          "run",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g, py::handle in,
             py::handle out) {
            CollectiveArgs a = spec.args(dataPointer(in), dataPointer(out));
            py::gil_scoped_release release;
            c.executor().run([&] { runCollective(c, g.ranks, g.groupId, a, spec.algo); });
          },
          py::arg("spec"), py::arg("members"), py::arg("inp"), py::arg("out"),
          "Runs a collective now on this thread (after any queued async work); GIL released.")
      .def(
          "prepare",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g, py::handle in,
             py::handle out) {
            return std::make_unique<PreparedCollective>(
                c, g.ranks, g.groupId, spec.args(dataPointer(in), dataPointer(out)), spec.algo,
                /*keepMeasuring=*/true);
          },
          py::arg("spec"), py::arg("members"), py::arg("inp"), py::arg("out"),
          py::keep_alive<0, 1>(),
          "Checks the call and settles its algorithm (where auto measures calls of its shape, "
          "its runs go on measuring, as plain calls do); the caller keeps inp and out alive "
          "while the PreparedCollective is used.")
      .def(
          "prepare_mapped",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g, py::handle in,
             py::handle out, const std::vector<uintptr_t>& peerIn,
             const std::vector<uintptr_t>& peerOut, uint64_t key) {
            MappedBuffers m;
            m.key = key;
            for (uintptr_t p : peerIn) m.in.push_back(reinterpret_cast<const void*>(p));
            for (uintptr_t p : peerOut) m.out.push_back(reinterpret_cast<void*>(p));
            return std::make_unique<PreparedCollective>(
                c, g.ranks, g.groupId, spec.args(dataPointer(in), dataPointer(out)), std::move(m));
          },
          py::arg("spec"), py::arg("members"), py::arg("inp"), py::arg("out"), py::arg("peer_in"),
          py::arg("peer_out"), py::arg("key"), py::keep_alive<0, 1>(),
          "An allreduce prepared on buffers every group rank mapped: peer_in/peer_out hold each "
          "group rank's input and output at this process's addresses (its own among them), key "
          "is the plan's, the same on every rank. The caller keeps every mapping alive while "
          "the PreparedCollective is used.")
      .def(
          "exchange",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g,
             const std::vector<py::object>& sends, const std::vector<py::object>& recvs,
             bool asynchronous) -> py::object {
            const std::vector<int>& members = g.ranks;
            const int groupId = g.groupId;
            PC_CHECK(isPairwise(spec.kind),
                     "exchange runs alltoall, "
                     "gather, scatter or send/recv, not collective ",
                     static_cast<int>(spec.kind));
            PC_CHECK(sends.size() == members.size() && recvs.size() == members.size(),
                     "exchange needs one send and one receive entry per group rank (",
                     members.size(), "), got ", sends.size(), " and ", recvs.size());
            // The per-peer table lives as long as the call (the async lambda holds it); the
            // arrays themselves are kept alive by the Python caller until the Work completes.
            auto peers = std::make_shared<std::vector<PeerBuffer>>(members.size());
            for (size_t p = 0; p < members.size(); ++p) {
              PeerBuffer& b = (*peers)[p];
              if (!sends[p].is_none()) {
                auto arr = py::reinterpret_borrow<py::array>(sends[p]);
                b.send = arr.data();
                b.sendCount = static_cast<size_t>(arr.size());
              }
              if (!recvs[p].is_none()) {
                auto arr = py::reinterpret_borrow<py::array>(recvs[p]);
                b.recv = arr.mutable_data();
                b.recvCount = static_cast<size_t>(arr.size());
              }
            }
            CollectiveArgs a = spec.args();
            a.peers = peers->data();
            Communicator* comm = &c;
            auto fn = [comm, a, peers, members, groupId] {
              runCollective(*comm, members, groupId, a, "pairwise");
            };
            if (asynchronous) return py::cast(c.executor().submit(fn));
            {
              py::gil_scoped_release release;
              c.executor().run(fn);
            }
            return py::none();
          },
          py::arg("spec"), py::arg("members"), py::kw_only(), py::arg("sends"), py::arg("recvs"),
          py::arg("asynchronous"),
          "A pairwise exchange (alltoall, gather, scatter, send/recv): sends[p] (a contiguous "
          "array or None) goes to group rank p, recvs[p] receives from it. The spec's `count` is "
          "the element count every rank's header carries (the same on all ranks); its algo is "
          "ignored. Returns Work if asynchronous, else None once done.")
      .def(
          "explain",
          [](Communicator& c, const CallSpec& spec, const GroupMembers& g) {
            return explainChoice(Group(c, g.ranks), g.groupId, spec.args());
          },
          py::arg("spec"), py::arg("members"),
          "What algo=\"auto\" would run for this call in the group `members`.")
      .def(
          "abort", [](Communicator& c, const std::string& reason) { c.abort(reason); },
          py::arg("reason"), "Fails every pending and future collective; peers stop waiting.")
      .def(
          "set_tuned",
          [](Communicator& c, const TunedRows& table) { c.setTuned(tunedTable(table)); },
          py::arg("table"), "[(collective kind, max bytes, algorithm)] sorted by max bytes")
      .def_property_readonly(
          "auto_trial_calls",
          [](const Communicator& c) { return AgreedChoices::trialCalls(c.autoTrials()); },
          "The most calls of one shape algo=\"auto\" spends on its first trial where it measures "
          "(each candidate's first calls, which do not count, included); 0 where it does not "
          "(PYCOLLECTIVE_AUTO_TRIALS=0).")
      .def_property_readonly("aborted", &Communicator::aborted)
      .def_property_readonly("abort_reason", &Communicator::abortReason);
}

}  // namespace bindings
}  // namespace pycollective

// LocalGroup: n replicas in this process. Python passes one pointer pair per replica.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "bindings/bindings.h"
#include "core/error.h"
#include "local/local_group.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {
namespace {

struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteRange& o) const {
    return begin < end && o.begin < o.end && begin < o.end && o.begin < end;
  }
};

ByteRange bytesOf(const py::handle& array) {
  if (array.is_none()) return {};
  auto a = py::reinterpret_borrow<py::array>(array);
  auto begin = reinterpret_cast<uintptr_t>(a.data());
  return {begin, begin + static_cast<uintptr_t>(a.nbytes())};
}

// The replicas run at the same time, so memory one of them writes (its output, or its input in
// place) must be no other replica's input or output: with the same array passed for every
// replica in place, ring summed 4x instead of 3x for 3 replicas while `inline` summed 3x.
void checkReplicasApart(const py::list& ins, const py::list& outs) {
  const size_t n = ins.size();
  std::vector<ByteRange> in(n), out(n);
  for (size_t r = 0; r < n; ++r) {
    in[r] = bytesOf(ins[r]);
    out[r] = bytesOf(outs[r]);
  }
  for (size_t r = 0; r < n; ++r) {
    for (size_t s = 0; s < n; ++s) {
      if (s == r) continue;
      if (s > r && out[r].overlaps(out[s]))
        throw InvalidArgument(makeMessage(
            "replica ", r, " and replica ", s,
            " write their results into overlapping memory (the same array passed for both?); "
            "the replicas run at the same time: give each its own array"));
      if (out[r].overlaps(in[s]))
        throw InvalidArgument(makeMessage(
            "replica ", r, " writes its result into memory that replica ", s,
            " reads as its input (the same array passed for both?); the replicas run at the "
            "same time: give each its own array"));
    }
  }
}

}  // namespace

void bindLocal(py::module_& m) {
  py::class_<LocalGroup>(m, "LocalGroup")
      .def(py::init<int, double, int>(), py::kw_only(), py::arg("size"), py::arg("timeout"),
           py::arg("group_size") = 0)
      .def(
          py::init([](int worker, int numWorkers, const std::vector<std::vector<py::object>>& links,
                      std::vector<int> hostOfWorker, double timeout) {
            // py::object entries: None (this worker) does not convert inside nested lists.
            std::vector<std::vector<std::unique_ptr<Link>>> owned(links.size());
            for (size_t l = 0; l < links.size(); ++l)
              for (const py::object& h : links[l])
                owned[l].push_back(h.is_none() ? nullptr : std::move(h.cast<LinkHandle&>().link));
            return std::make_unique<LocalGroup>(worker, numWorkers, std::move(owned), hostOfWorker,
                                                timeout);
          }),
          py::kw_only(), py::arg("worker"), py::arg("num_workers"), py::arg("links"),
          py::arg("host_of_worker"), py::arg("timeout"),
          "This process's replicas in a group across processes: links[l][w] joins local "
          "replica l to replica l of worker w (None at this worker). Runs hierarchical "
          "all-reduce only.")
      .def_property_readonly("size", &LocalGroup::size)
      .def_property_readonly("num_workers", &LocalGroup::numWorkers)
      .def_property_readonly("auto_trial_calls", &LocalGroup::autoTrialCalls,
                             "The most calls of one shape algo='auto' times before it settles.")
      .def(
          "abort", [](LocalGroup& g, const std::string& reason) { g.abort(reason); },
          py::arg("reason"), "Fails every pending and future collective; peers stop waiting.")
      .def(
          "run",
          [](LocalGroup& g, const CallSpec& spec, const py::list& ins, const py::list& outs) {
            PC_CHECK(static_cast<int>(ins.size()) == g.size() &&
                         static_cast<int>(outs.size()) == g.size(),
                     "expected ", g.size(), " buffers per side");
            checkReplicasApart(ins, outs);
            std::vector<CollectiveArgs> args;
            for (int r = 0; r < g.size(); ++r)
              args.push_back(spec.args(dataPointer(ins[r]), dataPointer(outs[r])));
            py::gil_scoped_release release;
            g.run(args, spec.algo);
          },
          py::arg("spec"), py::kw_only(), py::arg("ins"), py::arg("outs"),
          "Runs the call on every replica at once: ins[r]/outs[r] are replica r's arrays.")
      .def(
          "run_device",
          [](LocalGroup& g, const CallSpec& spec, const std::vector<uintptr_t>& ins,
             const std::vector<uintptr_t>& outs, const std::vector<int>& devices,
             const std::vector<uintptr_t>& streams) {
            const size_t n = static_cast<size_t>(g.size());
            PC_CHECK(
                ins.size() == n && outs.size() == n && devices.size() == n && streams.size() == n,
                "expected ", g.size(), " pointers, devices and streams per side");
            std::vector<CollectiveArgs> args;
            for (size_t r = 0; r < n; ++r) {
              PC_CHECK(devices[r] >= 0, "replica ", r, ": device buffers need a device >= 0");
              CollectiveArgs a = spec.args(ins[r], outs[r]);
              a.device = devices[r];
              a.stream = reinterpret_cast<void*>(streams[r]);
              args.push_back(a);
            }
            py::gil_scoped_release release;
            g.run(args, spec.algo);
          },
          py::arg("spec"), py::kw_only(), py::arg("ins"), py::arg("outs"), py::arg("devices"),
          py::arg("streams"),
          "Like run, on device pointers (0 for none): replica r's buffers live on devices[r] "
          "and are ordered on streams[r]. Returns when every replica's result is complete.")
      .def(
          "set_costs",
          [](LocalGroup& g, const CostTuple& cost) {
            for (int r = 0; r < g.size(); ++r)
              g.communicator(r).setCosts(linkCost(cost), linkCost(cost));
          },
          py::arg("cost"))
      .def(
          "set_tuned",
          [](LocalGroup& g, const TunedRows& table) {
            for (int r = 0; r < g.size(); ++r) g.communicator(r).setTuned(tunedTable(table));
          },
          py::arg("table"))
      .def(
          "explain", [](LocalGroup& g, const CallSpec& spec) { return g.explain(spec.args()); },
          py::arg("spec"), "What algo=\"auto\" would run for this call.");
}

}  // namespace bindings
}  // namespace pycollective

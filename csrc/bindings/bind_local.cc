// LocalGroup: n replicas in this process. Python passes one pointer pair per replica.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "core/error.h"
#include "local/local_group.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

void bindLocal(py::module_& m) {
  py::class_<LocalGroup>(m, "LocalGroup")
      .def(py::init<int, double, int>(), py::arg("size"), py::arg("timeout"),
           py::arg("group_size") = 0)
      .def_property_readonly("size", &LocalGroup::size)
      .def(
          "run",
          [](LocalGroup& g, int kind, const py::list& ins, const py::list& outs, size_t count,
             int dtype, int op, int root, const std::string& algo, uint32_t shapeHash,
             size_t segmentBytes, double timeout) {
            PC_CHECK(static_cast<int>(ins.size()) == g.size() &&
                         static_cast<int>(outs.size()) == g.size(),
                     "expected ", g.size(), " buffers per side");
            std::vector<CollectiveArgs> args;
            for (int r = 0; r < g.size(); ++r)
              args.push_back(makeArgs(kind, dataPointer(ins[r]), dataPointer(outs[r]), count, dtype,
                                      op, root, shapeHash, segmentBytes, timeout));
            py::gil_scoped_release release;
            g.run(args, algo);
          },
          py::arg("kind"), py::arg("ins"), py::arg("outs"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("root"), py::arg("algo"), py::arg("shape_hash"),
          py::arg("segment_bytes"), py::arg("timeout"))
      .def(
          "run_device",
          [](LocalGroup& g, int kind, const std::vector<uintptr_t>& ins,
             const std::vector<uintptr_t>& outs, size_t count, int dtype, int op, int root,
             const std::string& algo, uint32_t shapeHash, size_t segmentBytes, double timeout,
             const std::vector<int>& devices, const std::vector<uintptr_t>& streams) {
            const size_t n = static_cast<size_t>(g.size());
            PC_CHECK(
                ins.size() == n && outs.size() == n && devices.size() == n && streams.size() == n,
                "expected ", g.size(), " pointers, devices and streams per side");
            std::vector<CollectiveArgs> args;
            for (size_t r = 0; r < n; ++r) {
              PC_CHECK(devices[r] >= 0, "replica ", r, ": device buffers need a device >= 0");
              CollectiveArgs a = makeArgs(kind, ins[r], outs[r], count, dtype, op, root, shapeHash,
                                          segmentBytes, timeout);
              a.device = devices[r];
              a.stream = reinterpret_cast<void*>(streams[r]);
              args.push_back(a);
            }
            py::gil_scoped_release release;
            g.run(args, algo);
          },
          py::arg("kind"), py::arg("ins"), py::arg("outs"), py::arg("count"), py::arg("dtype"),
          py::arg("op"), py::arg("root"), py::arg("algo"), py::arg("shape_hash"),
          py::arg("segment_bytes"), py::arg("timeout"), py::arg("devices"), py::arg("streams"),
          "Like run, on device pointers (0 for none): replica r's buffers live on devices[r] "
          "and are ordered on streams[r]. Returns when every replica's result is complete.")
      .def(
          "set_costs",
          [](LocalGroup& g, const CostTuple& cost) {
            for (int r = 0; r < g.size(); ++r)
              g.communicator(r).localCost = g.communicator(r).remoteCost = linkCost(cost);
          },
          py::arg("cost"))
      .def(
          "set_tuned",
          [](LocalGroup& g, const TunedRows& table) {
            for (int r = 0; r < g.size(); ++r) g.communicator(r).tuned = tunedTable(table);
          },
          py::arg("table"))
      .def(
          "explain",
          [](LocalGroup& g, int kind, size_t count, int dtype, int op) {
            return g.explain(makeArgs(kind, 0, 0, count, dtype, op, 0, 0, 0, 0));
          },
          py::arg("kind"), py::arg("count"), py::arg("dtype"), py::arg("op"));
}

}  // namespace bindings
}  // namespace pycollective

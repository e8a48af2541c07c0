// CallSpec: what Python says about one collective call, as one object built with keywords
// instead of a dozen positional integers. Checked once when built, so a prepared call reuses it.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "core/error.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

CallSpec makeSpec(int kind, size_t count, int dtype, int op, int root, std::string algo,
                  uint32_t shapeHash, size_t segmentBytes, double timeout, int wire) {
  // The fused optimizer step has its own entry point (allreduce_update) with its own arguments.
  PC_CHECK(kind >= 0 && kind <= static_cast<int>(CollectiveKind::kSendRecv) &&
               kind != static_cast<int>(CollectiveKind::kAllreduceUpdate),
           "unknown collective ", kind);
  PC_CHECK(wire >= 0 && wire < kNumWireFormats, "unknown wire format code ", wire);
  PC_CHECK(timeout >= 0, "timeout must be >= 0 seconds (0: the group's), got ", timeout);
  CallSpec s;
  s.kind = static_cast<CollectiveKind>(kind);
  s.count = count;
  s.dtype = dtypeOf(dtype);
  s.op = opOf(op);
  s.root = root;
  s.algo = std::move(algo);
  s.shapeHash = shapeHash;
  s.segmentBytes = segmentBytes;
  s.timeout = timeout;
  s.wire = static_cast<WireFormat>(wire);
  return s;
}

}  // namespace

CollectiveArgs CallSpec::args(uintptr_t in, uintptr_t out) const {
  CollectiveArgs a;
  a.kind = kind;
  a.in = reinterpret_cast<const void*>(in);
  a.out = reinterpret_cast<void*>(out);
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.root = root;
  a.shapeHash = shapeHash;
  a.segmentBytes = segmentBytes;
  a.timeoutSeconds = timeout;
  a.wire = wire;
  return a;
}

void bindCallSpec(py::module_& m) {
  py::class_<CallSpec>(m, "CallSpec",
                       "One collective call: kind, element count and dtype (codes from "
                       "enum_codes()), reduce op, root, algorithm, the shape's hash (mismatch "
                       "detection), pipeline segment bytes (0: the default), timeout in "
                       "seconds (0: the group's) and wire format (0: native, 1: bf16, 2: fp16 "
                       "on network links). Checked when built; reusable.")
      .def(py::init(&makeSpec), py::kw_only(), py::arg("kind"), py::arg("count"), py::arg("dtype"),
           py::arg("op") = 0, py::arg("root") = 0, py::arg("algo") = "auto",
           py::arg("shape_hash") = 0, py::arg("segment_bytes") = 0, py::arg("timeout") = 0.0,
           py::arg("wire") = 0)
      .def_property_readonly("kind", [](const CallSpec& s) { return static_cast<int>(s.kind); })
      .def_readonly("count", &CallSpec::count)
      .def_property_readonly("dtype", [](const CallSpec& s) { return static_cast<int>(s.dtype); })
      .def_property_readonly("op", [](const CallSpec& s) { return static_cast<int>(s.op); })
      .def_readonly("root", &CallSpec::root)
      .def_readonly("algo", &CallSpec::algo)
      .def_readonly("shape_hash", &CallSpec::shapeHash)
      .def_readonly("segment_bytes", &CallSpec::segmentBytes)
      .def_readonly("timeout", &CallSpec::timeout)
      .def_property_readonly("wire", [](const CallSpec& s) { return static_cast<int>(s.wire); })
      .def("__repr__", [](const CallSpec& s) {
        return "CallSpec(kind=" + std::to_string(static_cast<int>(s.kind)) +
               ", count=" + std::to_string(s.count) +
               ", dtype=" + std::to_string(static_cast<int>(s.dtype)) +
               ", op=" + std::to_string(static_cast<int>(s.op)) +
               ", root=" + std::to_string(s.root) + ", algo='" + s.algo + "')";
      });
  m.def(
      "round_to_wire",
      [](py::handle array, size_t count, int wire) {
        PC_CHECK(wire > 0 && wire < kNumWireFormats,
                 "round_to_wire needs a 16-bit wire format "
                 "(1: bf16, 2: fp16), got ",
                 wire);
        auto* data = reinterpret_cast<float*>(dataPointer(array));
        py::gil_scoped_release release;
        roundToWire(static_cast<WireFormat>(wire), data, count);
      },
      py::arg("array"), py::arg("count"), py::arg("wire"),
      "Rounds `count` float32 values of a contiguous numpy array in place to what a compressed "
      "call sends for them (wire: 1 bf16, 2 fp16): the kernel the collectives use.");
}

}  // namespace bindings
}  // namespace pycollective

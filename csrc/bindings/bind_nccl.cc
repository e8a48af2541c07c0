// The NCCL loader and NcclComm (pycollective/nccl.py wraps them). Built on every Linux build:
// without libnccl every use raises NcclUnavailable (listing the paths tried); without CUDA,
// creating a communicator does. Raw pointers and streams are plain integers here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings/bindings.h"
#include "core/error.h"
#include "core/knobs.h"
#include "cuda/nccl_comm.h"
#include "cuda/nccl_loader.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

using WheelDirs = std::vector<std::pair<std::string, std::string>>;

py::dict describeLibrary(const nccl::Library& lib) {
  py::dict d;
  d["version"] = lib.versionString();
  d["version_code"] = lib.version();
  d["path"] = lib.path();
  d["origin"] = lib.origin();
  return d;
}

void* ptr(uintptr_t p) {
  return reinterpret_cast<void*>(p);
}

nccl::UniqueId idFrom(const py::bytes& b) {
  std::string s = b;
  PC_CHECK(s.size() == nccl::kUniqueIdBytes, "an NCCL unique id has ", nccl::kUniqueIdBytes,
           " bytes, got ", s.size());
  nccl::UniqueId id;
  std::memcpy(id.internal, s.data(), nccl::kUniqueIdBytes);
  return id;
}

}  // namespace

void bindNccl(py::module_& m) {
  m.def(
      "nccl_set_wheel_dirs", [](WheelDirs dirs) { nccl::setWheelDirs(std::move(dirs)); },
      py::arg("dirs"), "(folder, origin) pairs of installed nvidia-nccl-cu* wheels.");
  m.def(
      "nccl_search_order",
      [](const WheelDirs& dirs) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& c : nccl::Library::searchOrder(knobs::text(knobs::kNcclLibrary), dirs))
          out.emplace_back(c.path, c.origin);
        return out;
      },
      py::arg("wheel_dirs"), "The (path, origin) candidates, in the order they are tried.");
  m.def(
      "nccl_probe",
      [](const WheelDirs& dirs) {
        // A private load, never the process's library: tests probe fake paths with it.
        auto lib =
            nccl::Library::open(nccl::Library::searchOrder(knobs::text(knobs::kNcclLibrary), dirs));
        return describeLibrary(*lib);
      },
      py::arg("wheel_dirs"),
      "Tries the search order once without keeping the library; raises NcclUnavailable.");
  m.def(
      "nccl_library", [] { return describeLibrary(nccl::library()); },
      "Loads the process's NCCL (first call) and describes it; raises NcclUnavailable.");
  m.def("nccl_available", &nccl::available);
  m.def("nccl_unique_id", [] {
    nccl::UniqueId id;
    {
      py::gil_scoped_release release;
      id = NcclComm::uniqueId();
    }
    return py::bytes(id.internal, nccl::kUniqueIdBytes);
  });
  m.def("nccl_group_start", [] {
    py::gil_scoped_release release;
    NcclComm::groupStart();
  });
  m.def("nccl_group_end", [] {
    py::gil_scoped_release release;
    NcclComm::groupEnd();
  });

  py::class_<NcclComm>(m, "NcclComm")
      .def(py::init([](int nranks, const py::bytes& id, int rank, int device, double timeout) {
             nccl::UniqueId uid = idFrom(id);
             py::gil_scoped_release release;
             return std::make_unique<NcclComm>(nranks, uid, rank, device, timeout);
           }),
           py::kw_only(), py::arg("nranks"), py::arg("unique_id"), py::arg("rank"),
           py::arg("device"), py::arg("timeout"))
      .def_static(
          "init_all",
          [](const std::vector<int>& devices, double timeout) {
            std::vector<std::unique_ptr<NcclComm>> comms;
            {
              py::gil_scoped_release release;
              comms = NcclComm::initAll(devices, timeout);
            }
            py::list out;
            for (auto& c : comms)
              out.append(py::cast(c.release(), py::return_value_policy::take_ownership));
            return out;
          },
          py::arg("devices"), py::arg("timeout"))
      .def_property_readonly("rank", &NcclComm::rank)
      .def_property_readonly("size", &NcclComm::size)
      .def_property_readonly("device", &NcclComm::device)
      .def_property("timeout", &NcclComm::timeoutSeconds, &NcclComm::setTimeoutSeconds)
      .def(
          "allreduce",
          [](NcclComm& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
             uintptr_t stream) {
            const DType t = dtypeOf(dtype);
            const ReduceOp o = opOf(op);
            py::gil_scoped_release release;
            c.allreduce(ptr(send), ptr(recv), count, t, o, ptr(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream"))
      .def(
          "reduce_scatter",
          [](NcclComm& c, uintptr_t send, uintptr_t recv, size_t recvCount, int dtype, int op,
             uintptr_t stream) {
            const DType t = dtypeOf(dtype);
            const ReduceOp o = opOf(op);
            py::gil_scoped_release release;
            c.reduceScatter(ptr(send), ptr(recv), recvCount, t, o, ptr(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("recv_count"), py::arg("dtype"), py::arg("op"),
          py::arg("stream"))
      .def(
          "allgather",
          [](NcclComm& c, uintptr_t send, uintptr_t recv, size_t sendCount, int dtype,
             uintptr_t stream) {
            const DType t = dtypeOf(dtype);
            py::gil_scoped_release release;
            c.allgather(ptr(send), ptr(recv), sendCount, t, ptr(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("send_count"), py::arg("dtype"),
          py::arg("stream"))
      .def(
          "broadcast",
          [](NcclComm& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root,
             uintptr_t stream) {
            const DType t = dtypeOf(dtype);
            py::gil_scoped_release release;
            c.broadcast(ptr(send), ptr(recv), count, t, root, ptr(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("root"),
          py::arg("stream"))
      .def(
          "reduce",
          [](NcclComm& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root,
             uintptr_t stream) {
            const DType t = dtypeOf(dtype);
            const ReduceOp o = opOf(op);
            py::gil_scoped_release release;
            c.reduce(ptr(send), ptr(recv), count, t, o, root, ptr(stream));
          },
          py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("root"), py::arg("stream"))
      .def(
          "synchronize",
          [](NcclComm& c, double timeout) {
            py::gil_scoped_release release;
            return c.synchronize(timeout);
          },
          py::arg("timeout"))
      .def("is_completed", &NcclComm::isCompleted)
      .def("async_error", &NcclComm::asyncError, py::call_guard<py::gil_scoped_release>())
      .def("abort", &NcclComm::abort, py::arg("reason"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("aborted", &NcclComm::aborted)
      .def_property_readonly("failure", &NcclComm::failure)
      .def("__repr__", &NcclComm::who);
}

}  // namespace bindings
}  // namespace pycollective

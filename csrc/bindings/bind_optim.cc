// Fused optimizer updates on replicated state (optim/replicated_update.h). Python
// (pycollective/fused_update.py) checks shapes, dtypes and contiguity and passes numpy arrays.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include "bindings/bindings.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "optim/allreduce_update.h"
#include "optim/replicated_update.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

std::vector<void*> pointers(const py::list& arrays) {
  std::vector<void*> out;
  for (const py::handle& a : arrays) out.push_back(reinterpret_cast<void*>(dataPointer(a)));
  return out;
}

using HyperTuple = std::tuple<double, double, double, double, double, double>;
using TensorTuple = std::tuple<size_t, py::list, py::list, std::vector<py::list>>;

UpdateRule ruleOf(int rule) {
  PC_CHECK(rule >= 0 && rule <= static_cast<int>(UpdateRule::kAdam), "unknown update rule ", rule);
  return static_cast<UpdateRule>(rule);
}

UpdateHyper hyperOf(const HyperTuple& h) {
  UpdateHyper hyper;
  std::tie(hyper.lr, hyper.momentum, hyper.beta1, hyper.beta2, hyper.epsilon, hyper.gradScale) = h;
  return hyper;
}

ReplicatedTensor tensorOf(const TensorTuple& item) {
  const auto& [count, grads, copies, slots] = item;
  ReplicatedTensor t;
  t.count = count;
  for (void* g : pointers(grads)) t.grads.push_back(g);
  t.copies = pointers(copies);
  for (const py::list& s : slots) t.slots.push_back(pointers(s));
  return t;
}

}  // namespace

void bindOptim(py::module_& m) {
  m.def(
      "apply_replicated_update",
      [](int rule, int dtype, const HyperTuple& h, const std::vector<TensorTuple>& items) {
        std::vector<ReplicatedTensor> tensors;
        for (const TensorTuple& item : items) tensors.push_back(tensorOf(item));
        const UpdateRule r = ruleOf(rule);
        const DType d = dtypeOf(dtype);
        py::gil_scoped_release release;
        applyReplicatedUpdate(r, d, hyperOf(h), tensors);
      },
      py::kw_only(), py::arg("rule"), py::arg("dtype"), py::arg("hyper"), py::arg("tensors"),
      "Fused reduce-and-update of replicated optimizer state. hyper = (lr, momentum, beta_1, "
      "beta_2, epsilon, grad_scale); tensors = [(count, grads, copies, [slot copies, ...])]. "
      "GIL released.");
  m.def(
      "allreduce_update",
      [](Communicator& comm, int rule, int dtype, const HyperTuple& h,
         const std::vector<TensorTuple>& items, const std::vector<uint32_t>& shapeHashes,
         double timeout, const std::vector<int>& members, int groupId, bool shardedSlots) {
        std::vector<ReplicatedTensor> tensors;
        for (const TensorTuple& item : items) tensors.push_back(tensorOf(item));
        const UpdateRule r = ruleOf(rule);
        const DType d = dtypeOf(dtype);
        const UpdateHyper hyper = hyperOf(h);
        py::gil_scoped_release release;
        comm.executor().run([&] {
          allreduceUpdate(comm, members, groupId, r, d, hyper, tensors, shapeHashes, timeout,
                          shardedSlots);
        });
      },
      py::kw_only(), py::arg("comm"), py::arg("rule"), py::arg("dtype"), py::arg("hyper"),
      py::arg("tensors"), py::arg("shape_hashes"), py::arg("timeout"), py::arg("members"),
      py::arg("group_id"), py::arg("sharded_slots") = false,
      "Optimizer steps across a process group, each fused into the all-reduce of its gradient "
      "(optim/allreduce_update.h), all tensors as one pipelined ring; tensors = [(count, [this "
      "rank's gradient], copies, [slot copies, ...])]. sharded_slots: each slot is [this rank's "
      "chunk] (ZeRO-1) and only the variable is allgathered. Runs after any queued async work; "
      "GIL released.");
}

}  // namespace bindings
}  // namespace pycollective

// Fused optimizer updates on replicated state (optim/replicated_update.h). Python
// (pycollective/fused_update.py) checks shapes, dtypes and contiguity and passes numpy arrays.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include "bindings/bindings.h"
#include "core/error.h"
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

}  // namespace

void bindOptim(py::module_& m) {
  m.def(
      "apply_replicated_update",
      [](int rule, int dtype, const std::tuple<double, double, double, double, double, double>& h,
         const std::vector<std::tuple<size_t, py::list, py::list, std::vector<py::list>>>& items) {
        PC_CHECK(rule >= 0 && rule <= static_cast<int>(UpdateRule::kAdam), "unknown update rule ",
                 rule);
        PC_CHECK(dtype >= 0 && dtype < kNumDTypes, "unknown dtype code ", dtype);
        UpdateHyper hyper;
        std::tie(hyper.lr, hyper.momentum, hyper.beta1, hyper.beta2, hyper.epsilon,
                 hyper.gradScale) = h;
        std::vector<ReplicatedTensor> tensors;
        for (const auto& [count, grads, copies, slots] : items) {
          ReplicatedTensor t;
          t.count = count;
          for (void* g : pointers(grads)) t.grads.push_back(g);
          t.copies = pointers(copies);
          for (const py::list& s : slots) t.slots.push_back(pointers(s));
          tensors.push_back(std::move(t));
        }
        py::gil_scoped_release release;
        applyReplicatedUpdate(static_cast<UpdateRule>(rule), static_cast<DType>(dtype), hyper,
                              tensors);
      },
      py::arg("rule"), py::arg("dtype"), py::arg("hyper"), py::arg("tensors"),
      "Fused reduce-and-update of replicated optimizer state. hyper = (lr, momentum, beta_1, "
      "beta_2, epsilon, grad_scale); tensors = [(count, grads, copies, [slot copies, ...])]. "
      "GIL released.");
}

}  // namespace bindings
}  // namespace pycollective

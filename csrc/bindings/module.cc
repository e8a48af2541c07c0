// pycollective._C: a thin layer. Python validates and adapts tensors (pycollective/tensors.py)
// and passes raw pointers here; every native call releases the GIL.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "pycollective native core";
  pycollective::bindings::bindErrors(m);
  pycollective::bindings::bindInfo(m);
  pycollective::bindings::bindCallSpec(m);
  pycollective::bindings::bindPool(m);
  pycollective::bindings::bindLocal(m);
  pycollective::bindings::bindGroup(m);
  pycollective::bindings::bindPreparedCall(m);
  pycollective::bindings::bindKnownCalls(m);
  pycollective::bindings::bindNccl(m);
  pycollective::bindings::bindOptim(m);
}

#pragma once
#include <pybind11/pybind11.h>

#include "algorithms/algorithm.h"

namespace pycollective {
namespace bindings {

void bindErrors(pybind11::module_& m);
void bindInfo(pybind11::module_& m);
void bindLocal(pybind11::module_& m);
void bindGroup(pybind11::module_& m);

// Builds the native call description from the integer codes Python passes.
CollectiveArgs makeArgs(int kind, uintptr_t in, uintptr_t out, size_t count, int dtype, int op,
                        int root, uint32_t shapeHash, size_t segmentBytes, double timeout);

// The data pointer of a numpy array (pycollective/_calls.py made it contiguous), or 0 for None.
// Read with the C API: much cheaper than __array_interface__ on every call.
uintptr_t dataPointer(const pybind11::handle& array);

}  // namespace bindings
}  // namespace pycollective

#pragma once
#include <pybind11/pybind11.h>

#include <string>
#include <tuple>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/communicator.h"

namespace pycollective {
namespace bindings {

void bindErrors(pybind11::module_& m);
void bindInfo(pybind11::module_& m);
void bindLocal(pybind11::module_& m);
void bindGroup(pybind11::module_& m);
void bindNccl(pybind11::module_& m);
void bindOptim(pybind11::module_& m);

// Builds the native call description from the integer codes Python passes.
CollectiveArgs makeArgs(int kind, uintptr_t in, uintptr_t out, size_t count, int dtype, int op,
                        int root, uint32_t shapeHash, size_t segmentBytes, double timeout);

// The data pointer of a numpy array (pycollective/_calls.py made it contiguous), or 0 for None.
// Read with the C API: much cheaper than __array_interface__ on every call.
uintptr_t dataPointer(const pybind11::handle& array);

// The cost model and the tuned table as Python passes them (pycollective/tuning.py).
using CostTuple = std::tuple<double, double, double>;
using TunedRows = std::vector<std::tuple<int, size_t, std::string>>;
LinkCost linkCost(const CostTuple& t);
std::vector<TunedChoice> tunedTable(const TunedRows& rows);

}  // namespace bindings
}  // namespace pycollective

#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace pycollective {
namespace bindings {

void bindErrors(pybind11::module_& m);
void bindInfo(pybind11::module_& m);
void bindLocal(pybind11::module_& m);
void bindGroup(pybind11::module_& m);
void bindNccl(pybind11::module_& m);
void bindOptim(pybind11::module_& m);

void bindCallSpec(pybind11::module_& m);
void bindKnownCalls(pybind11::module_& m);
void bindPool(pybind11::module_& m);
void bindPreparedCall(pybind11::module_& m);

// Sets the Python error for a C++ exception of core/error.h (pycollective.errors' classes, the
// translator bindErrors registers); rethrows any other exception. For code that handles a
// failure as Python sees it before it leaves C++ (bind_prepared_call.cc).
void setPythonError(std::exception_ptr p);
// pycollective.errors.CollectiveError.
const pybind11::object& collectiveErrorClass();

// A new result array the caller owns: from OutputPool::kMinPooledBytes up its memory comes from
// the output pool (core/output_pool.h) and returns there when the array goes; smaller ones are
// ordinary numpy allocations. C-contiguous.
pybind11::array newResultArray(const pybind11::dtype& dtype,
                               const std::vector<pybind11::ssize_t>& shape);

// The dtype and reduce-op codes Python passes (pycollective._C.enum_codes()), checked.
inline DType dtypeOf(int code) {
  PC_CHECK(code >= 0 && code < kNumDTypes, "unknown dtype code ", code);
  return static_cast<DType>(code);
}
inline ReduceOp opOf(int code) {
  PC_CHECK(code >= 0 && code < kNumReduceOps, "unknown op code ", code);
  return static_cast<ReduceOp>(code);
}

// The ranks of a (sub)group and the id that keeps its sequence numbers apart
// (pycollective._C.Members): made once per ProcessGroup, passed with every call.
struct GroupMembers {
  std::vector<int> ranks;  // global ranks, ascending, including this one
  int groupId = 0;
};

// A link on its way into a Communicator or LocalGroup (which takes ownership).
struct LinkHandle {
  std::unique_ptr<Link> link;
  std::string describe() const { return link ? link->describe() : "<moved into a group>"; }
};

// One collective call as Python describes it (pycollective._C.CallSpec): built with keywords,
// checked once when built, and reusable across calls; the buffers are passed per call.
struct CallSpec {
  CollectiveKind kind = CollectiveKind::kAllreduce;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::string algo = "auto";
  uint32_t shapeHash = 0;
  size_t segmentBytes = 0;                // 0 = PYCOLLECTIVE_SEGMENT_BYTES
  double timeout = 0;                     // seconds; 0 = the communicator's timeout
  WireFormat wire = WireFormat::kNative;  // compress=: how values cross network links

  // The native call on these buffers (0 for none).
  CollectiveArgs args(uintptr_t in = 0, uintptr_t out = 0) const;
};

// The data pointer of a numpy array (pycollective/_calls.py made it contiguous), or 0 for None.
// Read with the C API: much cheaper than __array_interface__ on every call.
uintptr_t dataPointer(const pybind11::handle& array);

// The cost model and the tuned table as Python passes them (pycollective/tuning.py).
using CostTuple = std::tuple<double, double, double>;
using TunedRows = std::vector<std::tuple<int, size_t, std::string>>;
LinkCost linkCost(const CostTuple& t);
// The same for links between processes of one host, whose sender and receiver both copy
// (LinkCost::bothSidesCopy).
LinkCost processLinkCost(const CostTuple& t);
std::vector<TunedChoice> tunedTable(const TunedRows& rows);

}  // namespace bindings
}  // namespace pycollective

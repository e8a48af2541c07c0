// Calls a process group has already checked, looked up and run without leaving C++.
//
// A loop of `allreduce(x, out=y)` on small numpy arrays spends most of its time in Python (and
// larger ones enough to notice, with ranks sharing cores: pycollective/_call_memo.py): the
// full path adapts and checks the arrays, builds a CallSpec and passes it with the group's
// members, every call (on one rank, an 8-byte call took 6.4 us so, 1.9 us remembered, 0.6 us
// prepared when this was written; 0.70 and 0.30 us on a later machine and build; with 4 ranks on
// 2 cores every rank's Python also waits for the core its peers hold).
// pycollective/_call_memo.py keeps, per combination of the call's scalar arguments, one
// KnownLayouts: the array layouts (dtype, shape, strides) that went through every check with that
// combination, each with its CallSpec. Dtypes are compared as numpy compares them (a byte-swapped
// '>f4' is not '<f4'). A call whose arrays have one of those layouts needs no further check (each
// check of the full path follows from the layout) except that an array written to must still be
// writable, checked here on every call; its data pointers are read here, every call.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "algorithms/registry.h"
#include "bindings/bindings.h"
#include "core/error.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

// The exact numpy array type: subclasses (np.matrix, masked arrays) go through the full path.
bool isPlainArray(const py::handle& h) {
  return Py_TYPE(h.ptr()) ==
         reinterpret_cast<PyTypeObject*>(py::detail::npy_api::get().PyArray_Type_);
}

// What the full path's checks depend on in an array.
struct Layout {
  py::object dtype;  // the descriptor the checked array had
  std::vector<py::ssize_t> shape, strides;

  static PyObject* descrOf(const py::array& a) { return py::detail::array_proxy(a.ptr())->descr; }
  static Layout of(const py::array& a) {
    Layout l;
    l.dtype = py::reinterpret_borrow<py::object>(descrOf(a));
    l.shape.assign(a.shape(), a.shape() + a.ndim());
    l.strides.assign(a.strides(), a.strides() + a.ndim());
    return l;
  }
  // The same dtype as numpy compares them (the full path looks dtypes up by equality): not
  // just the type number, which '<f4' and '>f4' share.
  bool sameType(const py::array& a) const {
    PyObject* d = descrOf(a);
    return d == dtype.ptr() || py::detail::npy_api::get().PyArray_EquivTypes_(d, dtype.ptr());
  }
  bool matches(const py::array& a) const {
    const auto n = static_cast<size_t>(a.ndim());
    if (n != shape.size() || !sameType(a)) return false;
    return n == 0 || (std::memcmp(a.shape(), shape.data(), n * sizeof(py::ssize_t)) == 0 &&
                      std::memcmp(a.strides(), strides.data(), n * sizeof(py::ssize_t)) == 0);
  }
};

// Where a known call writes its result (kNone: nowhere, as reduce at a rank other than root).
enum class Writes { kOut, kInplace, kNew, kNone };

struct Known {
  Layout in;
  bool hasOut = false;
  Layout out;
  Writes writes = Writes::kOut;
  CallSpec spec;
  py::dtype resultType;  // kNew: the result's dtype and shape
  std::vector<py::ssize_t> resultShape;
  // The call with its algorithm settled, as a prepared call has it; made again when auto's
  // inputs change (the communicator's choice epoch), as a plain call would choose again.
  std::shared_ptr<PreparedCollective> plan;
  uint64_t epoch = 0;
};

// Layouts remembered per combination of scalar arguments; the oldest is dropped first.
constexpr size_t kLayoutsPerCall = 16;

class KnownLayouts {
 public:
  explicit KnownLayouts(const GroupMembers& members) : members_(members) {}

  // The call's result when (x, out) has a known layout (the collective ran), else
  // NotImplemented: the caller then takes the full path, which checks everything and reports
  // what is wrong. (None is a result: reduce's at a rank other than root.)
  // `comm` is the group's communicator, passed per call: the memo must not keep it alive past
  // shutdown (its links and threads go when the world closes).
  py::object run(Communicator& comm, const py::handle& x, const py::handle& out) {
    const py::object miss = py::reinterpret_borrow<py::object>(Py_NotImplemented);
    if (!isPlainArray(x) || !(out.is_none() || isPlainArray(out))) return miss;
    const auto xa = py::reinterpret_borrow<py::array>(x);
    std::shared_ptr<Known> k = find(xa, out);  // held: remember() may drop it meanwhile
    if (k == nullptr) return miss;
    // Handles, not py::array: a default-constructed py::array allocates an empty numpy array,
    // which cost a third of this whole call.
    py::object result = py::none();
    void* dst = nullptr;
    if (k->writes != Writes::kNone) {
      switch (k->writes) {
        case Writes::kOut: result = py::reinterpret_borrow<py::object>(out); break;
        case Writes::kInplace: result = xa; break;
        default: result = newResultArray(k->resultType, k->resultShape); break;
      }
      const auto* target = py::detail::array_proxy(result.ptr());
      if ((target->flags & py::detail::npy_api::NPY_ARRAY_WRITEABLE_) == 0)
        return miss;  // the full path says so
      dst = target->data;
    }
    const void* in = xa.data();
    const uint64_t epoch = comm.autoChoices().epoch();
    if (k->plan == nullptr || k->epoch != epoch || &k->plan->comm() != &comm) {
      k->plan = std::make_shared<PreparedCollective>(comm, members_.ranks, members_.groupId,
                                                     k->spec.args(), k->spec.algo,
                                                     /*keepMeasuring=*/true);
      k->epoch = epoch;
    }
    std::shared_ptr<PreparedCollective> plan = k->plan;  // another thread may replace it
    {
      py::gil_scoped_release release;
      comm.executor().run([&] { plan->runOn(in, dst); });
    }
    return std::move(result);
  }

  // Keeps a call that went through every check: `writes` is "out", "inplace", "new" or
  // "none"; `result` is the result the full path returned (its dtype and shape, for "new").
  void remember(const py::array& x, const py::handle& out, const std::string& writes,
                const CallSpec& spec, const py::handle& result) {
    auto known = std::make_shared<Known>();
    Known& k = *known;
    k.in = Layout::of(x);
    k.hasOut = !out.is_none();
    if (k.hasOut) k.out = Layout::of(py::reinterpret_borrow<py::array>(out));
    k.spec = spec;
    if (writes == "out") {
      k.writes = Writes::kOut;
    } else if (writes == "inplace") {
      k.writes = Writes::kInplace;
    } else if (writes == "none") {
      k.writes = Writes::kNone;
    } else {
      PC_CHECK(writes == "new", "remember: writes must be out, inplace, new or none, got ", writes);
      k.writes = Writes::kNew;
      const auto r = py::reinterpret_borrow<py::array>(result);
      k.resultType = r.dtype();
      k.resultShape.assign(r.shape(), r.shape() + r.ndim());
    }
    if (known_.size() >= kLayoutsPerCall) known_.pop_front();
    known_.push_back(std::move(known));
  }

  size_t size() const { return known_.size(); }

 private:
  std::shared_ptr<Known> find(const py::array& x, const py::handle& out) const {
    for (const auto& k : known_) {
      if (k->hasOut == out.is_none() || !k->in.matches(x)) continue;
      if (k->hasOut && !k->out.matches(py::reinterpret_borrow<py::array>(out))) continue;
      return k;
    }
    return nullptr;
  }

  GroupMembers members_;
  std::deque<std::shared_ptr<Known>> known_;
};

}  // namespace

void bindKnownCalls(py::module_& m) {
  py::class_<KnownLayouts>(m, "KnownLayouts",
                           "The array layouts one combination of a group's call arguments was "
                           "checked with (pycollective/_call_memo.py).")
      .def(py::init<const GroupMembers&>(), py::arg("members"))
      .def("run", &KnownLayouts::run, py::arg("comm"), py::arg("x"), py::arg("out"),
           "Runs the call if (x, out) has a known layout and returns its result; else "
           "NotImplemented. "
           "GIL released while it runs.")
      .def("remember", &KnownLayouts::remember, py::arg("x"), py::arg("out"), py::arg("writes"),
           py::arg("spec"), py::arg("result"),
           "Keeps the layout of a call that passed every check.")
      .def("__len__", &KnownLayouts::size);
}

}  // namespace bindings
}  // namespace pycollective

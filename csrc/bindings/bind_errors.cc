// C++ exception types -> the classes of pycollective/errors.py (pickleable, documented there).
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "core/error.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

void bindErrors(py::module_& m) {
  py::module_ errors = py::module_::import("pycollective.errors");
  // Leaked on purpose: exception types must outlive the interpreter's module teardown.
  static py::object* timeout = new py::object(errors.attr("CollectiveTimeout"));
  static py::object* remote = new py::object(errors.attr("RemoteError"));
  static py::object* protocol = new py::object(errors.attr("ProtocolError"));
  static py::object* aborted = new py::object(errors.attr("Aborted"));
  static py::object* internal = new py::object(errors.attr("InternalError"));
  static py::object* cudaError = new py::object(errors.attr("CudaError"));
  static py::object* ncclError = new py::object(errors.attr("NcclError"));
  static py::object* ncclUnavailable = new py::object(errors.attr("NcclUnavailable"));
  static py::object* base = new py::object(errors.attr("CollectiveError"));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const InvalidType& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const CollectiveTimeout& e) {
      PyErr_SetString(timeout->ptr(), e.what());
    } catch (const RemoteError& e) {
      PyErr_SetString(remote->ptr(), e.what());
    } catch (const ProtocolError& e) {
      PyErr_SetString(protocol->ptr(), e.what());
    } catch (const Aborted& e) {
      PyErr_SetString(aborted->ptr(), e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(internal->ptr(), e.what());
    } catch (const CudaError& e) {
      PyErr_SetString(cudaError->ptr(), e.what());
    } catch (const NcclError& e) {
      PyErr_SetString(ncclError->ptr(), e.what());
    } catch (const NcclUnavailable& e) {
      PyErr_SetString(ncclUnavailable->ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(base->ptr(), e.what());
    }
  });
  (void)m;
}

}  // namespace bindings
}  // namespace pycollective

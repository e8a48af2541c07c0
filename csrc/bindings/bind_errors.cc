// C++ exception types -> the classes of pycollective/errors.py (pickleable, documented there).
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "core/error.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

// The Python classes, looked up once by bindErrors. Leaked on purpose: exception types must
// outlive the interpreter's module teardown.
struct ErrorClasses {
  py::object timeout, remote, protocol, aborted, internal, cuda, nccl, ncclUnavailable, base;
};
ErrorClasses* classes = nullptr;

}  // namespace

void setPythonError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const InvalidType& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const CollectiveTimeout& e) {
    PyErr_SetString(classes->timeout.ptr(), e.what());
  } catch (const RemoteError& e) {
    PyErr_SetString(classes->remote.ptr(), e.what());
  } catch (const ProtocolError& e) {
    PyErr_SetString(classes->protocol.ptr(), e.what());
  } catch (const Aborted& e) {
    PyErr_SetString(classes->aborted.ptr(), e.what());
  } catch (const InternalError& e) {
    PyErr_SetString(classes->internal.ptr(), e.what());
  } catch (const CudaError& e) {
    PyErr_SetString(classes->cuda.ptr(), e.what());
  } catch (const NcclError& e) {
    PyErr_SetString(classes->nccl.ptr(), e.what());
  } catch (const NcclUnavailable& e) {
    PyErr_SetString(classes->ncclUnavailable.ptr(), e.what());
  } catch (const Error& e) {
    PyErr_SetString(classes->base.ptr(), e.what());
  }
}

const py::object& collectiveErrorClass() {
  return classes->base;
}

void bindErrors(py::module_& m) {
  py::module_ errors = py::module_::import("pycollective.errors");
  classes = new ErrorClasses{errors.attr("CollectiveTimeout"), errors.attr("RemoteError"),
                             errors.attr("ProtocolError"),     errors.attr("Aborted"),
                             errors.attr("InternalError"),     errors.attr("CudaError"),
                             errors.attr("NcclError"),         errors.attr("NcclUnavailable"),
                             errors.attr("CollectiveError")};
  py::register_exception_translator(setPythonError);
  (void)m;
}

}  // namespace bindings
}  // namespace pycollective

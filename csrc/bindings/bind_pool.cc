// OutputBuffer: the memory behind a result array (core/output_pool.h). numpy holds it as the
// array's base; when the last array using it goes, its memory returns to the pool.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "bindings/bindings.h"
#include "core/output_pool.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

namespace {

class OutputBuffer {
 public:
  explicit OutputBuffer(size_t bytes)
      : bytes_(bytes), data_(OutputPool::instance().take(bytes, &capacity_)) {}
  ~OutputBuffer() { OutputPool::instance().give(data_, capacity_); }
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;

  void* data() const { return data_; }

  py::buffer_info info() {
    return py::buffer_info(data_, 1, py::format_descriptor<uint8_t>::format(), 1,
                           {static_cast<py::ssize_t>(bytes_)}, {1});
  }

 private:
  size_t bytes_, capacity_ = 0;
  void* data_;
};

}  // namespace

py::array newResultArray(const py::dtype& dtype, const std::vector<py::ssize_t>& shape) {
  size_t count = 1;
  for (py::ssize_t d : shape) count *= static_cast<size_t>(d);
  const size_t bytes = count * static_cast<size_t>(dtype.itemsize());
  if (bytes < OutputPool::kMinPooledBytes) return py::array(dtype, shape);
  auto block = std::make_unique<OutputBuffer>(bytes);
  void* data = block->data();
  py::object owner = py::cast(std::move(block));  // the array's base: frees the block with it
  return py::array(dtype, shape, std::vector<py::ssize_t>{}, data, owner);
}

void bindPool(py::module_& m) {
  py::class_<OutputBuffer>(
      m, "OutputBuffer", py::buffer_protocol(),
      "Writable memory for a result array, reused from the output pool "
      "when a block of its size was released (PYCOLLECTIVE_OUTPUT_POOL_BYTES).")
      .def(py::init<size_t>(), py::arg("nbytes"))
      .def_buffer(&OutputBuffer::info);
  m.attr("POOLED_OUTPUT_BYTES") = OutputPool::kMinPooledBytes;
  m.def("new_result", &newResultArray, py::arg("dtype"), py::arg("shape"),
        "A new C-contiguous result array; from POOLED_OUTPUT_BYTES up its memory comes from the "
        "output pool and returns there when the array goes.");
  m.def(
      "output_pool_cached_bytes", [] { return OutputPool::instance().cachedBytes(); },
      "Bytes of released result memory kept for reuse.");
}

}  // namespace bindings
}  // namespace pycollective

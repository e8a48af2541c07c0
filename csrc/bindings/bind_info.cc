// build_info(), algorithms(), and the small helpers Python needs from the core.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "algorithms/registry.h"
#include "bindings/bindings.h"
#include "config.h"
#include "core/cache_probe.h"
#include "core/core_distance.h"
#include "core/error.h"
#include "core/knobs.h"
#include "core/logging.h"
#include "core/memory_bandwidth.h"
#include "cuda/device_ops.h"
#include "optim/replicated_update.h"
#include "reduce/reduce.h"
#include "transport/frame.h"

namespace py = pybind11;

namespace pycollective {
namespace bindings {

uintptr_t dataPointer(const py::handle& array) {
  if (array.is_none()) return 0;
  return reinterpret_cast<uintptr_t>(py::reinterpret_borrow<py::array>(array).data());
}

LinkCost linkCost(const CostTuple& t) {
  return LinkCost{std::get<0>(t), std::get<1>(t), std::get<2>(t)};
}

LinkCost processLinkCost(const CostTuple& t) {
  LinkCost c = linkCost(t);
  c.bothSidesCopy = true;
  return c;
}

std::vector<TunedChoice> tunedTable(const TunedRows& rows) {
  std::vector<TunedChoice> out;
  for (const auto& [kind, maxBytes, algo] : rows) out.push_back({kind, maxBytes, algo});
  return out;
}

void bindInfo(py::module_& m) {
  m.def("build_info", [] {
    py::dict info;
    info["version"] = PYCOLLECTIVE_VERSION;
    info["compiler"] = PYCOLLECTIVE_COMPILER;
    info["cxx_flags"] = PYCOLLECTIVE_CXX_FLAGS;
    info["build_type"] = PYCOLLECTIVE_BUILD_TYPE;
    info["simd"] = simdLevel();
    info["cuda"] = static_cast<bool>(PYCOLLECTIVE_HAVE_CUDA);
    info["cuda_version"] = PYCOLLECTIVE_CUDA_VERSION;
    info["cuda_architectures"] = PYCOLLECTIVE_CUDA_ARCHITECTURES;
    return info;
  });
  m.def("algorithms", &algorithmNames);
  // The one table of PYCOLLECTIVE_* variables (core/knobs.h): pycollective/config.py reads it.
  m.def("knob_table", [] {
    py::list rows;
    for (int i = 0; i < knobs::kNumKnobs; ++i) {
      const knobs::KnobInfo& k = knobs::info(static_cast<knobs::Knob>(i));
      rows.append(py::make_tuple(k.name, k.type, k.defaultValue, k.meaning));
    }
    return rows;
  });
  m.def("set_log_rank", &setLogRank, py::arg("rank"),
        "This process's rank, for the prefix of native log lines (pycollective/log.py).");
  m.def("reload_knobs", &knobs::reload,
        "Reads the PYCOLLECTIVE_* variables again (native side); config.reload() calls it.");
  // The native enums' codes by name. Python builds its tables from these (pycollective/
  // tensors.py, reduce_op.py, _calls.py, _exchange.py, fused_update.py) instead of keeping
  // copies of the numbers.
  m.def("enum_codes", [] {
    py::dict dtypes, ops, kinds, rules;
    for (int i = 0; i < kNumDTypes; ++i) dtypes[dtypeName(static_cast<DType>(i))] = i;
    for (int i = 0; i < kNumReduceOps; ++i) ops[opName(static_cast<ReduceOp>(i))] = i;
    for (int i = 0; i < kNumCollectiveKinds; ++i)
      kinds[collectiveName(static_cast<CollectiveKind>(i))] = i;
    for (int i = 0; i < kNumUpdateRules; ++i) rules[updateRuleName(static_cast<uint8_t>(i))] = i;
    py::dict all;
    all["dtype"] = dtypes;
    all["reduce_op"] = ops;
    all["collective_kind"] = kinds;
    all["update_rule"] = rules;
    return all;
  });
  m.def(
      "memory_bandwidth",
      [](size_t bytesPerThread, int threads, int reps) {
        py::gil_scoped_release release;
        return measureCopyBandwidth(bytesPerThread, threads, reps);
      },
      py::arg("bytes_per_thread"), py::arg("threads"), py::arg("reps") = 3,
      "Bytes read+written per second when `threads` threads each copy a private buffer.");
  m.def(
      "cache_line_round_trip_ns",
      [](int cpuA, int cpuB, int rounds, int batches) {
        py::gil_scoped_release release;
        return cacheLineRoundTripNs(cpuA, cpuB, rounds, batches);
      },
      py::arg("cpu_a"), py::arg("cpu_b"), py::arg("rounds") = 2000, py::arg("batches") = 9,
      "Nanoseconds a cache line takes from CPU cpu_a to cpu_b and back (median of `batches` "
      "batches of `rounds`); -1 if a thread cannot run on either CPU, or both are one.");
  m.def(
      "cache_resident_bytes",
      [] {
        py::gil_scoped_release release;
        return cacheResidentBytes();
      },
      "Bytes a call may read and write in all and still count as in cache for in-process auto "
      "(PYCOLLECTIVE_CACHE_BYTES, else measured once per process).");
  m.def("line_with_reported_cache", &lineWithReportedCache, py::arg("measured_line"),
        py::arg("reported_bytes"),
        "The in-cache line from the probe's measured line and the cache size the OS reports.");
  m.def("line_from_passes", &lineFromPasses, py::arg("reference_rate"), py::arg("pass_rates"),
        py::arg("reported_bytes"),
        "The in-cache line from the probe's pass rates (working sets of 1 MiB << i), the faster "
        "of a 32 and a 64 MiB pass, and the cache size the OS reports.");
  m.def("parse_cache_size", &parseCacheSize, py::arg("text"),
        "A cache size as /sys writes it ('32768K') in bytes; 0 for text it cannot read.");

  // Reduces b into a in place (numpy-free kernel access for tests and the parameter server).
  m.def(
      "reduce_into",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op) {
        const DType type = dtypeOf(dtype);
        const ReduceOp reduceOp = opOf(op);
        ReduceFn fn = lookupReduce(type, reduceOp);
        py::gil_scoped_release release;
        fn(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a),
           reinterpret_cast<const void*>(b), count);
      },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"),
      py::arg("op"));
  m.def(
      "scale",
      [](uintptr_t data, size_t count, int dtype, double factor) {
        const DType type = dtypeOf(dtype);
        py::gil_scoped_release release;
        scaleInPlace(reinterpret_cast<void*>(data), count, type, factor);
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"));

  // Device helpers (DeviceOps): kernels on raw device pointers for tests and benchmarks, and
  // the pointer query the tensor adapters use. A CPU-only build has no devices: cuda_* raise
  // CudaError, except cuda_device_count() (0) and cuda_pointer_device() (-1).
  m.def("cuda_describe", [] {
    cuda::DeviceOps* ops = cuda::deviceOps();
    return ops == nullptr ? std::string("no CUDA in this build") : ops->describe();
  });
  m.def("cuda_device_count", [] {
    cuda::DeviceOps* ops = cuda::deviceOps();
    return ops == nullptr ? 0 : ops->deviceCount();
  });
  m.def(
      "cuda_pointer_device",
      [](uintptr_t p) {
        cuda::DeviceOps* ops = cuda::deviceOps();
        return ops == nullptr ? -1 : ops->pointerDevice(reinterpret_cast<const void*>(p));
      },
      py::arg("ptr"), "CUDA device holding the memory at ptr, or -1 for host memory.");
  m.def(
      "cuda_reduce",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op,
         uintptr_t stream) {
        const DType type = dtypeOf(dtype);
        const ReduceOp reduceOp = opOf(op);
        cuda::DeviceOps& ops = cuda::requireDeviceOps("cuda_reduce");
        py::gil_scoped_release release;
        ops.reduceAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a),
                        reinterpret_cast<const void*>(b), count, type, reduceOp,
                        reinterpret_cast<cuda::Stream>(stream));
      },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("stream") = 0,
      "Enqueues dst = a OP b on the stream (avg enqueues the sum); returns at once.");
  m.def(
      "cuda_scale",
      [](uintptr_t data, size_t count, int dtype, double factor, uintptr_t stream) {
        const DType type = dtypeOf(dtype);
        cuda::DeviceOps& ops = cuda::requireDeviceOps("cuda_scale");
        py::gil_scoped_release release;
        ops.scaleAsync(reinterpret_cast<void*>(data), count, type, factor,
                       reinterpret_cast<cuda::Stream>(stream));
      },
      py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("factor"),
      py::arg("stream") = 0);
  m.def(
      "cuda_copy",
      [](uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream) {
        cuda::DeviceOps& ops = cuda::requireDeviceOps("cuda_copy");
        py::gil_scoped_release release;
        ops.copyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                      reinterpret_cast<cuda::Stream>(stream));
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream") = 0);
  m.def(
      "cuda_malloc",
      [](size_t bytes, int device) {
        cuda::DeviceOps& ops = cuda::requireDeviceOps("cuda_malloc");
        py::gil_scoped_release release;
        return reinterpret_cast<uintptr_t>(ops.alloc(bytes, device));
      },
      py::arg("bytes"), py::arg("device"));
  m.def(
      "cuda_free",
      [](uintptr_t p, int device) {
        cuda::DeviceOps* ops = cuda::deviceOps();
        if (ops != nullptr) ops->free(reinterpret_cast<void*>(p), device);
      },
      py::arg("ptr"), py::arg("device"));
  m.def(
      "cuda_synchronize",
      [](uintptr_t stream) {
        cuda::DeviceOps& ops = cuda::requireDeviceOps("cuda_synchronize");
        py::gil_scoped_release release;
        ops.streamSynchronize(reinterpret_cast<cuda::Stream>(stream));
      },
      py::arg("stream") = 0);
}

}  // namespace bindings
}  // namespace pycollective

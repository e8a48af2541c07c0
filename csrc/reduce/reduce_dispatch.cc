// Chooses the kernel table for this CPU once, and runs kernels over threads.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/knobs.h"
#include "core/thread_pool.h"
#include "reduce/reduce.h"
#include "reduce/reduce_cpu_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#define PC_REDUCE_HAVE_X86_TABLES 1
#else
#define PC_REDUCE_HAVE_X86_TABLES 0
#endif

namespace pycollective {
namespace {

// Smallest piece handed to another thread. Waking a worker costs microseconds; 256 KiB of float32
// sum streams 768 KiB, tens of microseconds even at memory bandwidth, so the split pays off.
constexpr size_t kMinParallelBytes = 256 * 1024;

// Pieces start at multiples of a cache line (relative to dst), so two threads never write the
// same line.
constexpr size_t kCacheLineBytes = 64;

enum class SimdLevel : int { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

const char* levelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kGeneric: return "generic";
    case SimdLevel::kAvx2: return "avx2";
    case SimdLevel::kAvx512: return "avx512";
  }
  return "?";
}

// The best table this CPU (and OS: __builtin_cpu_supports checks that the OS saves the
// AVX/AVX-512 registers) can run. Each level requires every flag its file is compiled with.
SimdLevel detectLevel() {
#if PC_REDUCE_HAVE_X86_TABLES
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return SimdLevel::kAvx512;
  }
  if (avx2) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kGeneric;
}

struct Selection {
  SimdLevel level = SimdLevel::kGeneric;
  detail::KernelTable table = {};
};

Selection selectKernels() {
  Selection s;
  const SimdLevel best = detectLevel();
  s.level = best;
  const std::string setting = knobs::text(knobs::kSimd);
  const char* env = setting.c_str();
  if (*env != '\0') {
    SimdLevel requested = best;
    bool known = true;
    if (std::strcmp(env, "generic") == 0) {
      requested = SimdLevel::kGeneric;
    } else if (std::strcmp(env, "avx2") == 0) {
      requested = SimdLevel::kAvx2;
    } else if (std::strcmp(env, "avx512") == 0) {
      requested = SimdLevel::kAvx512;
    } else {
      known = false;
    }
    if (!known) {
      std::fprintf(stderr,
                   "pycollective: WARNING: ignoring PYCOLLECTIVE_SIMD=%s (expected generic, avx2 "
                   "or avx512); using %s\n",
                   env, levelName(best));
    } else if (static_cast<int>(requested) > static_cast<int>(best)) {
      std::fprintf(stderr,
                   "pycollective: WARNING: PYCOLLECTIVE_SIMD=%s is not supported by this CPU; "
                   "using %s\n",
                   env, levelName(best));
    } else {
      s.level = requested;
    }
  }
  switch (s.level) {
#if PC_REDUCE_HAVE_X86_TABLES
    case SimdLevel::kAvx512: detail::avx512::fillKernelTable(&s.table); break;
    case SimdLevel::kAvx2: detail::avx2::fillKernelTable(&s.table); break;
#endif
    default: detail::generic::fillKernelTable(&s.table); break;
  }
  return s;
}

// Chosen on first use (thread-safe static initialization) and never changed, so every collective
// in the process uses the same kernels.
const Selection& selection() {
  static const Selection s = selectKernels();
  return s;
}

void checkDType(DType dtype) {
  const int d = static_cast<int>(dtype);
  PC_CHECK(d >= 0 && d < kNumDTypes, "unknown dtype value ", d);
}

}  // namespace

ReduceFn lookupReduce(DType dtype, ReduceOp op) {
  checkDType(dtype);
  const int o = static_cast<int>(op);
  PC_CHECK(o >= 0 && o < kNumReduceOps, "unknown reduce op value ", o);
  if (op == ReduceOp::kAvg) {
    if (!isFloating(dtype)) {
      throw InvalidType(makeMessage("avg is not defined for ", dtypeName(dtype),
                                    ": use sum and divide, or convert to a floating type"));
    }
    op = ReduceOp::kSum;
  }
  const ReduceFn fn = selection().table.reduce[static_cast<int>(dtype)][static_cast<int>(op)];
  PC_ASSERT(fn != nullptr, "no ", opName(op), " kernel for ", dtypeName(dtype));
  return fn;
}

namespace {
int halfIndex(DType dtype) {
  PC_ASSERT(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
            "16-bit conversions are for bfloat16 and float16, not ", dtypeName(dtype));
  return dtype == DType::kBFloat16 ? 0 : 1;
}
}  // namespace

NarrowFn lookupNarrow(DType dtype) {
  return selection().table.narrow[halfIndex(dtype)];
}

WidenFn lookupWiden(DType dtype) {
  return selection().table.widen[halfIndex(dtype)];
}

void scaleInPlace(void* data, size_t count, DType dtype, double factor) {
  checkDType(dtype);
  if (!isFloating(dtype)) {
    throw InvalidType(makeMessage("cannot scale ", dtypeName(dtype),
                                  " in place: scaling (as for avg) needs a floating type"));
  }
  if (count == 0) return;
  PC_CHECK(data != nullptr, "scaleInPlace: null data for ", count, " elements");
  const detail::ScaleFn fn = selection().table.scale[static_cast<int>(dtype)];
  PC_ASSERT(fn != nullptr, "no scale kernel for ", dtypeName(dtype));
  fn(data, count, factor);
}

const char* simdLevel() {
  return levelName(selection().level);
}

void reduceParallel(ReduceFn fn, void* dst, const void* a, const void* b, size_t count,
                    size_t elemSize, int threads) {
  PC_CHECK(fn != nullptr, "reduceParallel: no kernel");
  PC_CHECK(elemSize > 0, "reduceParallel: element size must be positive");
  if (count == 0) return;
  const size_t bySize = count * elemSize / kMinParallelBytes;
  size_t pieces = std::min(static_cast<size_t>(std::max(threads, 1)), bySize);
  if (pieces > 1) {
    // Only now start the pool: small or single-threaded reductions never create it.
    pieces = std::min(pieces, static_cast<size_t>(ThreadPool::reductionPool().numWorkers()) + 1);
  }
  if (pieces <= 1) {
    fn(dst, a, b, count);
    return;
  }

  const size_t lineElems = kCacheLineBytes % elemSize == 0 ? kCacheLineBytes / elemSize : 1;
  size_t perPiece = (count + pieces - 1) / pieces;
  perPiece = (perPiece + lineElems - 1) / lineElems * lineElems;
  const int nPieces = static_cast<int>((count + perPiece - 1) / perPiece);

  char* d = static_cast<char*>(dst);
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  ThreadPool::reductionPool().parallelFor(nPieces, [&](int piece) {
    const size_t begin = static_cast<size_t>(piece) * perPiece;
    const size_t n = std::min(perPiece, count - begin);
    const size_t offset = begin * elemSize;
    fn(d + offset, x + offset, y + offset, n);
  });
}

}  // namespace pycollective

// Standalone test of the CPU reduction kernels, the dispatcher and the reduction thread pool,
// against straightforward scalar references. Built and run by tests/native/build_and_run.sh, once
// per kernel table (PYCOLLECTIVE_SIMD=generic|avx2|avx512).
//
//   test_reduce                 run every check against the table the environment selects
//   test_reduce --print-simd    print the table that would be used, and exit
//   test_reduce --bench         float32 sum GB/s over 64 MiB vs memcpy (plus fp16/bf16 sum)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "expect.h"
#include "reduce/half.h"
#include "reduce/reduce.h"

using namespace pycollective;

namespace {

const DType kAllDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                            DType::kInt8,    DType::kUInt8,    DType::kInt32,   DType::kInt64};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg};

// ---------------------------------------------------------------------------------------------
// Reference 16-bit float formats, independent of half.h: decode with ldexp, encode by searching
// the sorted table of every finite non-negative value for the nearest one (ties to even code).

struct RefFormat {
  const char* name;
  int mantissaBits;
  int exponentBias;
  uint16_t maxFinite;  // largest finite code
  uint16_t infCode;
  double overflowAt;           // |x| >= this rounds to infinity (max finite + half an ulp)
  std::vector<double> values;  // values[code] for code in [0, maxFinite]
};

double refDecode(const RefFormat& f, uint16_t h) {
  const int expBits = 15 - f.mantissaBits;
  const int e = (h >> f.mantissaBits) & ((1 << expBits) - 1);
  const int m = h & ((1 << f.mantissaBits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << expBits) - 1) {
    return m != 0 ? std::copysign(std::numeric_limits<double>::quiet_NaN(), sign)
                  : sign * std::numeric_limits<double>::infinity();
  }
  if (e == 0) return sign * std::ldexp(m, 1 - f.exponentBias - f.mantissaBits);
  return sign * std::ldexp(m + (1 << f.mantissaBits), e - f.exponentBias - f.mantissaBits);
}

RefFormat makeFormat(const char* name, int mantissaBits, int exponentBias, uint16_t maxFinite,
                     uint16_t infCode) {
  RefFormat f{name, mantissaBits, exponentBias, maxFinite, infCode, 0.0, {}};
  f.values.resize(maxFinite + 1u);
  for (unsigned c = 0; c <= maxFinite; ++c) f.values[c] = refDecode(f, static_cast<uint16_t>(c));
  const double ulp = f.values[maxFinite] - f.values[maxFinite - 1];
  f.overflowAt = f.values[maxFinite] + ulp / 2;
  return f;
}

const RefFormat& fp16Format() {
  static const RefFormat f = makeFormat("float16", 10, 15, 0x7BFF, 0x7C00);
  return f;
}

const RefFormat& bf16Format() {
  static const RefFormat f = makeFormat("bfloat16", 7, 127, 0x7F7F, 0x7F80);
  return f;
}

// Correctly rounded encoding of x. A NaN comes back as some NaN code with x's sign.
uint16_t refEncode(const RefFormat& f, double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return static_cast<uint16_t>(sign | f.infCode | 1);
  const double a = std::fabs(x);
  if (a >= f.overflowAt) return static_cast<uint16_t>(sign | f.infCode);
  const size_t lo = static_cast<size_t>(std::upper_bound(f.values.begin(), f.values.end(), a) -
                                        f.values.begin() - 1);
  if (f.values[lo] == a || lo == f.maxFinite) return static_cast<uint16_t>(sign | lo);
  const double below = a - f.values[lo];  // exact (Sterbenz)
  const double above = f.values[lo + 1] - a;
  size_t code = lo;
  if (above < below || (above == below && (lo & 1))) code = lo + 1;
  return static_cast<uint16_t>(sign | code);
}

bool isNanCode(const RefFormat& f, uint16_t h) {
  return (h & 0x7FFF) > f.infCode;
}

// Same code, or both NaN (which NaN, and its sign, is not specified for NaN op NaN).
bool sameCode(const RefFormat& f, uint16_t x, uint16_t y) {
  if (isNanCode(f, x) || isNanCode(f, y)) return isNanCode(f, x) && isNanCode(f, y);
  return x == y;
}

// ---------------------------------------------------------------------------------------------
// Scalar reference for one element of every dtype x op.

template <typename T>
T wrapTo(__int128 v) {
  constexpr int kBits = 8 * sizeof(T);
  const unsigned __int128 modulus = static_cast<unsigned __int128>(1) << kBits;
  __int128 r = v % static_cast<__int128>(modulus);
  if (r < 0) r += static_cast<__int128>(modulus);
  if (std::is_signed<T>::value && r >= static_cast<__int128>(modulus / 2)) {
    r -= static_cast<__int128>(modulus);
  }
  return static_cast<T>(r);
}

template <typename T>
T refInt(ReduceOp op, T a, T b) {
  const __int128 x = a;
  const __int128 y = b;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return wrapTo<T>(x + y);
    case ReduceOp::kProd: return wrapTo<T>(x * y);
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
  }
  return 0;
}

// In double: exact for the product of two floats, and double-then-float rounding of a sum is the
// correctly rounded float sum (53 >= 2*24+2).
double refFloatOp(ReduceOp op, double a, double b) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return (std::isnan(a) || std::isnan(b)) ? nan : (a < b ? a : b);
    case ReduceOp::kMax: return (std::isnan(a) || std::isnan(b)) ? nan : (a > b ? a : b);
  }
  return nan;
}

// x is a NaN with the same sign as y's, or the same bits.
template <typename T>
bool sameFloat(T x, T y) {
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  return std::memcmp(&x, &y, sizeof x) == 0;
}

template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof v);
  return v;
}

template <typename T>
void store(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof v);
}

void refElement(DType dt, ReduceOp op, const void* a, const void* b, void* out, size_t i) {
  switch (dt) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      const RefFormat& f = dt == DType::kFloat16 ? fp16Format() : bf16Format();
      const double r =
          refFloatOp(op, refDecode(f, load<uint16_t>(a, i)), refDecode(f, load<uint16_t>(b, i)));
      store<uint16_t>(out, i, refEncode(f, r));
      return;
    }
    case DType::kFloat32:
      store<float>(out, i,
                   static_cast<float>(refFloatOp(op, load<float>(a, i), load<float>(b, i))));
      return;
    case DType::kFloat64:
      store<double>(out, i, refFloatOp(op, load<double>(a, i), load<double>(b, i)));
      return;
    case DType::kInt8: store(out, i, refInt(op, load<int8_t>(a, i), load<int8_t>(b, i))); return;
    case DType::kUInt8: store(out, i, refInt(op, load<uint8_t>(a, i), load<uint8_t>(b, i))); return;
    case DType::kInt32: store(out, i, refInt(op, load<int32_t>(a, i), load<int32_t>(b, i))); return;
    case DType::kInt64: store(out, i, refInt(op, load<int64_t>(a, i), load<int64_t>(b, i))); return;
  }
}

bool sameElement(DType dt, const void* x, const void* y, size_t i) {
  switch (dt) {
    case DType::kFloat16: return sameCode(fp16Format(), load<uint16_t>(x, i), load<uint16_t>(y, i));
    case DType::kBFloat16:
      return sameCode(bf16Format(), load<uint16_t>(x, i), load<uint16_t>(y, i));
    case DType::kFloat32: return sameFloat(load<float>(x, i), load<float>(y, i));
    case DType::kFloat64: return sameFloat(load<double>(x, i), load<double>(y, i));
    default: {
      const size_t s = elementSize(dt);
      return std::memcmp(static_cast<const char*>(x) + i * s, static_cast<const char*>(y) + i * s,
                         s) == 0;
    }
  }
}

std::string showElement(DType dt, const void* p, size_t i) {
  char buf[96];
  switch (dt) {
    case DType::kFloat16:
    case DType::kBFloat16: {
      const uint16_t h = load<uint16_t>(p, i);
      const RefFormat& f = dt == DType::kFloat16 ? fp16Format() : bf16Format();
      std::snprintf(buf, sizeof buf, "0x%04x (%.9g)", h, refDecode(f, h));
      break;
    }
    case DType::kFloat32: std::snprintf(buf, sizeof buf, "%.9g", load<float>(p, i)); break;
    case DType::kFloat64: std::snprintf(buf, sizeof buf, "%.17g", load<double>(p, i)); break;
    case DType::kInt8: std::snprintf(buf, sizeof buf, "%d", load<int8_t>(p, i)); break;
    case DType::kUInt8: std::snprintf(buf, sizeof buf, "%u", load<uint8_t>(p, i)); break;
    case DType::kInt32: std::snprintf(buf, sizeof buf, "%d", load<int32_t>(p, i)); break;
    case DType::kInt64:
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(load<int64_t>(p, i)));
      break;
  }
  return buf;
}

// ---------------------------------------------------------------------------------------------
// Test data: random values with a share of special values (NaN, inf, +-0, subnormals, extremes).

template <typename T>
T pickFloat(std::mt19937_64& rng) {
  using Lim = std::numeric_limits<T>;
  const T specials[] = {T(0),
                        -T(0),
                        Lim::infinity(),
                        -Lim::infinity(),
                        Lim::quiet_NaN(),
                        -Lim::quiet_NaN(),
                        Lim::denorm_min(),
                        -Lim::denorm_min(),
                        Lim::max(),
                        -Lim::max(),
                        Lim::min(),
                        T(1),
                        T(-1),
                        T(0.5)};
  const uint64_t r = rng();
  switch (r % 10) {
    case 0: return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
    case 1: {  // raw bits: any pattern at all
      T v;
      const uint64_t bits = rng();
      std::memcpy(&v, &bits, sizeof v);
      return v;
    }
    default: {  // moderate magnitudes, so sums round and products neither overflow nor vanish
      const double m = static_cast<double>(rng() >> 11) * 0x1.0p-53 + 0.5;
      const int e = static_cast<int>((r >> 8) % 41) - 20;
      return static_cast<T>(((r >> 40) & 1 ? -1.0 : 1.0) * std::ldexp(m, e));
    }
  }
}

uint16_t pickHalfBits(std::mt19937_64& rng, const RefFormat& f) {
  const uint64_t r = rng();
  if (r & 1) return static_cast<uint16_t>(r >> 16);  // any pattern: NaN, inf, subnormal, ...
  // Exponents near 1.0 so that many sums of two values are exact ties or carry into the exponent.
  const int e = f.exponentBias - 1 + static_cast<int>((r >> 8) % 3);
  const uint16_t m = static_cast<uint16_t>((r >> 20) & ((1u << f.mantissaBits) - 1));
  return static_cast<uint16_t>(((r >> 40) & 1) << 15 | e << f.mantissaBits | m);
}

void fillRandom(DType dt, void* p, size_t n, std::mt19937_64& rng) {
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::kFloat16: store(p, i, pickHalfBits(rng, fp16Format())); break;
      case DType::kBFloat16: store(p, i, pickHalfBits(rng, bf16Format())); break;
      case DType::kFloat32: store(p, i, pickFloat<float>(rng)); break;
      case DType::kFloat64: store(p, i, pickFloat<double>(rng)); break;
      default: {
        // Integers: full range, with extremes and small values mixed in.
        uint64_t bits = rng();
        if (bits % 8 == 0) bits = (bits >> 8) % 2 ? ~0ull >> 1 : 1ull << 63;  // near min/max
        if (bits % 8 == 1) bits = (bits >> 8) % 5 - 2;                        // -2..2
        std::memcpy(static_cast<char*>(p) + i * elementSize(dt), &bits, elementSize(dt));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 1. Conversions in half.h (this file is built without F16C: the portable path). The F16C path
//    is covered through the kernels of the avx2/avx512 tables below.

void checkFp16Conversion(float x, const char* what) {
  const uint16_t got = floatToFp16(x);
  const uint16_t want = refEncode(fp16Format(), x);
  EXPECT(sameCode(fp16Format(), got, want) && (got & 0x8000) == (want & 0x8000),
         "floatToFp16(%a) [%s] = 0x%04x, want 0x%04x", x, what, got, want);
}

void checkBf16Conversion(float x, const char* what) {
  const uint16_t got = floatToBf16(x);
  const uint16_t want = refEncode(bf16Format(), x);
  EXPECT(sameCode(bf16Format(), got, want) && (got & 0x8000) == (want & 0x8000),
         "floatToBf16(%a) [%s] = 0x%04x, want 0x%04x", x, what, got, want);
}

void testConversions() {
  const RefFormat& h = fp16Format();
  const RefFormat& b = bf16Format();
  // Every 16-bit pattern decodes exactly (NaN: a NaN with the same sign).
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float fh = fp16ToFloat(code);
    const float wantH = static_cast<float>(refDecode(h, code));
    EXPECT(sameFloat(fh, wantH) && std::signbit(fh) == std::signbit(wantH),
           "fp16ToFloat(0x%04x) = %a, want %a", c, fh, wantH);
    const float fb = bf16ToFloat(code);
    const float wantB = static_cast<float>(refDecode(b, code));
    EXPECT(sameFloat(fb, wantB) && std::signbit(fb) == std::signbit(wantB),
           "bf16ToFloat(0x%04x) = %a, want %a", c, fb, wantB);
    EXPECT(fp16ToFloatPortable(code) == fp16ToFloat(code) || std::isnan(fh), "portable 0x%04x", c);
  }
  // fp16 encode: every representable value, the midpoints between neighbours (ties), one float
  // ulp either side of each midpoint, with both signs.
  for (uint32_t c = 0; c <= h.maxFinite; ++c) {
    const double lo = h.values[c];
    const double hi = c < h.maxFinite ? h.values[c + 1] : h.overflowAt * 2 - lo;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
    const float pts[] = {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f),
                         std::nextafter(mid, INFINITY)};
    for (float p : pts) {
      checkFp16Conversion(p, "sweep");
      checkFp16Conversion(-p, "sweep");
    }
  }
  // bf16 encode: every upper half with lower halves at and around the rounding boundary.
  const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC000};
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) checkBf16Conversion(detail::bitsToFloat(hi << 16 | lo), "sweep");
  }

  // Named edge cases, spelled out.
  EXPECT(floatToFp16(65504.0f) == 0x7BFF, "fp16 max");
  EXPECT(floatToFp16(65519.99f) == 0x7BFF, "just below the overflow threshold");
  EXPECT(floatToFp16(65520.0f) == 0x7C00, "the overflow threshold ties to even = inf");
  EXPECT(floatToFp16(1e10f) == 0x7C00 && floatToFp16(-1e10f) == 0xFC00, "overflow");
  EXPECT(floatToFp16(INFINITY) == 0x7C00 && floatToFp16(-INFINITY) == 0xFC00, "inf");
  EXPECT(floatToFp16(0x1.0p-24f) == 0x0001, "smallest subnormal");
  EXPECT(floatToFp16(0x1.0p-25f) == 0x0000, "half the smallest subnormal ties to zero (even)");
  EXPECT(floatToFp16(std::nextafter(0x1.0p-25f, 1.0f)) == 0x0001, "just above it rounds up");
  EXPECT(floatToFp16(0x1.8p-24f) == 0x0002, "1.5 x smallest subnormal ties to 2 (even)");
  EXPECT(floatToFp16(0x1.0p-14f) == 0x0400, "smallest normal");
  EXPECT(floatToFp16(0x1.ff8p-15f) == 0x03FF, "largest subnormal");
  EXPECT(floatToFp16(1.0f + 0x1.0p-11f) == 0x3C00, "tie rounds down to even");
  EXPECT(floatToFp16(1.0f + 0x1.8p-10f) == 0x3C02, "tie rounds up to even");
  EXPECT(floatToFp16(-0.0f) == 0x8000, "negative zero keeps its sign");
  EXPECT(floatToFp16(std::numeric_limits<float>::denorm_min()) == 0x0000, "float subnormal");
  EXPECT(isNanCode(h, floatToFp16(NAN)), "NaN stays NaN");
  EXPECT(isNanCode(h, floatToFp16(detail::bitsToFloat(0x7F800001u))), "NaN payload in low bits");
  EXPECT(isNanCode(h, floatToFp16(detail::bitsToFloat(0xFF800001u))) &&
             (floatToFp16(detail::bitsToFloat(0xFF800001u)) & 0x8000),
         "negative signalling NaN stays a negative NaN");
  EXPECT(std::isnan(fp16ToFloat(0x7C01)) && std::isinf(fp16ToFloat(0x7C00)), "decode specials");

  EXPECT(floatToBf16(1.0f + 0x1.0p-8f) == 0x3F80, "bf16 tie rounds down to even");
  EXPECT(floatToBf16(1.0f + 0x1.8p-7f) == 0x3F82, "bf16 tie rounds up to even");
  EXPECT(floatToBf16(std::numeric_limits<float>::max()) == 0x7F80, "bf16 overflow to inf");
  EXPECT(floatToBf16(-std::numeric_limits<float>::max()) == 0xFF80, "bf16 overflow to -inf");
  EXPECT(floatToBf16(detail::bitsToFloat(0x7F7F7FFFu)) == 0x7F7F, "bf16 max, rounded down");
  EXPECT(floatToBf16(detail::bitsToFloat(0x00010000u)) == 0x0001, "bf16 subnormal kept");
  EXPECT(floatToBf16(detail::bitsToFloat(0x00008000u)) == 0x0000, "bf16 subnormal tie to even");
  EXPECT(floatToBf16(-0.0f) == 0x8000, "bf16 negative zero");
  const uint16_t nanLow = floatToBf16(detail::bitsToFloat(0x7F800001u));
  EXPECT(isNanCode(b, nanLow), "bf16: a NaN whose payload is only in dropped bits: 0x%04x", nanLow);
  const uint16_t negNan = floatToBf16(detail::bitsToFloat(0xFFFFFFFFu));
  EXPECT(isNanCode(b, negNan) && (negNan & 0x8000), "bf16: NaN with all bits set: 0x%04x", negNan);
}

// ---------------------------------------------------------------------------------------------
// 2. Every dtype x op against the reference, for every aliasing case, on the selected table.

enum class Alias { kDistinct, kDstIsA, kDstIsB, kAllSame };
const char* aliasName(Alias m) {
  switch (m) {
    case Alias::kDistinct: return "distinct";
    case Alias::kDstIsA: return "dst==a";
    case Alias::kDstIsB: return "dst==b";
    case Alias::kAllSame: return "dst==a==b";
  }
  return "?";
}

// One element of slack before and after every buffer, filled with a guard byte pattern: a
// kernel that writes outside [0, count) is caught. Odd counts also start one element in, so
// vector loops see unaligned pointers.
struct Buffer {
  std::vector<char> bytes;
  size_t elem;
  size_t offset;
  Buffer(size_t count, size_t elemSize, bool misalign)
      : bytes((count + 3) * elemSize + 64, static_cast<char>(0xA5)),
        elem(elemSize),
        offset(misalign ? elemSize : 0) {}
  char* base() {
    uintptr_t p = reinterpret_cast<uintptr_t>(bytes.data());
    p = (p + 63) & ~uintptr_t{63};
    return reinterpret_cast<char*>(p) + elem;  // guard element before
  }
  void* data() { return base() + offset; }
  bool guardsIntact(size_t count) {
    const char* d = static_cast<char*>(data());
    for (size_t i = 0; i < elem; ++i) {
      if (d[-1 - static_cast<ptrdiff_t>(i)] != static_cast<char>(0xA5)) return false;
      if (d[count * elem + i] != static_cast<char>(0xA5)) return false;
    }
    return true;
  }
};

int reportMismatches(DType dt, ReduceOp op, const char* how, size_t count, const void* got,
                     const void* want, const void* a, const void* b) {
  int bad = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!sameElement(dt, got, want, i)) {
      if (bad++ < 3) {
        EXPECT(false, "%s %s %s count=%zu [%zu]: %s OP %s = %s, want %s", dtypeName(dt), opName(op),
               how, count, i, showElement(dt, a, i).c_str(), showElement(dt, b, i).c_str(),
               showElement(dt, got, i).c_str(), showElement(dt, want, i).c_str());
      }
    }
  }
  ++gChecks;
  return bad;
}

void testKernels(const std::vector<size_t>& sizes) {
  std::mt19937_64 rng(12345);
  for (DType dt : kAllDTypes) {
    const size_t es = elementSize(dt);
    for (ReduceOp op : kAllOps) {
      if (!isFloating(dt) && op == ReduceOp::kAvg) continue;  // refused: see testErrors
      const ReduceFn fn = lookupReduce(dt, op);
      for (size_t count : sizes) {
        const bool misalign = count % 2 == 1;
        Buffer a(count, es, misalign), b(count, es, misalign), dst(count, es, misalign);
        fillRandom(dt, a.data(), count, rng);
        fillRandom(dt, b.data(), count, rng);
        std::vector<char> wantAB(count * es + 1), wantAA(count * es + 1);
        for (size_t i = 0; i < count; ++i) {
          refElement(dt, op, a.data(), b.data(), wantAB.data(), i);
          refElement(dt, op, a.data(), a.data(), wantAA.data(), i);
        }
        std::vector<char> aCopy(count * es + 1), bCopy(count * es + 1);  // +1: never null
        std::memcpy(aCopy.data(), a.data(), count * es);
        std::memcpy(bCopy.data(), b.data(), count * es);
        for (Alias mode : {Alias::kDistinct, Alias::kDstIsA, Alias::kDstIsB, Alias::kAllSame}) {
          std::memcpy(a.data(), aCopy.data(), count * es);
          std::memcpy(b.data(), bCopy.data(), count * es);
          void* out = dst.data();
          const void* x = a.data();
          const void* y = b.data();
          if (mode == Alias::kDstIsA) out = a.data();
          if (mode == Alias::kDstIsB) out = b.data();
          if (mode == Alias::kAllSame) out = a.data(), y = a.data();
          fn(out, x, y, count);
          const char* want = mode == Alias::kAllSame ? wantAA.data() : wantAB.data();
          reportMismatches(dt, op, aliasName(mode), count, out, want, aCopy.data(),
                           mode == Alias::kAllSame ? aCopy.data() : bCopy.data());
          EXPECT(a.guardsIntact(count) && b.guardsIntact(count) && dst.guardsIntact(count),
                 "%s %s %s count=%zu wrote outside its range", dtypeName(dt), opName(op),
                 aliasName(mode), count);
          if (mode != Alias::kDstIsA && mode != Alias::kAllSame) {
            EXPECT(std::memcmp(a.data(), aCopy.data(), count * es) == 0, "a modified");
          }
          if (mode != Alias::kDstIsB) {
            EXPECT(std::memcmp(b.data(), bCopy.data(), count * es) == 0, "b modified");
          }
        }
        // The same through reduceParallel: the split must not change a single bit.
        if (count * es >= (1u << 20)) {
          for (int threads : {2, 3, 8}) {
            std::memcpy(a.data(), aCopy.data(), count * es);
            reduceParallel(fn, a.data(), a.data(), b.data(), count, es, threads);
            const std::string how = "reduceParallel(threads=" + std::to_string(threads) + ")";
            reportMismatches(dt, op, how.c_str(), count, a.data(), wantAB.data(), aCopy.data(),
                             bCopy.data());
            EXPECT(a.guardsIntact(count), "reduceParallel wrote outside its range");
          }
        }
      }
    }
  }

  // Through the kernels (and so through F16C on the avx2/avx512 tables), every 16-bit pattern
  // survives x * 1 unchanged, and x * 0.5 rounds like the reference.
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const RefFormat& f = dt == DType::kFloat16 ? fp16Format() : bf16Format();
    std::vector<uint16_t> all(65536), one(65536, dt == DType::kFloat16 ? 0x3C00 : 0x3F80),
        half(65536, dt == DType::kFloat16 ? 0x3800 : 0x3F00), out(65536);
    for (uint32_t c = 0; c < 65536; ++c) all[c] = static_cast<uint16_t>(c);
    lookupReduce(dt, ReduceOp::kProd)(out.data(), all.data(), one.data(), all.size());
    int bad = 0;
    for (uint32_t c = 0; c < 65536; ++c) bad += !sameCode(f, out[c], all[c]);
    EXPECT(bad == 0, "%s: %d of 65536 codes changed by x * 1", f.name, bad);
    lookupReduce(dt, ReduceOp::kProd)(out.data(), all.data(), half.data(), all.size());
    bad = 0;
    for (uint32_t c = 0; c < 65536; ++c) {
      bad += !sameCode(f, out[c], refEncode(f, refDecode(f, all[c]) * 0.5));
    }
    EXPECT(bad == 0, "%s: %d of 65536 codes wrong for x * 0.5 (subnormal rounding)", f.name, bad);
  }
}

// ---------------------------------------------------------------------------------------------
// 3. scaleInPlace.

void testScale(const std::vector<size_t>& sizes) {
  std::mt19937_64 rng(777);
  const double factors[] = {1.0 / 3, 0.5, 1.0 / 7, 3.0, -2.5, 1e-3, 1.0};
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const size_t es = elementSize(dt);
    for (size_t count : sizes) {
      for (double factor : factors) {
        Buffer buf(count, es, count % 2 == 1);
        fillRandom(dt, buf.data(), count, rng);
        const std::vector<char> orig(static_cast<char*>(buf.data()),
                                     static_cast<char*>(buf.data()) + count * es);
        scaleInPlace(buf.data(), count, dt, factor);
        std::vector<char> want(count * es + 1);
        for (size_t i = 0; i < count; ++i) {
          switch (dt) {
            case DType::kFloat16:
            case DType::kBFloat16: {
              // Documented: the product is formed in float, then rounded once to 16 bits.
              const RefFormat& f = dt == DType::kFloat16 ? fp16Format() : bf16Format();
              const float x = static_cast<float>(refDecode(f, load<uint16_t>(orig.data(), i)));
              store(want.data(), i, refEncode(f, x * static_cast<float>(factor)));
              break;
            }
            case DType::kFloat32:
              store(want.data(), i,
                    static_cast<float>(static_cast<double>(load<float>(orig.data(), i)) * factor));
              break;
            default: store(want.data(), i, load<double>(orig.data(), i) * factor); break;
          }
        }
        char how[64];
        std::snprintf(how, sizeof how, "scaleInPlace(%g)", factor);
        reportMismatches(dt, ReduceOp::kAvg, how, count, buf.data(), want.data(), orig.data(),
                         orig.data());
        EXPECT(buf.guardsIntact(count), "scaleInPlace wrote outside its range");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Errors and dispatch.

template <typename E, typename F>
std::string expectThrows(F&& f, const char* what) {
  try {
    f();
  } catch (const E& e) {
    ++gChecks;
    return e.what();
  } catch (const std::exception& e) {
    EXPECT(false, "%s threw the wrong type: %s", what, e.what());
    return "";
  }
  EXPECT(false, "%s did not throw", what);
  return "";
}

void testErrors() {
  for (DType dt : {DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64}) {
    const std::string msg =
        expectThrows<InvalidType>([&] { lookupReduce(dt, ReduceOp::kAvg); }, "integer avg");
    const std::string want = std::string("avg is not defined for ") + dtypeName(dt) +
                             ": use sum and divide, or convert to a floating type";
    EXPECT(msg == want, "message: '%s'", msg.c_str());
    int32_t x = 4;
    expectThrows<InvalidType>([&] { scaleInPlace(&x, 1, dt, 0.5); }, "integer scale");
  }
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    EXPECT(lookupReduce(dt, ReduceOp::kAvg) == lookupReduce(dt, ReduceOp::kSum),
           "%s avg is the sum kernel", dtypeName(dt));
  }
  expectThrows<InvalidArgument>([] { lookupReduce(static_cast<DType>(99), ReduceOp::kSum); },
                                "bad dtype");
  expectThrows<InvalidArgument>([] { lookupReduce(DType::kFloat32, static_cast<ReduceOp>(17)); },
                                "bad op");
  expectThrows<InvalidArgument>(
      [] { reduceParallel(nullptr, nullptr, nullptr, nullptr, 10, 4, 2); }, "null kernel");
  // Zero elements: nothing is touched, null pointers are fine.
  lookupReduce(DType::kFloat32, ReduceOp::kSum)(nullptr, nullptr, nullptr, 0);
  scaleInPlace(nullptr, 0, DType::kFloat32, 0.5);
  reduceParallel(lookupReduce(DType::kInt8, ReduceOp::kMax), nullptr, nullptr, nullptr, 0, 1, 4);

  const char* env = std::getenv("PYCOLLECTIVE_SIMD");
  if (env != nullptr) {
    EXPECT(std::strcmp(simdLevel(), env) == 0, "PYCOLLECTIVE_SIMD=%s but simdLevel()=%s", env,
           simdLevel());
  }
}

// ---------------------------------------------------------------------------------------------
// 5. The thread pool.

void checkPieces(ThreadPool& pool, int nPieces) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max(nPieces, 1)));
  for (auto& h : hits) h = 0;
  pool.parallelFor(nPieces, [&](int p) { hits[static_cast<size_t>(p)]++; });
  int bad = 0;
  for (int p = 0; p < nPieces; ++p) bad += hits[static_cast<size_t>(p)] != 1;
  EXPECT(bad == 0, "parallelFor(%d): %d pieces not run exactly once", nPieces, bad);
}

void testThreadPool() {
  {
    ThreadPool none(0);
    checkPieces(none, 0);
    checkPieces(none, 5);
  }
  ThreadPool pool(3);
  for (int n : {0, 1, 2, 3, 4, 7, 100}) checkPieces(pool, n);

  // Several callers at once, as when several replicas reduce together.
  std::vector<std::thread> callers;
  std::atomic<int> callerFailures{0};
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < 300; ++i) {
        const int n = 1 + static_cast<int>(rng() % 16);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        for (auto& h : hits) h = 0;
        pool.parallelFor(n, [&](int p) { hits[static_cast<size_t>(p)]++; });
        for (auto& h : hits) callerFailures += h != 1;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT(callerFailures == 0, "%d pieces lost or repeated under concurrent callers",
         callerFailures.load());

  // Exceptions: every piece still runs, the exception reaches the caller.
  std::atomic<int> ran{0};
  const std::string msg = expectThrows<std::runtime_error>(
      [&] {
        pool.parallelFor(10, [&](int p) {
          ran++;
          if (p == 5) throw std::runtime_error("piece 5");
        });
      },
      "throwing piece");
  EXPECT(msg == "piece 5" && ran == 10, "msg '%s', ran %d of 10", msg.c_str(), ran.load());

  // A piece may itself call parallelFor on the same pool: the caller runs what nobody takes.
  std::atomic<int> inner{0};
  pool.parallelFor(4, [&](int) { pool.parallelFor(4, [&](int) { inner++; }); });
  EXPECT(inner == 16, "nested parallelFor ran %d of 16", inner.load());

  // Pools start and stop cleanly, also right after work.
  for (int i = 0; i < 20; ++i) {
    ThreadPool p(2);
    if (i % 2) checkPieces(p, 8);
  }

  // The shared pool, then fork(): the child must neither hang in parallelFor nor at exit.
  checkPieces(ThreadPool::reductionPool(), 16);
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    alarm(20);  // a hang becomes SIGALRM, which the parent reports
    std::atomic<int> hits{0};
    ThreadPool::reductionPool().parallelFor(8, [&](int) { hits++; });
    std::exit(hits == 8 ? 0 : 3);  // exit() runs the pool's destructor in the child
  }
  int status = 0;
  EXPECT(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
             WEXITSTATUS(status) == 0,
         "forked child: status 0x%x", status);

  // reduceParallel from several threads at once on the shared pool.
  const size_t n = (1u << 20) + 3;
  std::vector<std::thread> reducers;
  std::atomic<int> reduceFailures{0};
  const ReduceFn sum = lookupReduce(DType::kInt32, ReduceOp::kSum);
  for (int t = 0; t < 4; ++t) {
    reducers.emplace_back([&, t] {
      std::vector<int32_t> a(n), b(n);
      for (size_t i = 0; i < n; ++i) a[i] = static_cast<int32_t>(i) * (t + 1), b[i] = 7;
      for (int rep = 0; rep < 5; ++rep) reduceParallel(sum, a.data(), a.data(), b.data(), n, 4, 2);
      for (size_t i = 0; i < n; ++i) {
        reduceFailures += a[i] != static_cast<int32_t>(i) * (t + 1) + 35;
      }
    });
  }
  for (auto& r : reducers) r.join();
  EXPECT(reduceFailures == 0, "%d wrong elements from concurrent reduceParallel",
         reduceFailures.load());
}

// ---------------------------------------------------------------------------------------------
// Benchmark: float32 sum over 64 MiB (dst == a, as a collective reduces into its buffer) against
// memcpy of the same 64 MiB. GB/s is per buffer size (what the collective sees) and per memory
// traffic (sum reads a and b and writes a, 3 x 64 MiB; memcpy moves 2 x 64 MiB).

template <typename F>
double bestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  return best;
}

void report(const char* what, size_t bytes, int streams, double s) {
  std::printf("  %-36s %7.2f ms  %6.1f GB/s buffer  %6.1f GB/s traffic\n", what, s * 1e3,
              bytes / s / 1e9, streams * bytes / s / 1e9);
}

int runBench() {
  const size_t bytes = size_t{64} << 20;
  const int reps = 15;
  std::vector<char> a(bytes), b(bytes), c(bytes);
  std::mt19937_64 rng(1);
  // Small floats so that repeated sums stay finite; the pages get touched here, not in timing.
  for (size_t i = 0; i < bytes / 4; ++i) {
    store(a.data(), i, 1.0f + (i % 13) * 0.25f);
    store(b.data(), i, 0.5f - (i % 7) * 0.125f);
  }
  std::memcpy(c.data(), a.data(), bytes);
  std::printf("simd level %s, %zu MiB per buffer, best of %d\n", simdLevel(), bytes >> 20, reps);
  const ReduceFn sum = lookupReduce(DType::kFloat32, ReduceOp::kSum);
  report("memcpy", bytes, 2, bestSeconds(reps, [&] { std::memcpy(c.data(), b.data(), bytes); }));
  report("float32 sum, dst==a", bytes, 3,
         bestSeconds(reps, [&] { sum(a.data(), a.data(), b.data(), bytes / 4); }));
  report("float32 sum, dst!=a", bytes, 3,
         bestSeconds(reps, [&] { sum(c.data(), a.data(), b.data(), bytes / 4); }));
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  char label[64];
  std::snprintf(label, sizeof label, "float32 sum, dst==a, %d threads", cpus);
  report(label, bytes, 3, bestSeconds(reps, [&] {
           reduceParallel(sum, a.data(), a.data(), b.data(), bytes / 4, 4, cpus);
         }));
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const uint16_t x = dt == DType::kFloat16 ? 0x3C00 : 0x3F80;
    const uint16_t y = dt == DType::kFloat16 ? 0x1400 : 0x3A80;  // small, stays finite
    for (size_t i = 0; i < bytes / 2; ++i) store(a.data(), i, x), store(b.data(), i, y);
    const ReduceFn hsum = lookupReduce(dt, ReduceOp::kSum);
    std::snprintf(label, sizeof label, "%s sum, dst==a", dtypeName(dt));
    report(label, bytes, 3,
           bestSeconds(reps, [&] { hsum(a.data(), a.data(), b.data(), bytes / 2); }));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--print-simd") {
    std::printf("%s\n", simdLevel());
    return 0;
  }
  if (mode == "--bench") return runBench();
  if (mode == "--require-simd" && argc > 2) {
    // ctest runs one test per kernel set (PYCOLLECTIVE_SIMD=LEVEL); a CPU without that set
    // falls back to a lower one, and the test is skipped (77), not run twice at one level.
    if (std::string(simdLevel()) != argv[2]) {
      std::printf("skipped: this CPU runs '%s', not '%s'\n", simdLevel(), argv[2]);
      return 77;
    }
  } else if (!mode.empty()) {
    std::fprintf(stderr, "usage: %s [--print-simd | --bench | --require-simd LEVEL]\n", argv[0]);
    return 2;
  }
  alarm(600);  // nothing here may hang: a deadlock kills the test instead

  const auto t0 = std::chrono::steady_clock::now();
  std::printf("simd level: %s\n", simdLevel());
  testConversions();
  testKernels({0, 1, 7, 31, 1000, (size_t{1} << 20) + 3});
  testScale({0, 1, 7, 31, 1000, 100003});
  testErrors();
  testThreadPool();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %d checks, %d failures (%.1f s)\n", gFailures ? "FAILED" : "PASSED", gChecks,
              gFailures, s);
  return gFailures ? 1 : 0;
}

// The AVX-512 kernel table. The build compiles files ending in _avx512.cc with -mavx512f
// -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; the check below turns a build that forgot them
// into an error instead of a mislabelled table.
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || \
    !defined(__AVX512DQ__) || !defined(__FMA__) || !defined(__F16C__)
#error "reduce_cpu_avx512.cc needs -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c"
#endif
#define PC_REDUCE_ISA_NS avx512
#include "reduce/reduce_cpu_impl.h"

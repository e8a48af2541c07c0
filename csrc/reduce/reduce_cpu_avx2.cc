// The AVX2 kernel table. The build compiles files ending in _avx2.cc with -mavx2 -mfma -mf16c;
// the check below turns a build that forgot them into an error instead of a mislabelled table.
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "reduce_cpu_avx2.cc must be compiled with -mavx2 -mfma -mf16c"
#endif
#define PC_REDUCE_ISA_NS avx2
#include "reduce/reduce_cpu_impl.h"

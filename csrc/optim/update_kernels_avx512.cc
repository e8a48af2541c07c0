// The AVX-512 update kernels; compiled with the flags of reduce/reduce_cpu_avx512.cc.
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "update_kernels_avx512.cc must be compiled with -mavx512f -mfma"
#endif
#define PC_UPDATE_ISA_NS avx512
#include "optim/update_kernels_impl.h"

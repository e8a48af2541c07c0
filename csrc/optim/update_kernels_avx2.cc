// The AVX2 update kernels; compiled with the flags of reduce/reduce_cpu_avx2.cc.
#if !defined(__AVX2__) || !defined(__FMA__)
#error "update_kernels_avx2.cc must be compiled with -mavx2 -mfma"
#endif
#define PC_UPDATE_ISA_NS avx2
#include "optim/update_kernels_impl.h"

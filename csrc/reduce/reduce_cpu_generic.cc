// The baseline kernel table: the compiler's default target (SSE2 on x86-64), and the only one on
// other architectures. The dispatcher uses it when the CPU has neither AVX2 nor AVX-512.
#define PC_REDUCE_ISA_NS generic
#include "reduce/reduce_cpu_impl.h"

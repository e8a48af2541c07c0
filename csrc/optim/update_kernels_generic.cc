// The baseline update kernels: the compiler's default target (SSE2 on x86-64), and the only ones
// on other architectures.
#define PC_UPDATE_ISA_NS generic
#include "optim/update_kernels_impl.h"

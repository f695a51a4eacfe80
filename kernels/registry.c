/*
 * registry.c - hands out the backend op tables. The only place outside meson that knows
 * whether this build has CUDA: everything else asks flexdiag__have_cuda() or gets NULL from
 * flexdiag__kernels_cuda() and stays on one orchestration path.
 */
#include "kernels/config.h"
#include "kernels/kernels.h"

#if FLEXDIAG_HAVE_CUDA
const flexdiag_kernels *flexdiag__kernels_cuda_table(void); /* kernels/cuda/kernels_cuda.cu */
#endif

const flexdiag_kernels *flexdiag__kernels_cuda(void) {
#if FLEXDIAG_HAVE_CUDA
    return flexdiag__kernels_cuda_table();
#else
    return NULL;
#endif
}

int flexdiag__have_cuda(void) { return FLEXDIAG_HAVE_CUDA; }

/* backend_cuda.cu: kern_backend_cuda for the CUDA build (see kernels/backend.h).
 *
 * What it is: the CUDA row of the ops' backend table. available() asks the
 * CUDA runtime for a device and, when there is none (or no driver), answers
 * false with the CUDA error name, e.g. "cudaErrorNoDevice: no CUDA-capable
 * device is detected (100) from cudaGetDeviceCount".
 *
 * What it is not, yet: any kernel. Every run slot is NULL, so the op harness
 * lists each op as "not implemented on cuda"; a twin fills its slot
 * (run[OP_ID_<op>] = <family>_cuda_run) beside its kernels/<family>.cu.
 * cpu_bits is false: a twin is compared with the CPU under a tolerance
 * unless it promises the CPU's bits.
 *
 * Test: tests/test_backend_ops.c.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/backend.h"

static bool cuda_available(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* clear it */
    if (why && len)
      snprintf(why, len, "%s: %s (%d) from cudaGetDeviceCount", cudaGetErrorName(e), cudaGetErrorString(e), (int)e);
    return false;
  }
  if (n < 1) {
    if (why && len) snprintf(why, len, "cudaGetDeviceCount found no CUDA device");
    return false;
  }
  if (why && len) why[0] = '\0';
  return true;
}

/* By position (C++17): name, available, cpu_bits, run (all NULL for now). */
extern "C" const struct op_backend kern_backend_cuda = {"cuda", cuda_available, false, {}};

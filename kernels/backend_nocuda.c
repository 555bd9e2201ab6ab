/* backend_nocuda.c: kern_backend_cuda for the CPU-only build (CEDAR_CUDA=OFF).
 *
 * It is in the table so callers list backends the same way in every build;
 * available() says "built without CUDA" and every run slot is NULL.
 * Not a stub to fill in: CUDA twins go to kernels/backend_cuda.cu.
 * Test: tests/test_backend_ops.c (reports cuda as skipped here).
 */
#include <stdio.h>

#include "kernels/backend.h"

static bool no_cuda(char *why, size_t len) {
  if (why && len) snprintf(why, len, "built without CUDA (reconfigure with -DCEDAR_CUDA=ON and nvcc on PATH)");
  return false;
}

const struct op_backend kern_backend_cuda = {.name = "cuda", .available = no_cuda, .cpu_bits = false};

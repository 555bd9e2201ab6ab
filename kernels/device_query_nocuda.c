/* device_query_nocuda.c: kernels/device.h for the CPU-only build
 * (CEDAR_CUDA=OFF). Every query answers KERN_DEVICE_ENOCUDA with the text
 * "not built with CUDA", so callers print one reason whatever the build.
 *
 * Not a stub to fill in: the CUDA build uses kernels/device_query.cu instead.
 * Test: tests/test_gpu_device.c (exits 77 here).
 */
#include <stdio.h>

#include "kernels/device.h"

static int no_cuda(char *err, size_t errlen) {
  if (err && errlen)
    snprintf(err, errlen, "not built with CUDA (reconfigure with -DCEDAR_CUDA=ON and nvcc on PATH)");
  return KERN_DEVICE_ENOCUDA;
}

int kern_device_query(struct kern_device_info *out, int max, char *err, size_t errlen) {
  (void)out;
  (void)max;
  return no_cuda(err, errlen);
}

int kern_cuda_version(int *runtime, int *driver, char *err, size_t errlen) {
  *runtime = 0;
  *driver = 0;
  return no_cuda(err, errlen);
}

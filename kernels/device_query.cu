/* device_query.cu: kern_device_query and kern_cuda_version with the CUDA
 * runtime API (see kernels/device.h).
 *
 * Not a kernel file: nothing here runs on the GPU. It is the smallest CUDA
 * translation unit in cedar, so the CUDA build proves nvcc, the host compiler
 * and CUDA::cudart link together even on machines without a GPU.
 *
 * Errors are returned, not aborted on (unlike the CHECK tier for kernels):
 * "no device" is a normal answer here. CUDA 13 removed several cudaDeviceProp
 * fields (computeMode, clockRate, ...), so those come from
 * cudaDeviceGetAttribute.
 *
 * Test: tests/test_gpu_device.c (exits 77 without a device); `cedar env`.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/device.h"

/* Write "<cudaErrorName>: <string> (<code>) from <call>" to err. */
static int fail(cudaError_t e, const char *call, char *err, size_t errlen) {
  if (err && errlen)
    snprintf(err, errlen, "%s: %s (%d) from %s", cudaGetErrorName(e), cudaGetErrorString(e),
             (int)e, call);
  return KERN_DEVICE_ECUDA;
}

#define QUERY(call)                                  \
  do {                                               \
    cudaError_t _kern_e = (call);                    \
    if (_kern_e != cudaSuccess) {                    \
      (void)cudaGetLastError(); /* clear it */       \
      return fail(_kern_e, #call, err, errlen);      \
    }                                                \
  } while (0)

static int query_one(int dev, struct kern_device_info *d, char *err, size_t errlen) {
  cudaDeviceProp p;
  QUERY(cudaGetDeviceProperties(&p, dev));
  memset(d, 0, sizeof *d);
  d->index = dev;
  snprintf(d->name, sizeof d->name, "%s", p.name);
  d->cc_major = p.major;
  d->cc_minor = p.minor;
  d->total_mem = p.totalGlobalMem;
  d->sm_count = p.multiProcessorCount;
  d->pci_domain = p.pciDomainID;
  d->pci_bus = p.pciBusID;
  d->pci_device = p.pciDeviceID;
  QUERY(cudaDeviceGetAttribute(&d->clock_khz, cudaDevAttrClockRate, dev));
  QUERY(cudaDeviceGetAttribute(&d->compute_mode, cudaDevAttrComputeMode, dev));
  return 0;
}

extern "C" int kern_device_query(struct kern_device_info *out, int max, char *err,
                                 size_t errlen) {
  if (err && errlen) err[0] = '\0';
  int n = 0;
  QUERY(cudaGetDeviceCount(&n));
  for (int i = 0; i < n && i < max; i++) {
    int rc = query_one(i, &out[i], err, errlen);
    if (rc < 0) return rc;
  }
  return n;
}

extern "C" int kern_cuda_version(int *runtime, int *driver, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  *runtime = 0;
  *driver = 0;
  QUERY(cudaRuntimeGetVersion(runtime));
  QUERY(cudaDriverGetVersion(driver)); /* succeeds with 0 when no driver is loaded */
  return 0;
}

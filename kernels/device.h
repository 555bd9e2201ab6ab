/* device.h: what CUDA devices this process can see, as a plain C API.
 *
 * This is a query, not a runtime: it creates no streams and launches nothing.
 * kernels/device_query.cu implements it with the CUDA runtime API;
 * kernels/device_query_nocuda.c is the CPU-only build's twin, which reports
 * "not built with CUDA". Both return rather than abort: having no GPU (or no
 * driver) is an ordinary state, and callers (`cedar env`, GPU tests that exit
 * 77) need the reason as text.
 *
 * Used by cli/cmd_env.c; tested by tests/test_gpu_device.c.
 */
#ifndef CEDAR_KERN_DEVICE_H
#define CEDAR_KERN_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Negative returns of the kern_device_* and kern_cuda_* calls. */
enum {
  KERN_DEVICE_ENOCUDA = -1, /* cedar was built without CUDA (CEDAR_CUDA=OFF) */
  KERN_DEVICE_ECUDA = -2,   /* a CUDA runtime call failed; err says which and why */
};

struct kern_device_info {
  int index;              /* CUDA device ordinal */
  char name[256];         /* e.g. "NVIDIA H200" */
  int cc_major, cc_minor; /* compute capability */
  size_t total_mem;       /* global memory, bytes */
  int sm_count;           /* streaming multiprocessors */
  int clock_khz;          /* peak SM clock (cudaDevAttrClockRate) */
  int compute_mode;       /* cudaComputeMode value (0 = default) */
  int pci_domain, pci_bus, pci_device;
};

/* Fill out[0 .. min(count, max)-1] and return the device count (which may
 * exceed max). On failure return KERN_DEVICE_ENOCUDA or KERN_DEVICE_ECUDA and
 * write a one-line reason to err: for CUDA failures it starts with the CUDA
 * error name, e.g. "cudaErrorInsufficientDriver: CUDA driver version is
 * insufficient for CUDA runtime version (35) from cudaGetDeviceCount". out may
 * be NULL when max is 0; err may be NULL when errlen is 0. */
int kern_device_query(struct kern_device_info *out, int max, char *err, size_t errlen);

/* The CUDA runtime version cedar was linked against and the driver's version,
 * both encoded as 1000 * major + 10 * minor (driver 0 = no driver loaded).
 * Returns 0, or KERN_DEVICE_ENOCUDA / KERN_DEVICE_ECUDA with err filled. */
int kern_cuda_version(int *runtime, int *driver, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif

/* kcall.cuh: one op-level call of a CUDA twin (kernels/backend.h's slots):
 * the device buffers it uploads and allocates on one stream, its CUDA error
 * reported through the op's io in one line, and everything freed at the end.
 *
 *   struct kcall c;
 *   kcall_begin(&c, self, io);
 *   const float *x_d = (const float *)kcall_upload(&c, x->data, bytes, "x");
 *   float *y_d = (float *)kcall_alloc(&c, ybytes, "y");
 *   if (kcall_ok(&c)) { kern_<op>(y_d, x_d, ..., c.stream); kcall_launched(&c, "<kernel>"); }
 *   kcall_download(&c, y, y_d, ybytes, "y");
 *   return kcall_end(&c);        // synchronizes, frees; 0 or the first error's status
 *
 * After the first failure every later step does nothing, so a slot reads
 * straight through. Errors: "<op> on cuda: <cudaErrorName>: <text> (<step>)",
 * status CEDAR_EIO (a device failure is not bad input). Input checks stay the
 * op's own (the shared ops/ prepare functions) and run before kcall_begin.
 *
 * What it is not: the runtime's device state. The node-level path (runtime/,
 * the `cuda` engineer's) keeps pools and weights resident and calls the
 * kern_<op> launchers on StarPU's stream directly; this is the op harness's
 * host-memory convenience (tests/test_backend_ops.c, `cedar op --device`).
 */
#ifndef CEDAR_KERN_KCALL_CUH
#define CEDAR_KERN_KCALL_CUH

#include <cuda_runtime.h>
#include <stddef.h>

#include "ops/registry.h"

enum { KCALL_MAX_BUFS = 32 };

struct kcall {
  const struct op_desc *self;
  struct op_io *io;
  cudaStream_t stream;
  void *buf[KCALL_MAX_BUFS];
  int n_buf;
  int rc; /* 0, or the first failure's status */
};

void kcall_begin(struct kcall *c, const struct op_desc *self, struct op_io *io);
/* A device copy of bytes at host (nothing for 0 bytes: returns a valid
 * dummy), or NULL after a failure. */
void *kcall_upload(struct kcall *c, const void *host, size_t bytes, const char *what);
/* Zeroed device memory, or NULL after a failure. */
void *kcall_alloc(struct kcall *c, size_t bytes, const char *what);
/* Record a launch's error (cudaGetLastError) under the kernel's name. */
void kcall_launched(struct kcall *c, const char *kernel);
/* Check a CUDA call's status (a library call mapped to cudaError_t by the caller). */
bool kcall_cuda(struct kcall *c, cudaError_t e, const char *what);
/* A failure that is not a cudaError_t (cuBLAS): message and status. */
void kcall_fail(struct kcall *c, int status, const char *what, const char *detail);
void kcall_download(struct kcall *c, void *host, const void *dev, size_t bytes, const char *what);
static inline bool kcall_ok(const struct kcall *c) { return c->rc == 0; }
int kcall_end(struct kcall *c);

/* Blocks of `threads` covering n items (at least 1 block; n fits int). */
static inline unsigned kcall_blocks(long long n, int threads) {
  long long b = (n + threads - 1) / threads;
  return (unsigned)(b > 0 ? b : 1);
}

#endif

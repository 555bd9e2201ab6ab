/* kcall.cu: the op-level call helper of the CUDA twins (see kcall.cuh). */
#include "kernels/kcall.cuh"

#include <stdio.h>

#include "base/check.h"

void kcall_begin(struct kcall *c, const struct op_desc *self, struct op_io *io) {
  c->self = self, c->io = io, c->n_buf = 0, c->rc = 0, c->stream = 0;
  kcall_cuda(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

void kcall_fail(struct kcall *c, int status, const char *what, const char *detail) {
  if (c->rc) return;
  char msg[384];
  snprintf(msg, sizeof msg, "%s on cuda: %s (%s)", c->self->name, detail, what);
  c->io->fail(c->io, msg);
  c->rc = status;
}

bool kcall_cuda(struct kcall *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  char detail[256];
  snprintf(detail, sizeof detail, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaGetLastError(); /* clear a sticky launch error's record */
  kcall_fail(c, CEDAR_EIO, what, detail);
  return false;
}

void *kcall_alloc(struct kcall *c, size_t bytes, const char *what) {
  if (c->rc) return NULL;
  if (c->n_buf == KCALL_MAX_BUFS) {
    kcall_fail(c, CEDAR_ENOMEM, what, "more device buffers than one call may hold");
    return NULL;
  }
  void *p = NULL;
  if (!kcall_cuda(c, cudaMallocAsync(&p, bytes ? bytes : 16, c->stream), what)) return NULL;
  c->buf[c->n_buf++] = p;
  if (!kcall_cuda(c, cudaMemsetAsync(p, 0, bytes ? bytes : 16, c->stream), what)) return NULL;
  return p;
}

void *kcall_upload(struct kcall *c, const void *host, size_t bytes, const char *what) {
  void *p = kcall_alloc(c, bytes, what);
  if (p && bytes && !kcall_cuda(c, cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, c->stream), what))
    return NULL;
  return p;
}

void kcall_launched(struct kcall *c, const char *kernel) {
  if (!c->rc) kcall_cuda(c, cudaGetLastError(), kernel);
}

void kcall_download(struct kcall *c, void *host, const void *dev, size_t bytes, const char *what) {
  if (c->rc || !bytes) return;
  kcall_cuda(c, cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, c->stream), what);
}

int kcall_end(struct kcall *c) {
  if (c->stream) {
    if (!c->rc) kcall_cuda(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    for (int i = 0; i < c->n_buf; i++) (void)cudaFreeAsync(c->buf[i], c->stream);
    (void)cudaStreamSynchronize(c->stream);
    (void)cudaStreamDestroy(c->stream);
  }
  c->n_buf = 0, c->stream = 0;
  return c->rc;
}

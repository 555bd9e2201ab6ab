/* runtime/comm/nccl_nocuda.c: runtime/comm/nccl.h for the CPU-only build: no pair can be
 * opened ("built without CUDA"). Not a stub to fill in: CUDA builds use
 * runtime/comm/nccl_cuda.c. */
#include <stdio.h>

#include "base/check.h"
#include "runtime/comm/nccl.h"

int comm_nccl_open(struct comm_nccl_pair **out, int src_dev, int dst_dev, char *err, size_t err_len) {
  (void)src_dev, (void)dst_dev;
  *out = NULL;
  snprintf(err, err_len, "built without CUDA: NCCL transfers need -DCEDAR_CUDA=ON and NCCL");
  return CEDAR_EUNSUPPORTED;
}
void comm_nccl_close(struct comm_nccl_pair *p) { (void)p; }
int comm_nccl_submit(struct comm_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len) {
  (void)p, (void)src_handle, (void)dst_handle, (void)bytes;
  snprintf(err, err_len, "built without CUDA");
  return CEDAR_EUNSUPPORTED;
}
int comm_nccl_built(void) { return 0; }

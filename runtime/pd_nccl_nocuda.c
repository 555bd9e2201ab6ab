/* pd_nccl_nocuda.c: runtime/pd_nccl.h for the CPU-only build: no pair can be
 * opened ("built without CUDA"). Not a stub to fill in: CUDA builds use
 * pd_nccl_cuda.c. */
#include <stdio.h>

#include "base/check.h"
#include "runtime/pd_nccl.h"

int rt_nccl_pair_open(struct rt_nccl_pair **out, int src_dev, int dst_dev, char *err, size_t err_len) {
  (void)src_dev, (void)dst_dev;
  *out = NULL;
  snprintf(err, err_len, "built without CUDA: NCCL transfers need -DCEDAR_CUDA=ON and NCCL");
  return CEDAR_EUNSUPPORTED;
}
void rt_nccl_pair_close(struct rt_nccl_pair *p) { (void)p; }
int rt_nccl_submit(struct rt_nccl_pair *p, void *src_handle, void *dst_handle, size_t bytes, char *err,
                   size_t err_len) {
  (void)p, (void)src_handle, (void)dst_handle, (void)bytes;
  snprintf(err, err_len, "built without CUDA");
  return CEDAR_EUNSUPPORTED;
}
int rt_nccl_built(void) { return 0; }

/* cuda_graph_nocuda.c: runtime/device/cuda_graph.h for the CPU-only build
 * (CEDAR_CUDA=OFF): a cache cannot be opened ("built without CUDA"), so
 * nothing else is ever reached with one.
 * Not a stub to fill in: the CUDA build uses cuda_graph_cuda.c.
 * Test: tests/test_devstate.c (the refusal). */
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "runtime/device/cuda_graph.h"

int rt_cugraph_cache_open(struct rt_cugraph_cache **out, int dev, size_t param_bytes, char *err, size_t err_len) {
  (void)dev, (void)param_bytes;
  *out = NULL;
  snprintf(err, err_len, "built without CUDA: CUDA graphs need a build configured with -DCEDAR_CUDA=ON");
  return CEDAR_EUNSUPPORTED;
}
void rt_cugraph_cache_close(struct rt_cugraph_cache *c) { (void)c; }
int rt_cugraph_run(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k, rt_segment_fn fn, void *arg,
                 const void *hp, void *stream, bool graph, char *err, size_t err_len) {
  (void)c, (void)k, (void)fn, (void)arg, (void)hp, (void)stream, (void)graph;
  snprintf(err, err_len, "built without CUDA");
  return CEDAR_EUNSUPPORTED;
}
void *rt_cugraph_params(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k) { return (void)c, (void)k, NULL; }
struct rt_cugraph_stats rt_cugraph_cache_stats(const struct rt_cugraph_cache *c) {
  (void)c;
  struct rt_cugraph_stats s;
  memset(&s, 0, sizeof s);
  return s;
}

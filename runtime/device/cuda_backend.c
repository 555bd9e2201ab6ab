/* cuda_backend.c: the CUDA backend's table (runtime/node/backend.h), its
 * registration, and whether CUDA can run nodes here (cuda_backend.h). In
 * a CUDA build the table holds the op groups of node_cuda.h, every slot but
 * TRANSFER; without CUDA every slot is NULL, so a plan that places a flow
 * on cuda is refused by the placement check instead of running on the CPU.
 * Test: tests/test_backend_nodes.c. */
#include "runtime/device/cuda_backend.h"

#include <stdio.h>

#include "base/check.h"
#include "kernels/device.h"
#include "runtime/device/node_cuda.h"

#ifdef CEDAR_HAVE_CUDA
const struct rt_backend rt_backend_cuda = {
    .name = "cuda",
    .dev = GRAPH_DEV_CUDA,
    .run = {
        [GRAPH_EMBED] = rt_cuda_embed,
        [GRAPH_ENGRAM_GATHER] = rt_cuda_engram_rows,
        [GRAPH_ENGRAM] = rt_cuda_engram,
        [GRAPH_ATTN] = rt_cuda_attn,
        [GRAPH_MOE] = rt_cuda_moe,
        [GRAPH_DEC_KV] = rt_cuda_dec_kv,
        [GRAPH_KEEP_XE] = rt_cuda_keep_xe,
        [GRAPH_REPLAY_IN] = rt_cuda_replay_in,
        [GRAPH_HEAD] = rt_cuda_head,
        [GRAPH_MOE_SHARD] = rt_cuda_moe_shard,
        [GRAPH_MOE_SUM] = rt_cuda_moe_sum,
    },
    .why = rt_cuda_node_why,
};
#else
const struct rt_backend rt_backend_cuda = {.name = "cuda", .dev = GRAPH_DEV_CUDA};
#endif

void rt_device_register(void) { rt_backend_set(&rt_backend_cuda); }

int rt_cuda_ready(char *err, size_t err_len) {
  rt_device_register();
  char why[512] = "";
  int n = kern_device_query(NULL, 0, why, sizeof why);
  if (n < 0) {
    snprintf(err, err_len, "no CUDA device: %s", why);
    return CEDAR_EUNSUPPORTED;
  }
  if (n == 0) {
    snprintf(err, err_len, "no CUDA device: the CUDA runtime reports 0 devices");
    return CEDAR_EUNSUPPORTED;
  }
  char list[512];
  int missing = rt_backend_missing(&rt_backend_cuda, false, list, sizeof list);
  if (missing) {
    snprintf(err, err_len, "this build has no CUDA entry for %d of cedar's op groups (%s)%s", missing, list,
#ifdef CEDAR_HAVE_CUDA
             ""
#else
             ": it was built without CUDA (configure with -DCEDAR_CUDA=ON where nvcc is installed)"
#endif
    );
    return CEDAR_EUNSUPPORTED;
  }
  return 0;
}

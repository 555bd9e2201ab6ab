/* ep_nccl.c: expert dispatch and combine between two GPUs of one process
 * over NCCL (expert_par.h, "NCCL"): when a dispatch packet or a shard's
 * outputs and its copy both live in CUDA memory of one rank, on two
 * devices, the TRANSFER is an NCCL send on the source GPU and a receive
 * on the destination GPU (runtime/comm/nccl.h: two StarPU tasks on the two
 * devices' CUDA workers, the copy's handle written, so its readers wait
 * for the receive). What travels is the packet's bound (graph_data.bytes):
 * its used length is in the header in device memory, and both sides of an
 * NCCL pair must agree on the count before either runs.
 *
 * What has run: nothing. It compiles in the CUDA build against NCCL (and
 * against runtime/comm/nccl_nocuda.c without CUDA); its refusals are tested
 * (tests/test_ep.c). No executor calls it yet: the plan language places
 * expert shards on ranks, not on devices of one rank, and CUDA stages are
 * refused (runtime/dist/pipeline.c), so no graph has such a transfer today.
 */
#include <stdio.h>

#include "base/check.h"
#include "runtime/dist/expert_par.h"
#include "runtime/comm/nccl.h"

bool rt_ep_nccl_wanted(const struct graph *g, const struct graph_node *nd) {
  if (nd->op != GRAPH_TRANSFER || !(nd->flags & GRAPH_F_EP) || nd->xfer_src < 0 || nd->xfer_dst < 0) return false;
  struct graph_place a = g->data[nd->xfer_src].home, b = g->data[nd->xfer_dst].home;
  return a.dev == GRAPH_DEV_CUDA && b.dev == GRAPH_DEV_CUDA && a.rank == b.rank && a.dev_id != b.dev_id;
}

int rt_ep_nccl_open(struct comm_nccl_pair **pair, const struct graph *g, const struct graph_node *nd, char *err,
                    size_t err_len) {
  *pair = NULL;
  if (!rt_ep_nccl_wanted(g, nd)) {
    snprintf(err, err_len, "%s: not an expert transfer between two GPUs of one rank: it goes through StarPU-MPI "
             "or a copy", nd->name);
    return CEDAR_EINVAL;
  }
  int rc = comm_nccl_open(pair, g->data[nd->xfer_src].home.dev_id, g->data[nd->xfer_dst].home.dev_id, err,
                             err_len);
  return rc ? CEDAR_EUNSUPPORTED : 0;
}

int rt_ep_nccl_submit(struct comm_nccl_pair *pair, const struct graph *g, const struct graph_node *nd,
                      void *src_handle, void *dst_handle, char *err, size_t err_len) {
  if (!pair || !rt_ep_nccl_wanted(g, nd)) {
    snprintf(err, err_len, "%s: no NCCL pair for this transfer (rt_ep_nccl_open)", nd->name);
    return CEDAR_EINVAL;
  }
  return comm_nccl_submit(pair, src_handle, dst_handle, (size_t)g->data[nd->xfer_src].bytes, err, err_len);
}

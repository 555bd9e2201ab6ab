/* exec_dev.c: the direct executor on a device home (exec.h:
 * rt_exec_direct_dev). One thread, graph order, as exec_direct.c, with:
 *
 *   state        the request's twin in the device slabs (runtime/device/devbind.h):
 *                claimed (and the host state uploaded) the first time the
 *                request runs there; every KV page the graph appends to is
 *                reserved first, so the twin holds it; after each node the
 *                host keeps the metadata it changed (rt_dev_node_done).
 *   activations  at fixed offsets of the device's activation slab (data id
 *                order, each RT_DEV_ALIGN-aligned: the same addresses for
 *                every graph of one shape, which a captured segment bakes
 *                in); from the device's allocator when the slab is too small
 *                (then no segment is captured).
 *   segments     a decode step's layer segments (runtime/exec/devseg.h) through
 *                the CUDA graph cache (rt_cugraph_run): the parameter block is
 *                filled from the lead node's step, the segment is captured
 *                once per key and replayed, or run eagerly (the same
 *                callback on the caller's stream) when graphs are off. A
 *                replay runs no host code, so the metadata its nodes leave
 *                is applied from the graph (rt_dev_node_advance) in both
 *                modes, the same way. The host stand-in has no graph cache:
 *                it calls the segment in place with a host parameter block.
 *   the end      the device's sync: the run's kernels are done and its
 *                logits are on the host when this returns. The state's bytes
 *                stay on the device (rt_dev_request_download brings them).
 *
 * Node times are host times around the launches (kernels are asynchronous
 * on a CUDA home); the graph's wall time includes the final sync.
 * Test: tests/test_devbind.c (the host-memory stand-in, every node bound
 * here, bitwise the host run); on a GPU, tests/gpu/run.sh.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "runtime/node/backend.h"
#include "runtime/device/devbind.h"
#include "runtime/exec/devseg.h"
#include "runtime/exec/exec.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Activations and buses of g: in the slab when it holds them all (true),
 * else from the allocator. CEDAR_ENOMEM naming the buffer when one cannot
 * be had. */
static int dev_bufs(const struct graph *g, const struct rt_dev_ctx *dv, void **buf, bool *slab, int64_t *bytes,
                    char *err, size_t err_len) {
  *slab = rt_dev_act_slab(dv, g, buf);
  *bytes = 0;
  for (int d = 0; d < g->n_data; d++) {
    const struct graph_data *gd = &g->data[d];
    if (gd->kind != GRAPH_ACT && gd->kind != GRAPH_BUS) continue;
    if (!*slab) buf[d] = dv->ops->alloc((size_t)gd->bytes);
    *bytes += gd->bytes;
    if (!buf[d]) {
      snprintf(err, err_len, "out of %s memory for %s (%lld bytes); this request is dropped", dv->ops->name,
               gd->name, (long long)gd->bytes);
      return CEDAR_ENOMEM;
    }
  }
  return 0;
}

static void count_node(struct rt_exec_stats *st, const struct graph_node *nd, double t) {
  if (!st) return;
  st->op_seconds[nd->op] += t;
  st->op_nodes[nd->op]++;
  st->nodes++;
  if (nd->op == GRAPH_ATTN) st->token_layers += nd->n;
}

int rt_exec_direct_dev(const struct graph *g, const struct rt_model *M, struct rt_request *r,
                       struct rt_exec_out *out, struct rt_exec_stats *st, rt_progress_cb progress, void *user,
                       char *err, size_t err_len) {
  struct rt_dev_ctx *dv = M->dev;
  double t0 = now_s();
  int short_k = rt_reserve_pages(g, r);
  if (short_k >= 0) {
    rt_node_error(&g->node[short_k], CEDAR_ENOMEM, err, err_len);
    return CEDAR_ENOMEM;
  }
  struct rt_dev_twin *tw = rt_dev_request_twin(dv, r, err, err_len);
  if (!tw) return CEDAR_ENOMEM;
  size_t nd_ = (size_t)(g->n_data > 0 ? g->n_data : 1), nn = (size_t)(g->n_node > 0 ? g->n_node : 1);
  void **buf = cedar_xcalloc(nd_, sizeof(*buf));
  int64_t *out_row = cedar_xcalloc(nn, sizeof(*out_row));
  int *seg_end = cedar_xcalloc(nn, sizeof(*seg_end));
  bool slab;
  int64_t act_bytes;
  int rc = dev_bufs(g, dv, buf, &slab, &act_bytes, err, err_len);
  for (int k = 0, row = 0; k < g->n_node; k++) {
    out_row[k] = row;
    if (g->node[k].op == GRAPH_HEAD) row += g->node[k].n;
  }
  if (dv->segments && slab) rt_dev_segments(g, seg_end); /* else every node alone, eagerly */
  struct rt_arena ar;
  rt_arena_init(&ar, 0);
  for (int k = 0; k < g->n_node && rc == 0;) {
    const struct graph_node *nd = &g->node[k];
    double t = now_s();
    if (seg_end[k] > k) { /* a decode segment through the graph cache */
      struct rt_dev_seg S = {g, M, r, dv, tw, buf, out, &ar, dv->cw_direct, k, seg_end[k], 0, 0};
      rc = rt_dev_seg_run(&S, dv->graphs, dv->graphs_on, NULL, err, err_len);
      dv->segment_runs += !rc;
      double each = (now_s() - t) / (S.k1 - k);
      for (int j = k; j < S.k1; j++) count_node(st, &g->node[j], each);
      k = S.k1;
    } else {
      struct rt_bound bs;
      rt_dev_bind_node(tw, g, r, nd, &bs);
      struct rt_cuda_env env;
      const struct rt_node_dev nd_dev = {NULL, NULL, rt_dev_env(dv, tw, dv->cw_direct, &env)};
      rc = rt_run_node_dev(g, M, r, nd, buf, &bs, out, out_row[k], &ar, &nd_dev);
      if (!rc) rt_dev_node_done(tw, r, &bs);
      rt_arena_reset(&ar);
      count_node(st, nd, now_s() - t);
      if (rc) rt_node_error(nd, rc, err, err_len);
      k++;
    }
    if (progress) progress(user, k, g->n_node);
  }
  if (dv->ops->sync) {
    int src = dv->ops->sync(err, err_len);
    if (!rc) rc = src;
  }
  if (!slab)
    for (int d = 0; d < g->n_data; d++)
      if (buf[d]) dv->ops->free(buf[d]);
  free(buf);
  free(out_row);
  free(seg_end);
  if (st) {
    st->seconds += now_s() - t0;
    if (act_bytes > st->act_peak_bytes) st->act_peak_bytes = act_bytes;
    if ((int64_t)ar.peak > st->scratch_peak_bytes) st->scratch_peak_bytes = (int64_t)ar.peak;
    for (int f = 0; f < RT_FAM_COUNT; f++) st->family_seconds[f] += ar.fam_s[f];
  }
  rt_arena_free(&ar);
  return rc;
}

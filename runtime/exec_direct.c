/* exec_direct.c: the direct executor (exec.h): one thread, graph order. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "runtime/exec.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct bufs {
  const struct graph *g;
  void **p;          /* (n_data) */
  int64_t live, peak;
};

/* The buffer of activation/bus d, allocated on first use. */
static void *buf(struct bufs *b, int d) {
  if (d < 0) return NULL;
  if (!b->p[d]) {
    const struct graph_data *gd = &b->g->data[d];
    CEDAR_ASSERT(gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS);
    b->p[d] = aligned_alloc(64, (size_t)((gd->bytes + 63) / 64 * 64 + 64));
    CEDAR_ASSERT_MSG(b->p[d] != NULL, "out of memory for %s (%lld bytes)", gd->name, (long long)gd->bytes);
    b->live += gd->bytes;
    if (b->live > b->peak) b->peak = b->live;
  }
  return b->p[d];
}

static void release_after(struct bufs *b, int k) {
  const struct graph_node *nd = &b->g->node[k];
  for (int u = 0; u < nd->n_use; u++) {
    int d = nd->use[u].data;
    if (b->g->data[d].last_use == k && b->p[d]) {
      free(b->p[d]);
      b->p[d] = NULL;
      b->live -= b->g->data[d].bytes;
    }
  }
}

/* Allocate the activations and buses node nd writes or reads first. */
static void **node_bufs(struct bufs *b, const struct graph_node *nd) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &b->g->data[nd->use[u].data];
    if (gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) buf(b, nd->use[u].data);
  }
  return b->p;
}

int rt_exec_direct(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, rt_progress_cb progress, void *user, char *err, size_t err_len) {
  struct bufs b = {g, cedar_xcalloc((size_t)g->n_data, sizeof(void *)), 0, 0};
  struct rt_arena ar;
  rt_arena_init(&ar, 0);
  int64_t out_row = 0;
  int rc = 0;
  double t0 = now_s();
  for (int k = 0; k < g->n_node && rc == 0; k++) {
    const struct graph_node *nd = &g->node[k];
    double t = now_s();
    rc = rt_run_node(g, M, r, nd, node_bufs(&b, nd), out, out_row, &ar);
    if (nd->op == GRAPH_HEAD) out_row += nd->n;
    rt_arena_reset(&ar);
    if (st) {
      st->op_seconds[nd->op] += now_s() - t;
      st->op_nodes[nd->op]++;
      st->nodes++;
      if (nd->op == GRAPH_ATTN) st->token_layers += nd->n;
    }
    if (rc) snprintf(err, err_len, "%s: the KV page pool is exhausted; this request is dropped", nd->name);
    release_after(&b, k);
    if (progress) progress(user, k + 1, g->n_node);
  }
  for (int d = 0; d < g->n_data; d++) free(b.p[d]);
  free(b.p);
  if (st) {
    st->seconds += now_s() - t0;
    if (b.peak > st->act_peak_bytes) st->act_peak_bytes = b.peak;
    if ((int64_t)ar.peak > st->scratch_peak_bytes) st->scratch_peak_bytes = (int64_t)ar.peak;
    for (int f = 0; f < RT_FAM_COUNT; f++) st->family_seconds[f] += ar.fam_s[f];
  }
  rt_arena_free(&ar);
  return rc;
}

/* exec_direct.c: the direct executor (exec.h): one thread, graph order.
 * A graph on a device home (M->dev, runtime/device/devbind.h) goes to
 * rt_exec_direct_dev (exec_dev.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "runtime/device/devbind.h"
#include "runtime/exec/exec.h"

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

/* The buffer of activation/bus d, allocated on first use; false when the
 * machine is out of memory (the request fails, the process goes on). */
static bool buf(struct bufs *b, int d) {
  if (!b->p[d]) {
    const struct graph_data *gd = &b->g->data[d];
    CEDAR_ASSERT(gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS);
    b->p[d] = aligned_alloc(64, (size_t)((gd->bytes + 63) / 64 * 64 + 64));
    if (!b->p[d]) return false;
    b->live += gd->bytes;
    if (b->live > b->peak) b->peak = b->live;
  }
  return true;
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

/* Allocate the activations and buses node nd writes or reads first;
 * CEDAR_ENOMEM, naming the buffer, when one cannot be had. */
static int node_bufs(struct bufs *b, const struct graph_node *nd, char *err, size_t err_len) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &b->g->data[nd->use[u].data];
    if ((gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) && !buf(b, nd->use[u].data)) {
      snprintf(err, err_len, "%s: out of memory for %s (%lld bytes); this request is dropped", nd->name, gd->name,
               (long long)gd->bytes);
      return CEDAR_ENOMEM;
    }
  }
  return 0;
}

int rt_exec_direct(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, rt_progress_cb progress, void *user, char *err, size_t err_len) {
  if (M->dev && g->n_node > 0 && rt_dev_home(M->dev, &g->node[0])) /* the device home (runtime/device/devbind.h) */
    return rt_exec_direct_dev(g, M, r, out, st, progress, user, err, err_len);
  struct bufs b = {g, cedar_xcalloc((size_t)g->n_data, sizeof(void *)), 0, 0};
  struct rt_arena ar;
  rt_arena_init(&ar, 0);
  int64_t out_row = 0;
  int rc = 0;
  double t0 = now_s();
  for (int k = 0; k < g->n_node && rc == 0; k++) {
    const struct graph_node *nd = &g->node[k];
    double t = now_s();
    rc = node_bufs(&b, nd, err, err_len);
    if (rc) break;
    rc = rt_run_node(g, M, r, nd, b.p, NULL, out, out_row, &ar);
    if (nd->op == GRAPH_HEAD) out_row += nd->n;
    rt_arena_reset(&ar);
    if (st) {
      st->op_seconds[nd->op] += now_s() - t;
      st->op_nodes[nd->op]++;
      st->nodes++;
      if (nd->op == GRAPH_ATTN) st->token_layers += nd->n;
    }
    if (rc) rt_node_error(nd, rc, err, err_len);
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

/* test_backend_nodes.c: placement in the graph, the node backends and the
 * placement check (runtime/node/backend.h, scheduler/graph.h).
 *
 *  - the backend table: cpu has an entry for every model op group; the
 *    features' (TRANSFER, MOE_SHARD, MOE_SUM, an expert-parallel route) come
 *    from rt_dist_register, after which nothing is missing and each node
 *    kind dispatches to its feature's entry by its flags; cuda, in a CUDA
 *    build, every op group but TRANSFER (runtime/device/node_cuda.h), none
 *    without CUDA; rt_backend_for maps each device kind to its table once
 *    the device home registered it;
 *  - a CUDA entry called without the executor's device state (ctx.cuda
 *    NULL, as here) refuses its node with CEDAR_EUNSUPPORTED and says why,
 *    before touching the device, and rt_node_error passes the reason on;
 *  - rt_cuda_swa_rank (the device's SWA view order) puts a ring's slots
 *    where model.c's swa_view insertion sort puts them, over random rings
 *    with empty slots, rotations and arbitrary positions;
 *  - rt_placement_check accepts every shipped plan (v41-mini-pd too) and a
 *    P/D split on ranks 0 and 1, and refuses, naming file:line:col and the
 *    value to set, a rank beyond what this process plays (two ranks without
 *    mpirun: "needs N ranks") and a cuda device;
 *  - the compiler places every node and data object of a flow where
 *    serving.placement puts it; with decode elsewhere, a prefill streams
 *    each KV source after every tile that appended to it (each transfer
 *    waits for that tile's append, the transfers of one source chain, the
 *    entries shipped are consecutive and end at the source's count) and
 *    hands over every ring, tail, the tokens and the kept encoder outputs
 *    once at the end; with one home there is no transfer node;
 *  - the entry ranges the compiler declares: every append continues where
 *    the previous one of its source ended, ends at floor(end / ratio), and
 *    every reader sees exactly the entries appended before it;
 *  - a TRANSFER node through rt_run_node outside a P/D request fails cleanly;
 *  - the scheduling policy (scheduler/policy.h): priorities stay in the
 *    runtime's range, and a layer of a later tile outranks the next layer
 *    of the tile before (the trailing edge of the wavefront goes first).
 * Run from the repository root: ctest --test-dir build -R backend_nodes.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/device/cuda_backend.h"
#include "runtime/dist/dist.h"
#include "base/check.h"
#include "runtime/node/backend.h"
#include "runtime/exec/exec.h"
#include "runtime/device/node_cuda.h"
#include "runtime/dist/expert_par.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"
#include "scheduler/graph.h"
#include "scheduler/policy.h"
#include "tests/harness.h"

#define BASE_PLAN CEDAR_SOURCE_DIR "/tests/oracle/plans/tiny.yaml"

static char err[1024];

/* A plan extending tiny.yaml with `serving_yaml` (the serving section's
 * body), written to a temporary file; its path in path. */
static bool temp_plan(char *path, size_t len, const char *serving_yaml, struct plan *p) {
  snprintf(path, len, "/tmp/cedar-backend-nodes-XXXXXX");
  int fd = mkstemp(path);
  CEDAR_ASSERT(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fprintf(f, "extends: %s\nname: placed\nserving:\n%s", BASE_PLAN, serving_yaml);
  fclose(f);
  return h_load_plan(path, p);
}

/* The entry a node of op group op with these flags dispatches to on dev. */
static rt_group_fn entry_of(enum graph_device dev, enum graph_op op, unsigned flags) {
  struct graph_node nd = {0};
  nd.op = op, nd.flags = flags, nd.place.dev = dev;
  return rt_backend_entry(&nd);
}

static void check_table(void) {
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    bool feature = op == GRAPH_TRANSFER || op == GRAPH_MOE_SHARD || op == GRAPH_MOE_SUM;
    EXPECT((rt_backend_cpu.run[op] != NULL) == !feature, "cpu table: op group %s %s", graph_op_name(op),
           feature ? "is a feature's, not the table's" : "missing");
  }
  rt_dist_register();
  rt_dist_register(); /* idempotent */
  char none[256];
  EXPECT(rt_backend_missing(&rt_backend_cpu, true, none, sizeof none) == 0, "cpu with the features: missing %s", none);
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_EP) == rt_ep_transfer_node, "EP transfer entry");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_STAGE) == rt_pipe_transfer_node, "stage transfer entry");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_TRANSFER, GRAPH_F_STAGE | GRAPH_F_EP) == rt_ep_transfer_node,
         "an expert packet the stage pass ships is expert parallel's");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_TRANSFER, 0) == rt_pd_transfer_node, "P/D transfer entry");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_MOE, GRAPH_F_EP) == rt_ep_route, "EP route entry");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_MOE, 0) == rt_backend_cpu.run[GRAPH_MOE], "a plain MoE runs the table's");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_MOE_SHARD, 0) == rt_ep_shard, "shard entry");
  EXPECT(entry_of(GRAPH_DEV_CPU, GRAPH_MOE_SUM, 0) == rt_ep_sum, "sum entry");
  EXPECT(entry_of(GRAPH_DEV_CUDA, GRAPH_TRANSFER, 0) == NULL, "a feature entry of the CPU is not a CUDA one");
  EXPECT(rt_backend_for(GRAPH_DEV_CPU) == &rt_backend_cpu, "cpu maps to the cpu table");
  EXPECT(rt_backend_for(GRAPH_DEV_CUDA) == &rt_backend_cuda, "cuda maps to the cuda table");
#ifdef CEDAR_HAVE_CUDA
  const bool cuda = true;
#else
  const bool cuda = false;
#endif
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    bool want = cuda && op != GRAPH_TRANSFER;
    EXPECT((rt_backend_cuda.run[op] != NULL) == want, "cuda backend: op group %s %s", graph_op_name(op),
           want ? "has no entry" : "has an entry it should not");
  }
  char list[256];
  int missing = rt_backend_missing(&rt_backend_cuda, false, list, sizeof list);
  EXPECT(missing == (cuda ? 0 : GRAPH_OP_COUNT - 1), "cuda backend: %d op groups missing (%s)", missing, list);
  missing = rt_backend_missing(&rt_backend_cuda, true, list, sizeof list);
  EXPECT(cuda ? missing == 1 && strcmp(list, "transfer") == 0 : missing == GRAPH_OP_COUNT,
         "cuda backend with TRANSFER: %d missing (%s)", missing, list);
  /* Without a GPU (this machine), rt_cuda_ready refuses for the device, and
   * in a CUDA build only for the device. */
  char why[512] = "";
  if (rt_cuda_ready(why, sizeof why) != 0 && cuda)
    EXPECT(strstr(why, "no CUDA device") == why, "a CUDA build refuses for something else than the device: %s", why);
}

/* Each op group's CUDA entry through rt_run_node with no device state: a
 * clean refusal with the reason, before any CUDA call. */
static void check_cuda_entries_refuse(void) {
#ifdef CEDAR_HAVE_CUDA
  char path[256];
  snprintf(path, sizeof path, "%s/tests/oracle/plans/tiny.yaml", CEDAR_SOURCE_DIR);
  struct plan p;
  if (!h_load_plan(path, &p)) return;
  struct rt_model M;
  memset(&M, 0, sizeof M);
  M.p = &p;
  struct graph_node nd;
  memset(&nd, 0, sizeof nd);
  snprintf(nd.name, sizeof nd.name, "cuda-node");
  nd.place.dev = GRAPH_DEV_CUDA;
  nd.x = nd.aux = nd.pre = -1;
  for (int op = 0; op < GRAPH_OP_COUNT; op++) {
    if (op == GRAPH_TRANSFER) continue;
    nd.op = (enum graph_op)op;
    struct rt_bound st;
    memset(&st, 0, sizeof st);
    int rc = rt_run_node(NULL, &M, NULL, &nd, NULL, &st, NULL, 0, NULL);
    EXPECT(rc == CEDAR_EUNSUPPORTED, "cuda %s without device state: rc %d", graph_op_name(op), rc);
    rt_node_error(&nd, rc, err, sizeof err);
    EXPECT(strstr(err, "cuda-node") && strstr(err, "device state") && strstr(err, graph_op_name(op)),
           "cuda %s: message '%s' does not say why", graph_op_name(op), err);
  }
  plan_free(&p);
#endif
}

/* model.c's swa_view order: insertion sort of slot ids by position, empty
 * (-1) as the largest, stable. */
static void swa_order_cpu(const int64_t *pos, int window, int *ord) {
  for (int s = 0; s < window; s++) {
    int64_t ps = pos[s] < 0 ? INT64_MAX : pos[s];
    int j = s;
    for (; j > 0 && (pos[ord[j - 1]] < 0 ? INT64_MAX : pos[ord[j - 1]]) > ps; j--) ord[j] = ord[j - 1];
    ord[j] = s;
  }
}

static void check_swa_rank(void) {
  uint64_t seed = 0x5eed;
  enum { W = 40 };
  int64_t pos[W];
  int ord[W], seen[W];
  for (int trial = 0; trial < 2000; trial++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int window = 1 + (int)((seed >> 33) % W), kind = (int)((seed >> 20) % 3);
    int64_t head = (int64_t)((seed >> 40) % 500);
    for (int s = 0; s < window; s++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      if (kind == 0) { /* a ring after position head: slot p mod window, the unwritten ones empty */
        int64_t p = head - ((head - s) % window + window) % window;
        pos[s] = p >= 0 ? p : -1;
      } else if (kind == 1) /* a reset ring partly refilled */
        pos[s] = (seed >> 60) < 6 ? -1 : (int64_t)s + window * (int64_t)((seed >> 50) % 4);
      else /* arbitrary distinct positions, some empty */
        pos[s] = (seed >> 61) == 0 ? -1 : (int64_t)s * 7919 % 1009 + 1009 * (int64_t)((seed >> 40) % 3);
    }
    swa_order_cpu(pos, window, ord);
    memset(seen, 0, sizeof seen);
    for (int s = 0; s < window; s++) {
      int r = rt_cuda_swa_rank(pos, window, s);
      EXPECT(r >= 0 && r < window && !seen[r]++, "trial %d: slot %d ranked %d twice or out of range", trial, s, r);
      if (r >= 0 && r < window) EXPECT(ord[r] == s, "trial %d (window %d): slot %d at %d, model.c puts slot %d there",
                                       trial, window, s, r, ord[r]);
    }
  }
}

static void check_shipped(void) {
  static const char *const plans[] = {"v41-flash", "v41-mini", "v41-mini-noced", "dense-40", "alt-reindex2",
                                      "alt-two-dec-sources", "alt-no-pool", "v41-mini-pd"};
  for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
    char path[256];
    snprintf(path, sizeof path, "%s/plans/%s.yaml", CEDAR_SOURCE_DIR, plans[i]);
    struct plan p;
    if (!h_load_plan(path, &p)) continue;
    EXPECT(rt_placement_check(&p, NULL, err, sizeof err) == 0, "%s refused: %s", plans[i], err);
    plan_free(&p);
  }
}

/* The placement named by `yaml` is refused with a message holding every
 * string of want (NULL-terminated) and the value's line. */
static void expect_refused(const char *yaml, int line, const char *const *want) {
  char path[64];
  struct plan p;
  if (!temp_plan(path, sizeof path, yaml, &p)) {
    unlink(path);
    return;
  }
  struct plan_mark at;
  err[0] = 0;
  int rc = rt_placement_check(&p, &at, err, sizeof err);
  EXPECT(rc == CEDAR_EUNSUPPORTED, "placement accepted:\n%s", yaml);
  char where[96];
  snprintf(where, sizeof where, "%s:%d:", path, line);
  EXPECT(strstr(err, where) && at.line == line, "message '%s' does not start at %s", err, where);
  for (int i = 0; want[i]; i++) EXPECT(strstr(err, want[i]), "message '%s' lacks '%s'", err, want[i]);
  plan_free(&p);
  unlink(path);
}

static void check_refusals(void) {
  expect_refused("  placement:\n    decode: {rank: 3}\n", 5,
                 (const char *const[]){"decode.rank is 3", "needs 4 ranks", "runs 2", "set rank: 0", NULL});
  expect_refused("  placement:\n    prefill:\n      device: cuda\n", 6,
                 (const char *const[]){"prefill.device is cuda", "set device: cpu", NULL});
  expect_refused("  placement:\n    prefill: {rank: 2, device: cpu}\n", 5,
                 (const char *const[]){"prefill.rank is 2", "needs 3 ranks", NULL});
  /* P/D on ranks 0 and 1 runs: without mpirun both roles in one process */
  char path[64];
  struct plan p;
  if (temp_plan(path, sizeof path, "  placement:\n    prefill: {rank: 1}\n    decode: {rank: 0}\n", &p)) {
    EXPECT(rt_placement_check(&p, NULL, err, sizeof err) == 0, "P on rank 1, D on rank 0 refused: %s", err);
    plan_free(&p);
  }
  unlink(path);
}

static bool reads(const struct graph_node *nd, int d) {
  for (int u = 0; u < nd->n_use; u++)
    if (nd->use[u].data == d && nd->use[u].mode == GRAPH_R) return true;
  return false;
}

static bool depends(const struct graph_node *nd, int k) {
  for (int i = 0; i < nd->n_dep; i++)
    if (nd->dep[i] == k) return true;
  return false;
}

/* Entry ranges: appends consecutive per source, readers see what came before. */
static void check_entry_ranges(const struct graph *g, const struct plan *p, int64_t first_pos, int64_t end,
                               const char *label) {
  int64_t have[PLAN_MAX_LAYERS];
  for (int l = 0; l < p->n_layers; l++) have[l] = plan_is_kv_source(&p->layer[l]) ? first_pos / p->layer[l].ratio : 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    for (int u = 0; u < nd->n_use; u++) {
      const struct graph_use *us = &nd->use[u];
      const struct graph_data *gd = &g->data[us->data];
      if (gd->kind != GRAPH_STATE || gd->state != GRAPH_ST_KV || !graph_place_eq(gd->home, g->place)) continue;
      int l = gd->layer;
      if (us->mode == GRAPH_APPEND) {
        EXPECT_EQ(us->e_w0, have[l], "%s: %s appends to L%d from", label, nd->name, l);
        EXPECT_EQ(us->e_w1, (nd->a + nd->n) / p->layer[l].ratio, "%s: %s appends to L%d up to", label, nd->name, l);
        have[l] = us->e_w1;
      }
      if (us->mode == GRAPH_R || (us->mode == GRAPH_APPEND && us->e_read))
        EXPECT_EQ(us->e_read, have[l], "%s: %s reads L%d entries", label, nd->name, l);
    }
  }
  for (int l = 0; l < p->n_layers; l++)
    if (plan_is_kv_source(&p->layer[l]))
      EXPECT_EQ(have[l], end / p->layer[l].ratio, "%s: L%d entries at the end", label, l);
}

static void check_transfers(const struct graph *g, const struct plan *p, int chunk, int64_t n) {
  int tiles = (int)((n + chunk - 1) / chunk), sources = 0, handoff = 0, want_handoff = 2; /* tokens, XE ring */
  for (int l = 0; l < p->n_layers; l++) {
    want_handoff += 1 + plan_is_kv_source(&p->layer[l]);
    sources += plan_is_kv_source(&p->layer[l]);
  }
  int64_t shipped[PLAN_MAX_LAYERS] = {0};
  int last[PLAN_MAX_LAYERS];
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) last[l] = -1;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    if (nd->op != GRAPH_TRANSFER) continue;
    const struct graph_data *src = &g->data[nd->xfer_src], *dst = &g->data[nd->xfer_dst];
    EXPECT(graph_place_eq(src->home, g->place) && graph_place_eq(dst->home, g->peer) && reads(nd, nd->xfer_src),
           "%s: moves %s from the prefill home to the decode home", nd->name, src->name);
    if (src->state != GRAPH_ST_KV) {
      handoff++;
      continue;
    }
    int l = src->layer;
    /* The append of this tile, and the previous transfer of this source. */
    int app = -1;
    for (int j = k - 1; j >= 0 && app < 0; j--)
      for (int u = 0; u < g->node[j].n_use; u++)
        if (g->node[j].use[u].data == nd->xfer_src && g->node[j].use[u].mode == GRAPH_APPEND) app = j;
    EXPECT(app >= 0 && depends(nd, app) && g->node[app].chunk == nd->chunk, "%s: does not wait for its tile's append",
           nd->name);
    if (last[l] >= 0) EXPECT(depends(nd, last[l]), "%s: not chained after %s", nd->name, g->node[last[l]].name);
    const struct graph_use *w = NULL;
    for (int u = 0; u < nd->n_use; u++)
      if (nd->use[u].data == nd->xfer_dst) w = &nd->use[u];
    EXPECT(w && w->e_w0 == shipped[l], "%s: ships from entry %" PRId64 ", want %" PRId64, nd->name, w ? w->e_w0 : -1,
           shipped[l]);
    if (w) shipped[l] = w->e_w1;
    last[l] = k;
  }
  for (int l = 0; l < p->n_layers; l++)
    if (plan_is_kv_source(&p->layer[l]))
      EXPECT_EQ(shipped[l], n / p->layer[l].ratio, "L%d entries shipped", l);
  EXPECT_EQ(handoff, want_handoff, "small-state transfers (rings, tails, tokens, XE)");
  EXPECT_EQ(g->n_transfer, handoff + tiles * sources, "transfer nodes");
}

static void check_placement(void) {
  char path[64];
  struct plan p;
  if (!temp_plan(path, sizeof path, "  placement:\n    decode: {rank: 1}\n", &p)) {
    unlink(path);
    return;
  }
  const int chunk = 16;
  const int64_t n = 45;
  struct graph g;
  CEDAR_ASSERT(graph_build_prefill(&g, &p, n, &(struct graph_opts){.chunk = chunk, .replay = -1}, err, sizeof err) == 0);
  EXPECT(g.place.rank == 0 && g.peer.rank == 1 && g.n_transfer > 0, "prefill on rank 0, decode on rank 1");
  for (int k = 0; k < g.n_node; k++)
    EXPECT(g.node[k].place.rank == 0 && g.node[k].n_slots == 1, "%s: placed on rank %d", g.node[k].name,
           g.node[k].place.rank);
  check_transfers(&g, &p, chunk, n);
  check_entry_ranges(&g, &p, 0, n, "P/D prefill");
  /* A transfer outside a P/D request (runtime/dist/pd.h) has nowhere to go: the
   * node fails, the process goes on. */
  for (int k = 0; k < g.n_node; k++) {
    if (g.node[k].op != GRAPH_TRANSFER) continue;
    int rc = rt_run_node(&g, NULL, NULL, &g.node[k], NULL, NULL, NULL, 0, NULL);
    rt_node_error(&g.node[k], rc, err, sizeof err);
    EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, g.node[k].name), "a transfer ran outside a P/D request: %d %s", rc,
           err);
    break;
  }
  graph_free(&g);
  CEDAR_ASSERT(graph_build_decode(&g, &p, n, err, sizeof err) == 0);
  for (int k = 0; k < g.n_node; k++) EXPECT(g.node[k].place.rank == 1, "%s: decode node off rank 1", g.node[k].name);
  for (int d = 0; d < g.n_data; d++) EXPECT(g.data[d].home.rank == 1, "%s: decode data off rank 1", g.data[d].name);
  EXPECT(g.n_transfer == 0, "a decode step has transfers");
  check_entry_ranges(&g, &p, n, n + 1, "decode");
  graph_free(&g);
  plan_free(&p);
  unlink(path);
  /* One home: no transfer, every node and data object at rank 0 cpu. */
  if (!h_load_plan(BASE_PLAN, &p)) return;
  CEDAR_ASSERT(graph_build_prefill(&g, &p, n, &(struct graph_opts){.chunk = chunk, .replay = -1}, err, sizeof err) == 0);
  EXPECT(g.n_transfer == 0 && graph_count_op(&g, GRAPH_TRANSFER, -1) == 0, "one home, yet transfers");
  for (int d = 0; d < g.n_data; d++)
    EXPECT(g.data[d].home.rank == 0 && g.data[d].home.dev == GRAPH_DEV_CPU, "%s not at rank 0 cpu", g.data[d].name);
  check_entry_ranges(&g, &p, 0, n, "prefill");
  graph_free(&g);
  CEDAR_ASSERT(graph_build_prefill(&g, &p, 48, &(struct graph_opts){.chunk = chunk, .replay = -1, .hit = 32}, err,
                                   sizeof err) == 0);
  check_entry_ranges(&g, &p, 32, 48, "prefix-hit prefill");
  graph_free(&g);
  plan_free(&p);
}

static void check_policy(void) {
  struct plan p;
  if (!h_load_plan(BASE_PLAN, &p)) return;
  struct graph g;
  CEDAR_ASSERT(graph_build_prefill(&g, &p, 64, &(struct graph_opts){.chunk = 16, .replay = -1}, err, sizeof err) == 0);
  int tiles = sched_tiles(&g), lo = -1000, hi = 1000;
  EXPECT_EQ(tiles, 4, "tiles of a 64-token prefill in chunks of 16");
  int attn[PLAN_MAX_LAYERS][4];
  memset(attn, 0xff, sizeof attn);
  for (int k = 0; k < g.n_node; k++) {
    int pr = sched_priority(&g, k, tiles, lo, hi);
    EXPECT(pr >= lo && pr <= hi, "%s: priority %d outside [%d, %d]", g.node[k].name, pr, lo, hi);
    if (g.node[k].op == GRAPH_ATTN && g.node[k].layer >= 0 && g.node[k].chunk < 4 && !(g.node[k].flags & GRAPH_F_REPLAY))
      attn[g.node[k].layer][g.node[k].chunk] = k;
  }
  int pairs = 0;
  for (int l = 0; l + 1 < p.n_layers; l++)
    for (int c = 0; c + 1 < 4; c++) {
      int a = attn[l][c + 1], b = attn[l + 1][c];
      if (a < 0 || b < 0) continue;
      pairs++;
      EXPECT(sched_priority(&g, a, tiles, lo, hi) > sched_priority(&g, b, tiles, lo, hi),
             "%s does not outrank %s", g.node[a].name, g.node[b].name);
    }
  EXPECT(pairs > 0, "no wavefront pair compared");
  EXPECT(sched_priority(&g, 0, tiles, 5, 5) == 5, "an empty priority range gives its one value");
  graph_free(&g);
  plan_free(&p);
}

int main(void) {
  check_table();
  check_cuda_entries_refuse();
  check_swa_rank();
  check_policy();
  check_shipped();
  check_refusals();
  check_placement();
  return h_report("backend_nodes");
}

/* test_model_buses.c: the Top-K and pool buses of a real chunked prefill
 * (scheduler/graph.h, runtime/exec/exec.h) on small plans with synthetic weights
 * (tests/model_fixture.h): tests/oracle/plans/tiny.yaml, tiny-40.yaml,
 * tiny-two-dec.yaml and tiny-dense.yaml at toy widths.
 *
 *  - visibility: after an odd prefill a ratio-2 source holds floor(N/2)
 *    entries and a 1-row tail; every Top-K and pool bus row names only
 *    visible entries, min(k, n_vis) of them (or min(k, |pool|) for reindex),
 *    ascending, no duplicates; the builder's Top-K lies in its own pool, a
 *    reindex layer's in the pool it read; a reuse layer reads its topk_src's
 *    bus (8.2.9, 8.3.13, 8.3.15-16, 8.10);
 *  - the inspecting loop that reads the buses computes rt_exec_direct's
 *    logits and state, bitwise.
 *
 * What it is not: a check of the forward's values (tests/oracle/), of the
 * graph's edges (tests/test_graph.c) or of the StarPU executor
 * (tests/test_exec_starpu.c).
 *
 * Run from the repository root: ctest --test-dir build -R '^model_buses$',
 * or build/tests/test_model_buses. About 0.3 s on 2 cores.
 */
#include "tests/model_fixture.h"

/* ---- the buses of a real prefill (SPEC 8.2.9, 8.3.13, 8.3.15-16, 8.10) ---- */

/* The direct executor keeps its buses to itself, so this runs a graph the
 * same way (exec_direct.c: same op groups, same order; buffers kept to the
 * end) and checks every bus row an attention node writes. Its logits must be
 * bitwise rt_exec_direct's, which keeps it honest. */
struct insp {
  const struct fx *f;
  const struct graph *g;
  struct rt_request *r;
  void **buf;           /* (n_data) */
  int64_t rows_checked; /* bus rows checked */
};

static void *ibuf(struct insp *s, int d) {
  if (d < 0) return NULL;
  if (!s->buf[d]) {
    s->buf[d] = calloc(1, (size_t)s->g->data[d].bytes + 64);
    CEDAR_ASSERT(s->buf[d]);
  }
  return s->buf[d];
}

/* n_vis(p) of a ratio-r source holding n entries: floor((p + 1) / r),
 * at most n (ops/indexer.h, SPEC 8.2.9). */
static int64_t n_vis(const struct rt_request *r, int src, int64_t p) {
  int64_t v = (p + 1) / r->seq[src].pool->ratio;
  return v < r->seq[src].n_entries ? v : r->seq[src].n_entries;
}

/* One bus row: `want` valid ids, strictly ascending, each < lim, then -1. */
static bool row_ok(const int32_t *row, int k, int64_t want, int64_t lim) {
  for (int t = 0; t < k; t++) {
    if (t >= want) {
      if (row[t] != -1) return false;
    } else if (row[t] < 0 || row[t] >= lim || (t > 0 && row[t] <= row[t - 1])) {
      return false;
    }
  }
  return true;
}

static bool in_blocks(int32_t e, const int32_t *blocks, int nb, int B) {
  for (int i = 0; i < nb; i++)
    if (blocks[i] >= 0 && blocks[i] == e / B) return true;
  return false;
}

/* The Top-K and pool rows node nd just wrote (or read, for reindex). */
static void check_buses(struct insp *s, const struct graph_node *nd) {
  const struct plan *p = s->f->p;
  const struct plan_layer *L = &p->layer[nd->layer];
  const int K = p->model.topk, B = p->model.cand_block, T = p->model.cand_top_blocks;
  const int32_t *tk = nd->bus[GRAPH_TOPK_OUT] >= 0 ? s->buf[nd->bus[GRAPH_TOPK_OUT]] : NULL;
  const int32_t *po = nd->bus[GRAPH_POOL_OUT] >= 0 ? s->buf[nd->bus[GRAPH_POOL_OUT]] : NULL;
  const int32_t *pi = nd->bus[GRAPH_POOL_IN] >= 0 ? s->buf[nd->bus[GRAPH_POOL_IN]] : NULL;
  for (int i = 0; i < nd->n && tk; i++) {
    int64_t pos = nd->a + i, nv = n_vis(s->r, L->kv_src, pos);
    const int32_t *row = tk + (size_t)i * K;
    int64_t cand = nv; /* entries the layer may select from */
    if (pi) {
      cand = 0;
      for (int b = 0; b < T; b++)
        if (pi[(size_t)i * T + b] >= 0) {
          int64_t lo = (int64_t)pi[(size_t)i * T + b] * B, hi = lo + B < nv ? lo + B : nv;
          cand += hi > lo ? hi - lo : 0;
        }
    }
    EXPECT(row_ok(row, K, cand < K ? cand : K, nv), "%s: %s row %d (p %lld, n_vis %lld): a Top-K id is invisible, "
           "repeated or missing", s->f->path, nd->name, i, (long long)pos, (long long)nv);
    for (int t = 0; t < K && row[t] >= 0; t++) {
      if (pi) EXPECT(in_blocks(row[t], pi + (size_t)i * T, T, B), "%s: %s p %lld: reindex picked %d outside its pool",
                     s->f->path, nd->name, (long long)pos, row[t]);
      /* SPEC 3.11's derived property holds for the unpinned pool only: a
       * pinned newest block (Appendix V #12) takes the place of the block
       * that ranked last, which may hold a Top-K entry. */
      if (po && !p->model.cand_pin_newest)
        EXPECT(in_blocks(row[t], po + (size_t)i * T, T, B), "%s: %s p %lld: Top-K id %d outside its own pool",
               s->f->path, nd->name, (long long)pos, row[t]);
    }
    if (po) {
      int64_t nb = (nv + B - 1) / B;
      EXPECT(row_ok(po + (size_t)i * T, T, nb < T ? nb : T, nb), "%s: %s row %d (p %lld): a pool block is invisible, "
             "repeated or missing", s->f->path, nd->name, i, (long long)pos);
      if (p->model.cand_pin_newest && nb > 0)
        EXPECT(in_blocks((int32_t)((nb - 1) * B), po + (size_t)i * T, T, B), "%s: %s p %lld: the newest block %lld is "
               "not pinned in the pool", s->f->path, nd->name, (long long)pos, (long long)(nb - 1));
    }
    s->rows_checked++;
  }
}

/* A reuse layer reads the bus its topk_src wrote in the same tile. */
static void check_reuse(struct insp *s, const struct graph_node *nd) {
  const struct plan_layer *L = &s->f->p->layer[nd->layer];
  if (L->mode != PLAN_REUSE) return;
  int src_bus = -2;
  for (int k = 0; k < s->g->n_node; k++) {
    const struct graph_node *o = &s->g->node[k];
    if (o->op == GRAPH_ATTN && o->layer == L->topk_src && o->a == nd->a && o->n == nd->n) src_bus = o->bus[GRAPH_TOPK_OUT];
  }
  EXPECT(nd->bus[GRAPH_TOPK_IN] >= 0 && nd->bus[GRAPH_TOPK_IN] == src_bus, "%s: %s does not read L%d's Top-K of its tile",
         s->f->path, nd->name, L->topk_src);
}

/* One node through rt_run_node (the executors' dispatch) on buffers this
 * loop owns, then, for attention nodes, the bus checks. */
static int insp_node(struct insp *s, const struct graph_node *nd, float *logits, struct rt_arena *ar) {
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &s->g->data[nd->use[u].data];
    if (gd->kind == GRAPH_ACT || gd->kind == GRAPH_BUS) ibuf(s, nd->use[u].data);
  }
  if (nd->op == GRAPH_HEAD) CEDAR_ASSERT(nd->n == 1);
  struct rt_exec_out out = {.logits = logits, .pos = NULL};
  int rc = rt_run_node(s->g, &s->f->M, s->r, nd, s->buf, NULL, &out, 0, ar);
  if (!rc && nd->op == GRAPH_ATTN) {
    check_buses(s, nd);
    check_reuse(s, nd);
  }
  return rc;
}

/* Prefill n with `chunk` through the inspecting loop and through
 * rt_exec_direct; buses checked, logits and state compared bitwise. */
static void test_buses(const char *path, int64_t n, int chunk) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(prompt, n, f.V, PROMPT_SEED);
  float *la = malloc(sizeof(float) * (size_t)f.V), *lb = malloc(sizeof(float) * (size_t)f.V);
  struct rt_request *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  struct graph g;
  CEDAR_ASSERT(graph_build_prefill(&g, f.p, n, &(struct graph_opts){.chunk = chunk, .replay = -1}, err, sizeof err) == 0);
  CEDAR_ASSERT(rt_request_init(a, 0, f.p, f.pools, n) == 0);
  for (int64_t i = 0; i < n; i++) rt_request_push_token(a, prompt[i]);
  struct insp s = {&f, &g, a, calloc((size_t)g.n_data, sizeof(void *)), 0};
  struct rt_arena ar;
  rt_arena_init(&ar, 0);
  int rc = 0;
  for (int k = 0; k < g.n_node && !rc; k++) {
    rc = insp_node(&s, &g.node[k], la, &ar);
    rt_arena_reset(&ar);
  }
  EXPECT(rc == 0, "%s: the inspecting run failed (%d)", path, rc);
  rt_arena_free(&ar);
  for (int d = 0; d < g.n_data; d++) free(s.buf[d]);
  free(s.buf);
  graph_free(&g);
  /* Odd n: each ratio-2 source holds floor(n/2) entries and a one-row tail. */
  expect_entries(&f, a, n, "after the inspected prefill");
  EXPECT(s.rows_checked > 0, "%s: no bus row was checked", path);
  if (prefill(&f, b, prompt, n, n, chunk, -1, lb, NULL))
    EXPECT(requests_equal(&f, a, b, true) && !memcmp(la, lb, sizeof(float) * (size_t)f.V),
           "%s: the inspecting loop and rt_exec_direct disagree", path);
  printf("buses %s N=%lld chunk %d: %lld Top-K rows checked\n", path, (long long)n, chunk, (long long)s.rows_checked);
  rt_request_free(a);
  rt_request_free(b);
  free(a);
  free(b);
  free(la);
  free(lb);
  free(prompt);
  fx_close(&f);
}

int main(void) {
  test_buses(PLAN_TINY, 61, 7);
  test_buses(PLAN_T40, 61, 16);
  test_buses(PLAN_TWO, 61, 3);
  test_buses(PLAN_DENSE, 61, 64);
  return h_report("model_buses");
}

/* test_model_decode.c: the running model's decode steps and whole requests
 * (runtime/gen/generate.h, model.h, exec.h, state.h) on small plans with
 * synthetic weights (tests/model_fixture.h), against SPEC s8's invariants.
 * Plans: tests/oracle/plans/tiny.yaml (6 layers, CED), tiny-dense.yaml (CED
 * off), tiny-40.yaml (the 40-layer flash schedule) and tiny-two-dec.yaml
 * (two decoder sources), all at toy widths.
 *
 *  - the 1024 -> 1025 -> 1026 evolution of entries and tails, SPEC 6.4's
 *    table literally (8.2.7-8), with the bytes against plan cost after each;
 *    a decode step runs every layer once and one dec_kv per decoder source
 *    (8.8.43);
 *  - decoder entries appended exactly once per position: counts after the
 *    prefill and each step; a decode step appends the entry bytes a longer
 *    prefill does (8.8.43);
 *  - a pool too small (rt_kv_pool.max_pages) fails the request with
 *    CEDAR_ENOMEM and a message naming the node; its pages all return; a
 *    request alive beside it and the next one compute the same bits;
 *  - rt_request_bytes after a run equals plan_cost_compute for the final
 *    length: entries, bytes per source, SWA, tails; pages exactly
 *    ceil(entries / page) whole pages (SPEC 4.5, 8.7.33);
 *  - rt_generate equals the graph-by-graph driver used here, bitwise, and
 *    its all-logits rows are the positions that ran through every layer.
 *
 * What it is not: a check of the forward's values against the spec (the
 * NumPy oracle: tests/oracle/), nor of chunked prefill and replay
 * (test_model_prefill.c, which also explains CHUNK TOLERANCE) or the buses
 * (test_model_buses.c).
 *
 * Run from the repository root: ctest --test-dir build -R '^model_decode$',
 * or build/tests/test_model_decode. About 0.6 s on 2 cores.
 */
#include "tests/model_fixture.h"

/* rt_request_bytes against plan_cost_compute for the same length (state.h:
 * the entry bytes are what `cedar plan cost` reports). */
static void expect_bytes(const struct fx *f, const struct rt_request *r, int64_t prompt, const char *when) {
  struct rt_state_bytes b;
  rt_request_bytes(r, &b);
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = r->n_pos;
  q.prompt = prompt;
  struct plan_cost *pc = calloc(1, sizeof(*pc));
  CEDAR_ASSERT(pc);
  int rc = plan_cost_compute(f->p, &q, pc);
  EXPECT(rc == 0, "%s: plan_cost_compute: %s", f->path, pc->error);
  if (!rc) {
    EXPECT(b.kv_entries == pc->entries && b.kv_entry_bytes == pc->bytes,
           "%s %s: %lld entries / %lld B held, plan cost says %lld / %lld", f->path, when, (long long)b.kv_entries,
           (long long)b.kv_entry_bytes, (long long)pc->entries, (long long)pc->bytes);
    for (int i = 0; i < pc->n_sources; i++)
      EXPECT(r->seq[pc->src[i].layer].n_entries == pc->src[i].entries, "%s %s: source L%d holds %lld, plan cost %lld",
             f->path, when, pc->src[i].layer, (long long)r->seq[pc->src[i].layer].n_entries,
             (long long)pc->src[i].entries);
    EXPECT(b.swa_bytes == pc->swa_payload_bytes + pc->swa_scale_bytes, "%s %s: SWA %lld B, plan cost %lld", f->path,
           when, (long long)b.swa_bytes, (long long)(pc->swa_payload_bytes + pc->swa_scale_bytes));
    EXPECT(b.tail_bytes == pc->tail_bytes, "%s %s: tails %lld B, plan cost %lld", f->path, when,
           (long long)b.tail_bytes, (long long)pc->tail_bytes);
    /* Pages: whole pages as allocated (state.h), ceil(entries / page_entries) per source. */
    int64_t pages = 0;
    for (int i = 0; i < pc->n_sources; i++) {
      const struct rt_kv_seq *q = &r->seq[pc->src[i].layer];
      int64_t n = (q->n_entries + q->pool->page_entries - 1) / q->pool->page_entries;
      pages += n * (int64_t)rt_kv_page_bytes(q->pool);
    }
    EXPECT(b.kv_page_bytes == pages && b.kv_page_bytes >= b.kv_entry_bytes,
           "%s %s: pages hold %lld B for %lld B of entries, want %lld", f->path, when, (long long)b.kv_page_bytes,
           (long long)b.kv_entry_bytes, (long long)pages);
  }
  free(pc);
}

/* SPEC 6.4's table, literally, for a schedule with ratio-2 encoder sources
 * and ratio-1 decoder sources (the flash schedule). */
static void expect_spec_6_4(const struct fx *f, const struct rt_request *r, int step) {
  static const int64_t enc[3] = {512, 512, 513}, tail[3] = {0, 1, 0}, dec[3] = {1024, 1025, 1026};
  for (int l = 0; l < f->p->n_layers; l++) {
    if (!r->seq[l].pool) continue;
    if (f->p->layer[l].ratio == 2) {
      EXPECT(r->seq[l].n_entries == enc[step] && r->tail[l].count == tail[step] && (!tail[step] || r->tail[l].pos0 == 1024),
             "SPEC 6.4 row %d: L%d has %lld entries, tail %d from %lld", step, l, (long long)r->seq[l].n_entries,
             r->tail[l].count, (long long)r->tail[l].pos0);
    } else {
      EXPECT(r->seq[l].n_entries == dec[step], "SPEC 6.4 row %d: L%d has %lld entries", step, l,
             (long long)r->seq[l].n_entries);
    }
  }
}

/* SPEC 6.4 / 8.2.8 at toy widths on the flash schedule: prefill 1024, then
 * consume y1 (position 1024) and y2 (1025). Every source's entries and tail
 * after each event, the bytes against plan cost, and every decode step's
 * work: each layer once, one dec_kv per decoder source (8.8.43). */
static void test_evolution(const char *path, int64_t n) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(prompt, n, f.V, PROMPT_SEED);
  struct rt_request *r = calloc(1, sizeof(*r));
  float *lg = malloc(sizeof(float) * (size_t)f.V);
  struct rt_exec_stats st = {0};
  char when[64];
  int n_dec_src = 0;
  for (int l = 0; l < f.p->n_layers; l++)
    n_dec_src += f.p->layer[l].region == PLAN_DECODER && plan_is_kv_source(&f.p->layer[l]);
  if (prefill(&f, r, prompt, n, n + 2, 0, -1, lg, &st)) {
    expect_entries(&f, r, n, "after the prefill");
    if (n == 1024) expect_spec_6_4(&f, r, 0);
    expect_bytes(&f, r, n, "after the prefill");
    for (int step = 1; step <= 2; step++) {
      struct rt_exec_stats ds = {0};
      if (!decode(&f, r, greedy(lg, f.V), lg, &ds)) break;
      snprintf(when, sizeof when, "after decode step %d", step);
      expect_entries(&f, r, n + step, when);
      if (n == 1024) expect_spec_6_4(&f, r, step);
      expect_bytes(&f, r, n, when);
      int L = f.p->n_layers;
      EXPECT(ds.token_layers == L && ds.op_nodes[GRAPH_ATTN] == L && ds.op_nodes[GRAPH_MOE] == L &&
                 ds.op_nodes[GRAPH_HEAD] == 1 && ds.op_nodes[GRAPH_EMBED] == 1,
             "%s %s: %lld token-layers, %lld attn, %lld moe, %lld head nodes; want %d, %d, %d, 1", path, when,
             (long long)ds.token_layers, (long long)ds.op_nodes[GRAPH_ATTN], (long long)ds.op_nodes[GRAPH_MOE],
             (long long)ds.op_nodes[GRAPH_HEAD], L, L, L);
      EXPECT(ds.op_nodes[GRAPH_DEC_KV] == (f.p->serving.ced ? n_dec_src : 0) && ds.op_nodes[GRAPH_REPLAY_IN] == 0,
             "%s %s: %lld dec_kv nodes, want %d", path, when, (long long)ds.op_nodes[GRAPH_DEC_KV],
             f.p->serving.ced ? n_dec_src : 0);
    }
  }
  rt_request_free(r);
  free(r);
  free(lg);
  free(prompt);
  fx_close(&f);
}

/* A decode step appends what a longer prefill appends (SPEC 8.8.43): prefill
 * n then consume k prompt ids one by one, against a prefill of n + k. Entry
 * counts and tails exactly; entry bytes bitwise unless a code flipped at a
 * rounding boundary (decode runs GEMMs of one row: CHUNK TOLERANCE in
 * test_model_prefill.c). Under model.indexer.key_slot: own_source only:
 * with the vendor's slot a decode step at a filling position scores other
 * keys than the prefill does there (docs/model.md s3.2; the oracle tests
 * that reading, tests/oracle). */
static void test_decode_appends(const char *path, int64_t n, int k) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  f.p->model.idx_key_slot = PLAN_KEY_SLOT_OWN;
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(n + k));
  make_prompt(prompt, n + k, f.V, PROMPT_SEED + 1);
  struct rt_request *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  float *lg = malloc(sizeof(float) * (size_t)f.V);
  if (prefill(&f, a, prompt, n + k, n + k, 0, -1, lg, NULL) && prefill(&f, b, prompt, n, n + k, 0, -1, lg, NULL)) {
    bool ok = true;
    for (int i = 0; i < k && ok; i++) {
      ok = decode(&f, b, prompt[n + i], lg, NULL);
      if (ok) expect_entries(&f, b, n + i + 1, "after a decode step");
    }
    struct state_cmp c = state_compare(f.p, a, b);
    EXPECT(!c.tail_shape_bad, "%s: tails after decode differ in shape from the prefill's", path);
    expect_origin_flip(&c, path);
    printf("decode appends %s: prefill %lld + %d steps vs prefill %lld: %lld of %lld global entries differ%s\n", path,
           (long long)n, k, (long long)(n + k), (long long)c.kv_bad, (long long)c.kv_total,
           c.kv_bad ? " (a code flipped at a rounding boundary)" : " (bitwise equal)");
  }
  rt_request_free(a);
  rt_request_free(b);
  free(a);
  free(b);
  free(lg);
  free(prompt);
  fx_close(&f);
}

/* ---- failure: a source's page table runs out ------------------------------ */

static int64_t pages_in_use(const struct fx *f) {
  int64_t n = 0;
  for (int l = 0; l < f->p->n_layers; l++) n += f->pools[l].entry_bytes ? f->pools[l].pages_in_use : 0;
  return n;
}

/* A pool too small (rt_kv_pool.max_pages): the request whose append needs
 * one page more fails with a message naming the node; its pages all
 * return; a request alive beside it and the next one are unaffected
 * (bitwise). */
static void test_pages_exhausted(const char *path, int64_t n) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  int src = -1;
  for (int l = 0; l < f.p->n_layers; l++)
    if (plan_is_kv_source(&f.p->layer[l]) && f.p->layer[l].ratio == 1) src = l;
  CEDAR_ASSERT(src >= 0 && n > f.pools[src].page_entries);
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(prompt, n, f.V, PROMPT_SEED);
  float *l0 = malloc(sizeof(float) * (size_t)f.V), *l1 = malloc(sizeof(float) * (size_t)f.V);
  struct rt_request *ref = calloc(1, sizeof(*ref)), *bad = calloc(1, sizeof(*bad)), *next = calloc(1, sizeof(*next));
  bool ok = prefill(&f, ref, prompt, n, n + 1, 0, -1, l0, NULL);
  int64_t held = pages_in_use(&f);
  f.pools[src].max_pages = f.pools[src].pages_in_use + 1; /* room for one page of the next request */
  CEDAR_ASSERT(rt_request_init(bad, 1, f.p, f.pools, n) == 0);
  for (int64_t i = 0; i < n; i++) rt_request_push_token(bad, prompt[i]);
  struct graph g;
  CEDAR_ASSERT(graph_build_prefill(&g, f.p, n, &(struct graph_opts){.replay = -1}, err, sizeof err) == 0);
  err[0] = 0;
  int rc = rt_exec_direct(&g, &f.M, bad, &(struct rt_exec_out){.logits = l1}, NULL, NULL, NULL, err, sizeof err);
  graph_free(&g);
  char name[16];
  snprintf(name, sizeof name, "L%d.", src);
  EXPECT(rc == CEDAR_ENOMEM && strstr(err, name) && strstr(err, "exhausted"),
         "%s: a full pool gave rc %d, message '%s'", path, rc, err);
  EXPECT(bad->seq[src].n_entries <= f.pools[src].page_entries, "%s: the failed source holds %lld entries in one page",
         path, (long long)bad->seq[src].n_entries);
  rt_request_free(bad);
  f.pools[src].max_pages = 0;
  EXPECT(pages_in_use(&f) == held, "%s: %lld pages in use after the failed request ended, %lld before it", path,
         (long long)pages_in_use(&f), (long long)held);
  /* The request alive beside it decodes as if nothing happened: like a new
   * request that prefills and decodes after the failure, bitwise. */
  float *l2 = malloc(sizeof(float) * (size_t)f.V), *l3 = malloc(sizeof(float) * (size_t)f.V);
  int32_t t = greedy(l0, f.V);
  if (ok && decode(&f, ref, t, l1, NULL) && prefill(&f, next, prompt, n, n + 1, 0, -1, l2, NULL) &&
      decode(&f, next, t, l3, NULL))
    EXPECT(!memcmp(l0, l2, sizeof(float) * (size_t)f.V) && !memcmp(l1, l3, sizeof(float) * (size_t)f.V),
           "%s: the requests around a failed one compute other logits", path);
  rt_request_free(ref);
  rt_request_free(next);
  EXPECT(pages_in_use(&f) == 0, "%s: %lld pages still in use after every request ended", path,
         (long long)pages_in_use(&f));
  free(l2);
  free(l3);
  free(ref);
  free(bad);
  free(next);
  free(l0);
  free(l1);
  free(prompt);
  fx_close(&f);
}

/* ---- rt_generate ---------------------------------------------------------- */

/* The head of a whole replay tile is one lm_head GEMM of more rows than the
 * last-row head, so logit j may be summed in another order: |difference| <=
 * 2 gamma(d) sum_i |hn_i W_ji| <= 2 gamma(d) max|norm| sqrt(d) ||W_j||_2,
 * as hn = RMSNorm(h) * norm has ||RMSNorm(h)||_2 <= sqrt(d) (Cauchy-Schwarz).
 * Reported when bitwise. */
static bool head_rows_agree(const struct fx *f, const float *a, const float *b) {
  const int d = f->p->model.hidden;
  double gmax = 0;
  for (int i = 0; i < d; i++) gmax = fmax(gmax, fabs(f->M.norm[i]));
  bool ok = true, same = !memcmp(a, b, sizeof(float) * (size_t)f->V);
  for (int j = 0; j < f->V && !same; j++) {
    double w2 = 0;
    for (int i = 0; i < d; i++) w2 += (double)((const float *)f->M.lm_head.data)[(size_t)j * d + i] * ((const float *)f->M.lm_head.data)[(size_t)j * d + i];
    ok &= fabs((double)a[j] - b[j]) <= 2 * h_gamma(d) * gmax * sqrt((double)d) * sqrt(w2);
  }
  printf("generate %s: the all-logits head row is %s the last-row head's\n", f->path,
         same ? "bitwise" : "within 2 gamma(d) of");
  return ok;
}

/* rt_generate is the drivers above plus greedy sampling: same tokens, same
 * logits bitwise, and its stats and state; with all_logits, one row per
 * position that ran through every layer (the replay, or all N dense). */
static void test_generate(const char *path, int64_t n, int max_new) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(prompt, n, f.V, PROMPT_SEED + 2);
  struct rt_request *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  float *lg = malloc(sizeof(float) * (size_t)f.V);
  struct rt_gen_result res;
  struct rt_gen_opts go = {.chunk = 5, .replay = -1, .max_new = max_new, .top_p = 1, .all_logits = true};
  int rc = rt_generate(&f.M, f.pools, a, prompt, n, &go, &res, err, sizeof err);
  EXPECT(rc == 0 && res.n_tokens == max_new, "%s: rt_generate: %s", path, err);
  int64_t R = f.p->serving.ced ? (replay_of(f.p) < n ? replay_of(f.p) : n) : 0, rows = R ? R : n;
  if (!rc) {
    EXPECT(res.replay == R && res.prefill_rows == rows && res.prefill_pos[0] == n - rows &&
               res.prefill_pos[rows - 1] == n - 1,
           "%s: replay %lld, %lld prefill rows from %lld; want %lld rows from %lld", path, (long long)res.replay,
           (long long)res.prefill_rows, (long long)res.prefill_pos[0], (long long)rows, (long long)(n - rows));
    EXPECT(res.decode.token_layers == (int64_t)(max_new - 1) * f.p->n_layers, "%s: decode ran %lld token-layers",
           path, (long long)res.decode.token_layers);
    expect_entries(&f, a, n + max_new - 1, "after rt_generate");
    expect_bytes(&f, a, n, "after rt_generate");
    /* The same prefill (last row only) and steps, graph by graph. */
    if (prefill(&f, b, prompt, n, n + max_new, 5, -1, lg, NULL)) {
      const float *last = res.prefill_logits + (size_t)(rows - 1) * f.V;
      EXPECT(head_rows_agree(&f, lg, last), "%s: the all-logits last row is not the last-row head's", path);
      EXPECT(greedy(lg, f.V) == res.tokens[0], "%s: first token %d, the driver's %d", path, res.tokens[0],
             greedy(lg, f.V));
      for (int i = 1; i < max_new; i++) {
        if (!decode(&f, b, res.tokens[i - 1], lg, NULL)) break;
        EXPECT(!memcmp(lg, res.decode_logits + (size_t)(i - 1) * f.V, sizeof(float) * (size_t)f.V) &&
                   greedy(lg, f.V) == res.tokens[i],
               "%s: decode step %d differs from rt_generate's", path, i);
      }
    }
  }
  rt_gen_result_free(&res);
  rt_request_free(a);
  rt_request_free(b);
  free(a);
  free(b);
  free(lg);
  free(prompt);
  fx_close(&f);
}

int main(void) {
  test_evolution(PLAN_T40, 1024);
  test_evolution(PLAN_TWO, 1024);
  test_evolution(PLAN_DENSE, 1024);
  test_evolution(PLAN_TINY, 61);
  test_decode_appends(PLAN_T40, 37, 4);
  test_decode_appends(PLAN_TWO, 37, 4);
  test_decode_appends(PLAN_DENSE, 37, 4);
  test_pages_exhausted(PLAN_TINY, 150);
  test_pages_exhausted(PLAN_DENSE, 150);
  test_generate(PLAN_TINY, 41, 4);
  test_generate(PLAN_DENSE, 41, 4);
  return h_report("model_decode");
}

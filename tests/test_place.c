/* test_place.c: layer (pipeline) and expert placement, in one process
 * (scheduler/plan_place.h, scheduler/graph_place.c, runtime/dist/pipeline.h,
 * runtime/dist/place_cost.h).
 *
 *  - plan language: stages that overlap, leave a gap, stop short, name an
 *    unknown key, or come with a P/D split, and experts over a number of ranks that does not divide the
 *    routed experts, are each refused at their file:line:col with a fix;
 *  - the compiler: every node on its stage's rank, every activation, bus or
 *    KV source a node reads homed on that node's rank, each boundary crossed
 *    by TRANSFER nodes whose copy's reader waits for them (explicit edges);
 *    a KV source's readers in another stage (pp3kv: L8 -> L11-13, L20 ->
 *    L23-39) get its entries by KV transfers that ship each entry once, in
 *    order, before the first read that needs it;
 *  - equivalence: tiny-40 on 2, 3 (ranks out of layer order), 3 cut inside
 *    KV readers' groups and 4 stages (one boundary at the encoder/decoder
 *    cut), the same graph mpirun runs
 *    with its transfers as copies, gives tokens, prefill and decode logits
 *    and every byte of request state bitwise equal to the plan without
 *    stages, on the direct and the StarPU executor, for several prompt
 *    lengths and chunk sizes;
 *  - accounting: the ranks' weights add up to the plan's; v41-flash on 8
 *    GPUs (plans/gpu/v41-flash-8gpu.yaml) fits 141 GB a rank and the 4-stage
 *    split without experts does not; the expected expert-parallel dispatch
 *    per token matches an independent count over every selection.
 * Under mpirun: tests/cli/pp_mpi.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dist/pipeline.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_cost.h"
#include "scheduler/plan_place.h"
#include "tests/model_fixture.h"

/* ---- plan language ---------------------------------------------------------- */

static void expect_refused(const char *placement, int line, int col, const char *want, const char *label) {
  char text[2048];
  snprintf(text, sizeof text, "extends: tests/oracle/plans/tiny-40.yaml\nname: t\nserving:\n  placement:\n%s",
           placement);
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load_string("place.yaml", text, strlen(text), &p, &d);
  EXPECT(rc != 0, "%s: loaded", label);
  if (rc == 0) {
    plan_free(&p);
    return;
  }
  bool found = false;
  for (size_t i = 0; i < d.n; i++)
    if (strstr(d.d[i].msg, want)) {
      found = true;
      EXPECT(d.d[i].mark.line == line && d.d[i].mark.col == col && d.d[i].hint,
             "%s: at %d:%d (want %d:%d) with a hint: %s", label, d.d[i].mark.line, d.d[i].mark.col, line, col,
             d.d[i].msg);
    }
  EXPECT(found, "%s: no diagnostic says '%s' (first: %s)", label, want, d.n ? d.d[0].msg : "none");
  plan_diags_free(&d);
}

static void plan_language(void) {
  expect_refused("    stages:\n      - {layers: 0-13, rank: 0}\n      - {layers: 12-39, rank: 1}\n", 7, 9,
                 "an earlier stage already holds it", "overlap");
  expect_refused("    stages:\n      - {layers: 0-13, rank: 0}\n      - {layers: 15-39, rank: 1}\n", 7, 9,
                 "in no stage", "gap");
  expect_refused("    stages:\n      - {layers: 0-13, rank: 0}\n      - {layers: 14-30, rank: 1}\n", 7, 9,
                 "the plan has 40 layers", "short");
  expect_refused("    stages:\n      - {layers: 0-13, rank: 0, gpu: 1}\n      - {layers: 14-39, rank: 1}\n", 6, 33,
                 "gpu", "unknown key");
  expect_refused("    prefill: {rank: 0}\n    decode: {rank: 1}\n    stages:\n      - {layers: 0-13, rank: 0}\n"
                 "      - {layers: 14-39, rank: 1}\n", 8, 7, "with one rank a stage", "stages with P/D");
  expect_refused("    experts: {ranks: [0, 1, 2]}\n", 5, 14, "unequal", "experts 4 over 3");
  expect_refused("    experts: {ranks: [0, 0]}\n", 5, 26, "twice", "experts twice");
  expect_refused("    engram: {rank: 0, memory: disk}\n", 5, 31, "host or file", "engram memory");
  struct plan p;
  EXPECT(h_load_plan("tests/plans/pp3-tiny-40.yaml", &p), "pp3 loads");
  EXPECT_EQ(plan_place_ranks(&p), 3, "pp3 ranks");
  EXPECT_EQ(plan_stage_of(&p, 8), 1, "L8's stage");
  EXPECT_EQ(plan_expert_rank(&p, 20, 3), 1, "an unsharded expert lives with its layer");
  EXPECT_EQ(plan_engram_rank(&p), 2, "Engram tables with the first stage");
  plan_free(&p);
}

/* ---- the compiler ------------------------------------------------------------ */

/* own: model.indexer.key_slot: own_source. Under vendor (the default) the
 * last KV source (L20) also reaches the stages whose index layers score it
 * as the slot's keys (graph_place.c: key_copies_whole), whatever kv_split. */
static void graph_checks(const char *path, int64_t n, int chunk, bool kv_split, bool own) {
  struct plan p;
  if (!h_load_plan(path, &p)) return;
  if (own) p.model.idx_key_slot = PLAN_KEY_SLOT_OWN;
  int last_src = -1;
  for (int l = 0; l < p.n_layers; l++)
    if (plan_is_kv_source(&p.layer[l])) last_src = l;
  struct graph g;
  struct graph_opts o = {.chunk = chunk, .replay = -1};
  for (int flow = 0; flow < 2; flow++) {
    int rc = flow ? graph_build_decode(&g, &p, n, err, sizeof err) : graph_build_prefill(&g, &p, n, &o, err, sizeof err);
    EXPECT(rc == 0, "%s: build: %s", path, err);
    if (rc) continue;
    EXPECT(g.n_act_transfer > 0, "%s %s: no activation transfer", path, flow ? "decode" : "prefill");
    /* prefill: L8's entries reach rank 1 and L20's rank 2; decode (ratio 1): L20's new entry */
    if (kv_split) EXPECT(g.n_kv_transfer >= 2 - flow, "%s %s: %d KV transfers", path, flow ? "decode" : "prefill", g.n_kv_transfer);
    else if (own) EXPECT_EQ(g.n_kv_transfer, 0, "KV transfers with no reader in another stage");
    for (int k = 0; k < g.n_node && !kv_split && !own; k++) /* vendor: only the slot's source travels */
      if (g.node[k].op == GRAPH_TRANSFER && g.data[g.node[k].xfer_src].kind == GRAPH_STATE &&
          g.data[g.node[k].xfer_src].state == GRAPH_ST_KV)
        EXPECT(g.data[g.node[k].xfer_src].layer == last_src, "%s: %s ships a source no stage reads", path,
               g.node[k].name);
    /* each KV copy: entries shipped once each, in order, starting where the graph's did */
    int64_t next[PLAN_MAX_LAYERS][8];
    for (int l = 0; l < PLAN_MAX_LAYERS; l++)
      for (int r = 0; r < 8; r++) next[l][r] = -1;
    for (int k = 0; k < g.n_node; k++) {
      const struct graph_node *nd = &g.node[k];
      if (nd->op != GRAPH_TRANSFER || g.data[nd->xfer_src].kind != GRAPH_STATE) continue;
      const struct graph_use *w = &nd->use[1];
      int l = g.data[nd->xfer_src].layer, to = g.data[nd->xfer_dst].home.rank;
      EXPECT(w->data == nd->xfer_dst && w->e_w1 > w->e_w0 && (next[l][to & 7] < 0 || next[l][to & 7] == w->e_w0),
             "%s: %s ships [%lld, %lld) after %lld", path, nd->name, (long long)w->e_w0, (long long)w->e_w1,
             (long long)next[l][to & 7]);
      next[l][to & 7] = w->e_w1;
    }
    for (int k = 0; k < g.n_node; k++) {
      const struct graph_node *nd = &g.node[k];
      if (nd->op == GRAPH_TRANSFER) {
        int from = g.data[nd->xfer_src].home.rank, to = g.data[nd->xfer_dst].home.rank;
        EXPECT(from != to && nd->place.rank == from, "%s: %s moves rank %d to %d", path, nd->name, from, to);
        EXPECT(nd->n_dep > 0, "%s: %s waits for no writer", path, nd->name);
        continue;
      }
      if (nd->layer >= 0) EXPECT_EQ(nd->place.rank, p.serving.place.stage[plan_stage_of(&p, nd->layer)].rank, nd->name);
      for (int u = 0; u < nd->n_use; u++) {
        const struct graph_data *d = &g.data[nd->use[u].data];
        bool kv = d->kind == GRAPH_STATE && d->state == GRAPH_ST_KV;
        if (d->kind != GRAPH_ACT && d->kind != GRAPH_BUS && !kv) continue;
        EXPECT(d->home.rank == nd->place.rank, "%s: %s on rank %d uses %s homed on rank %d", path, nd->name,
               nd->place.rank, d->name, d->home.rank);
        /* a reader's entries: all shipped before it (its copy's last write ends at or past them) */
        if (kv && nd->use[u].mode == GRAPH_R && d->layer >= 0 && plan_stage_of(&p, d->layer) != plan_stage_of(&p, nd->layer)) {
          int64_t have = -1;
          for (int j = k - 1; j >= 0 && have < 0; j--)
            if (g.node[j].op == GRAPH_TRANSFER && g.node[j].xfer_dst == nd->use[u].data) have = g.node[j].use[1].e_w1;
          EXPECT(have < 0 ? flow == 1 : have >= nd->use[u].e_read, "%s: %s reads %lld entries of %s, %lld shipped",
                 path, nd->name, (long long)nd->use[u].e_read, d->name, (long long)have);
        }
      }
    }
    /* a copy's reader waits for the transfer that filled it */
    for (int k = 0; k < g.n_node; k++) {
      const struct graph_node *t = &g.node[k];
      if (t->op != GRAPH_TRANSFER) continue;
      for (int j = k + 1; j < g.n_node; j++) {
        const struct graph_node *nd = &g.node[j];
        bool reads = false, waits = false;
        for (int u = 0; u < nd->n_use; u++) reads |= nd->use[u].data == t->xfer_dst;
        for (int e = 0; e < nd->n_dep; e++) waits |= nd->dep[e] == k;
        if (reads) {
          EXPECT(waits || nd->op == GRAPH_TRANSFER, "%s: %s reads %s without waiting for %s", path, nd->name,
                 g.data[t->xfer_dst].name, t->name);
          break;
        }
      }
    }
    graph_free(&g);
  }
  plan_free(&p);
}

/* ---- equivalence ---------------------------------------------------------------- */

static bool same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static void expect_same_state(const struct plan *p, const struct rt_request *a, const struct rt_request *b,
                              const char *what) {
  EXPECT(same(a->tokens, b->tokens, 4 * (size_t)b->n_tokens) && a->n_pos == b->n_pos, "%s: tokens/positions", what);
  for (int l = 0; l < p->n_layers; l++) {
    const struct rt_kv_seq *x = &a->seq[l], *y = &b->seq[l];
    if (y->pool) {
      EXPECT(x->n_entries == y->n_entries, "%s: L%d entries %lld vs %lld", what, l, (long long)x->n_entries,
             (long long)y->n_entries);
      for (int64_t e = 0; e < x->n_entries && e < y->n_entries; e++)
        if (!same(rt_kv_entry(x, e), rt_kv_entry(y, e), y->pool->entry_bytes)) {
          EXPECT(false, "%s: L%d entry %lld differs", what, l, (long long)e);
          break;
        }
      if (y->pool->ratio > 1)
        EXPECT(a->tail[l].count == b->tail[l].count &&
                   same(a->tail_buf[l], b->tail_buf[l], 4 * (size_t)op_comp_tail_floats(y->pool->ratio, p->model.head_dim)),
               "%s: L%d tail differs", what, l);
    }
    const struct rt_ring *r = &a->ring[l], *s = &b->ring[l];
    bool ok = r->r0 == s->r0 && same(r->pos, s->pos, 8 * (size_t)s->window);
    for (int i = 0; ok && i < s->window; i++)
      ok = s->pos[i] < 0 || same(r->slot + (size_t)i * s->entry_bytes, s->slot + (size_t)i * s->entry_bytes, s->entry_bytes);
    EXPECT(ok, "%s: L%d ring differs", what, l);
  }
  size_t row = sizeof(float) * (size_t)p->model.hc_streams * p->model.hidden;
  bool ok = a->xe_cap == b->xe_cap && same(a->xe_pos, b->xe_pos, 8 * (size_t)b->xe_cap);
  for (int i = 0; ok && i < b->xe_cap; i++)
    ok = b->xe_pos[i] < 0 || same((const uint8_t *)a->xe + row * i, (const uint8_t *)b->xe + row * i, row);
  EXPECT(ok, "%s: kept encoder outputs differ", what);
}

static void equivalence(struct fx *pp, struct fx *one, enum rt_executor ex) {
  static const int64_t lens[] = {1, 16, 37, 101};
  static const int chunks[] = {40, 16, 7};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
      int64_t n = lens[i];
      int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
      make_prompt(tok, n, pp->V, PROMPT_SEED + (uint64_t)n);
      struct rt_gen_opts o = {.chunk = chunks[c], .replay = -1, .max_new = 4, .all_logits = true, .executor = ex};
      struct rt_request ra = {0}, rb = {0};
      struct rt_gen_result a, b;
      char what[128];
      snprintf(what, sizeof what, "%s %s n=%lld chunk=%d", pp->path, rt_executor_name(ex), (long long)n, chunks[c]);
      struct rt_pipe_stats fp;
      struct rt_ep_stats fe;
      struct rt_pipe_figs figs = {&fp, &fe, NULL};
      int rc = rt_pipe_generate(&pp->M, pp->pools, &ra, tok, n, &o, &figs, &a, err, sizeof err);
      EXPECT(rc == 0, "%s: staged run: %s", what, err);
      int rc2 = rt_generate(&one->M, one->pools, &rb, tok, n, &o, &b, err, sizeof err);
      EXPECT(rc2 == 0, "%s: one process: %s", what, err);
      if (!rc && !rc2) {
        EXPECT(a.n_tokens == b.n_tokens && same(a.tokens, b.tokens, 4 * (size_t)b.n_tokens), "%s: tokens", what);
        EXPECT(a.prefill_rows == b.prefill_rows && same(a.prefill_logits, b.prefill_logits, 4 * (size_t)(b.prefill_rows * pp->V)),
               "%s: prefill logits differ", what);
        EXPECT(same(a.decode_logits, b.decode_logits, 4 * (size_t)((b.n_tokens - 1) * pp->V)), "%s: decode logits", what);
        expect_same_state(pp->p, &ra, &rb, what);
      }
      rt_gen_result_free(&a);
      rt_gen_result_free(&b);
      rt_request_free(&ra);
      rt_request_free(&rb);
      free(tok);
    }
}

/* ---- accounting ------------------------------------------------------------------- */

static void accounting(void) {
  struct plan p;
  struct rt_place_cost *c = calloc(1, sizeof *c);
  if (h_load_plan("plans/gpu/v41-flash-8gpu.yaml", &p)) {
    EXPECT(rt_place_cost(&p, 1000000, 141e9, c) == 0, "8gpu: %s", c->error);
    int64_t sum = 0;
    for (int r = 0; r < c->ranks; r++) sum += c->r[r].weights + c->r[r].engram_host + c->r[r].engram_file;
    EXPECT_EQ(sum, c->total_weights, "the ranks' weights add up");
    EXPECT_EQ(c->ranks, 8, "8gpu ranks");
    for (int r = 0; r < c->ranks; r++) EXPECT(c->r[r].fits, "8gpu: rank %d holds %.1f GB", r, c->r[r].resident / 1e9);
    EXPECT(c->r[0].engram_host > 150e9, "the Engram tables in rank 0's host memory");
    plan_free(&p);
  }
  if (h_load_plan("plans/gpu/v41-flash-4stage.yaml", &p)) {
    EXPECT(rt_place_cost(&p, 1000000, 141e9, c) == 0, "4stage: %s", c->error);
    EXPECT(!c->r[3].fits, "4stage: the decoder stage (20 layers of experts) fits?");
    plan_free(&p);
  }
  /* KV readers in another stage: L8's pool copied to rank 1, L20's to rank 2,
   * each entry shipped once; no stage plan without such readers ships any
   * (key_slot: own_source here; vendor's slot copies below) */
  if (h_load_plan("tests/plans/pp3kv-tiny-40.yaml", &p)) {
    p.model.idx_key_slot = PLAN_KEY_SLOT_OWN;
    struct plan_cost pc;
    struct plan_cost_query q;
    plan_cost_query_init(&q);
    q.tokens = 37;
    EXPECT(rt_place_cost(&p, 37, 141e9, c) == 0 && plan_cost_compute(&p, &q, &pc) == 0, "pp3kv cost");
    int64_t l8 = 0, l20 = 0, all = 0;
    double t8 = 0, t20 = 0;
    for (int i = 0; i < pc.n_sources; i++) {
      all += pc.src[i].bytes;
      if (pc.src[i].layer == 8) l8 = pc.src[i].bytes, t8 = pc.src[i].bytes_per_token;
      if (pc.src[i].layer == 20) l20 = pc.src[i].bytes, t20 = pc.src[i].bytes_per_token;
    }
    EXPECT(l8 > 0 && l20 > 0, "pp3kv: sources L8 and L20");
    EXPECT(c->r[0].kv_ship == l8 && c->r[0].kv_ship_per_token == t8, "rank 0 ships L8: %lld", (long long)c->r[0].kv_ship);
    EXPECT(c->r[1].kv_ship == l20 && c->r[1].kv_ship_per_token == t20, "rank 1 ships L20: %lld", (long long)c->r[1].kv_ship);
    EXPECT_EQ(c->r[2].kv_ship, 0, "rank 2 ships none");
    EXPECT_EQ(c->r[0].kv + c->r[1].kv + c->r[2].kv, all + l8 + l20, "every pool once, plus the two copies");
    plan_free(&p);
  }
  if (h_load_plan("tests/plans/pp4-tiny-40.yaml", &p)) {
    p.model.idx_key_slot = PLAN_KEY_SLOT_OWN;
    EXPECT(rt_place_cost(&p, 37, 141e9, c) == 0, "pp4 cost");
    for (int r = 0; r < c->ranks; r++) EXPECT_EQ(c->r[r].kv_ship, 0, "pp4 cuts at sources: nothing shipped");
    /* key_slot: vendor: L2, L8 and L14 (stages 0-2) score L20's keys on filling steps: rank 3 ships L20 to each */
    p.model.idx_key_slot = PLAN_KEY_SLOT_VENDOR;
    struct plan_cost pc;
    struct plan_cost_query q;
    plan_cost_query_init(&q);
    q.tokens = 37;
    EXPECT(rt_place_cost(&p, 37, 141e9, c) == 0 && plan_cost_compute(&p, &q, &pc) == 0, "pp4 cost (vendor)");
    int64_t l20 = 0;
    for (int i = 0; i < pc.n_sources; i++)
      if (pc.src[i].layer == 20) l20 = pc.src[i].bytes;
    EXPECT(l20 > 0 && c->r[3].kv_ship == 3 * l20, "vendor: rank 3 ships L20 (%lld B) to 3 stages: %lld", (long long)l20,
           (long long)c->r[3].kv_ship);
    for (int r = 0; r < 3; r++) EXPECT_EQ(c->r[r].kv_ship, 0, "vendor: only L20's home ships");
    plan_free(&p);
  }
  /* dispatch: count, over every selection of k of E experts, the ranks other
   * than home (rank 0) holding one of them; uniform routing = the mean */
  if (h_load_plan("plans/v41-mini-ep2.yaml", &p)) {
    EXPECT(rt_place_cost(&p, 100, 141e9, c) == 0, "ep2: %s", c->error);
    int E = p.model.n_routed, k = p.model.n_active, R = 2, per = E / R;
    CEDAR_ASSERT(k == 2);
    double hits = 0, combine = 0, sel = 0;
    for (int a = 0; a < E; a++)
      for (int b = a + 1; b < E; b++) {
        sel++;
        hits += a / per == 1 || b / per == 1;
        combine += (a / per == 1) + (b / per == 1);
      }
    double want = p.n_layers * hits / sel * p.model.hidden * 4;
    EXPECT(c->r[0].ep_dispatch_per_token > want * (1 - 1e-12) && c->r[0].ep_dispatch_per_token < want * (1 + 1e-12),
           "ep2 dispatch %.3f B/token, counted %.3f", c->r[0].ep_dispatch_per_token, want);
    double wc = p.n_layers * combine / sel * p.model.hidden * 4;
    EXPECT(c->r[1].ep_combine_per_token > wc * (1 - 1e-12) && c->r[1].ep_combine_per_token < wc * (1 + 1e-12),
           "ep2 combine %.3f B/token, counted %.3f", c->r[1].ep_combine_per_token, wc);
    EXPECT_EQ(c->r[0].experts, c->r[1].experts, "ep2: equal expert halves");
    plan_free(&p);
  }
  free(c);
}

int main(void) {
  plan_language();
  for (int own = 0; own < 2; own++) {
    graph_checks("tests/plans/pp2-tiny-40.yaml", 37, 16, false, own);
    graph_checks("tests/plans/pp3-tiny-40.yaml", 37, 7, false, own);
    graph_checks("tests/plans/pp4-tiny-40.yaml", 101, 40, false, own);
    graph_checks("tests/plans/pp3kv-tiny-40.yaml", 37, 7, true, own);
    graph_checks("tests/plans/pp3kv-tiny-40.yaml", 101, 40, true, own);
  }
  accounting(); /* expert placement runs: tests/test_ep.c */
  struct fx one;
  if (fx_open(&one, PLAN_T40)) {
    static const char *const plans[] = {"tests/plans/pp2-tiny-40.yaml", "tests/plans/pp3-tiny-40.yaml",
                                        "tests/plans/pp4-tiny-40.yaml", "tests/plans/pp3kv-tiny-40.yaml"};
    for (size_t i = 0; i < 4; i++) {
      struct fx pp;
      if (!fx_open(&pp, plans[i])) continue;
      equivalence(&pp, &one, RT_EXEC_DIRECT);
      if (i == 0 || i == 3) {
        int rc = rt_starpu_init(&(struct rt_starpu_opts){.workers = 2, .sched = "lws"}, err, sizeof err);
        if (rc == 0) {
          equivalence(&pp, &one, RT_EXEC_STARPU);
          rt_starpu_shutdown();
        } else {
          EXPECT(0, "StarPU: %s", err);
        }
      }
      fx_close(&pp);
    }
    fx_close(&one);
  }
  return h_report("place");
}

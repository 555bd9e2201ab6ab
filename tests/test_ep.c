/* test_ep.c: routed experts on several ranks, in one process
 * (runtime/dist/expert_par.h; serving.placement.experts).
 *
 *  - equivalence: tiny-40 with its experts in 2 shards, in 4 shards named
 *    out of rank order, with 2 stages whose ranks serve each other's
 *    experts, and with 2 stages plus an experts-only rank for layers 4-39,
 *    and with 2 stages on ranks 1-2 and an expert on each of 4 ranks,
 *    run through the expert-parallel path (every shard from its dispatch
 *    packet, combined in ascending expert id) gives tokens, prefill and
 *    decode logits and every byte of request state bitwise equal to the
 *    plan without placement, on the direct executor for several prompt
 *    lengths and chunk sizes, and on the StarPU executor (2 workers: MoE
 *    nodes of different chunks at once);
 *  - load: each (token, expert) pair is computed once (expert-rows add up
 *    to passes x active experts), only by ranks holding experts; a
 *    shard's rows are at most its pairs; the dispatch bytes are the remote
 *    shards' rows x hidden x 4 and the combine bytes their pairs x hidden
 *    x 4; for ep2 only the owner dispatches and only rank 1 answers;
 *    the same with fp32 numerics (tiny-40-f32), where no bf16 rounding of
 *    the MoE output could hide a combine in another order;
 *  - the graph (scheduler/graph_ep.c): each MoE node of an expert-parallel
 *    layer is the owner's route, a shard node per shard on its rank, the
 *    owner's sum; a dispatch TRANSFER (owner -> shard) before every remote
 *    shard and a combine TRANSFER back before the sum, with the edges
 *    route -> dispatch -> shard -> combine -> sum; no transfer for a shard
 *    on the owner's rank; layers without expert parallelism keep one node;
 *  - NCCL (runtime/dist/ep_nccl.c, compiled, never run): a dispatch between two
 *    GPUs of one rank is what it takes, a CPU one is not; opening its
 *    pair here (no GPU) is refused with the reason;
 *  - a rank's part of the weights (rt_ep_part_init): its shard's expert
 *    rows bitwise the whole tensor's, every other tensor whole and equal,
 *    its routed-expert bytes (stored formats) plan cost --per-rank's;
 *  - refusals: across ranks on the StarPU executor, with the reason;
 *    experts with prefill and decode on different homes, at the key.
 * Under mpirun: tests/cli/ep_mpi.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dist/expert_par.h"
#include "runtime/comm/nccl.h"
#include "runtime/dist/pipeline.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_place.h"
#include "tests/model_fixture.h"

static bool same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static void expect_same_state(const struct plan *p, const struct rt_request *a, const struct rt_request *b,
                              const char *what) {
  EXPECT(same(a->tokens, b->tokens, 4 * (size_t)b->n_tokens) && a->n_pos == b->n_pos, "%s: tokens/positions", what);
  for (int l = 0; l < p->n_layers; l++) {
    const struct rt_kv_seq *x = &a->seq[l], *y = &b->seq[l];
    if (y->pool) {
      EXPECT(x->n_entries == y->n_entries, "%s: L%d entries", what, l);
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
}

/* The load figures of the last run against the placement. */
static void check_load(const struct rt_ep_stats *s, const struct plan *p, const char *what) {
  const struct plan_placement *pl = &p->serving.place;
  int d = p->model.hidden, k = p->model.n_active;
  int64_t pairs = 0, rows = 0, disp = 0, comb = 0, remote_rows = 0, remote_pairs = 0;
  EXPECT(s->passes > 0, "%s: no expert-parallel pass", what);
  for (int r = 0; r < RT_EP_MAX_RANKS; r++) {
    const struct rt_ep_rank *x = &s->rank[r];
    pairs += x->expert_rows, rows += x->rows, disp += x->dispatch_bytes, comb += x->combine_bytes;
    EXPECT(x->rows <= x->expert_rows, "%s: rank %d: %lld rows for %lld pairs", what, r, (long long)x->rows,
           (long long)x->expert_rows);
    bool shard = false;
    for (int i = 0; i < pl->n_ep_ranks; i++) shard |= pl->ep_rank[i] == r;
    EXPECT(shard || x->expert_rows == 0, "%s: rank %d holds no experts but computed %lld", what, r,
           (long long)x->expert_rows);
    if (shard && plan_has_stages(p)) continue;
    if (shard && r != 0) remote_rows += x->rows, remote_pairs += x->expert_rows; /* owner: rank 0 (no stages) */
  }
  EXPECT_EQ(pairs, s->passes * k, what);
  EXPECT(rows <= pairs && rows >= s->passes, "%s: %lld rows for %lld passes", what, (long long)rows,
         (long long)s->passes);
  if (!plan_has_stages(p)) {
    EXPECT_EQ(disp, remote_rows * d * 4, "dispatch bytes = remote rows x hidden x 4");
    EXPECT_EQ(comb, remote_pairs * d * 4, "combine bytes = remote pairs x hidden x 4");
  }
  EXPECT(!s->mpi, "%s: one process says it went through MPI", what);
}

static void equivalence(struct fx *ep, struct fx *one, enum rt_executor ex, bool all) {
  static const int64_t lens[] = {1, 16, 37, 101};
  static const int chunks[] = {40, 16, 7};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
      if (!all && (i != 2 || c != 1)) continue;
      int64_t n = lens[i];
      int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
      make_prompt(tok, n, ep->V, PROMPT_SEED + (uint64_t)n);
      struct rt_gen_opts o = {.chunk = chunks[c], .replay = -1, .max_new = 4, .all_logits = true, .executor = ex};
      struct rt_request ra = {0}, rb = {0};
      struct rt_gen_result a, b;
      char what[128];
      snprintf(what, sizeof what, "%s %s n=%lld chunk=%d", ep->path, rt_executor_name(ex), (long long)n, chunks[c]);
      struct rt_pipe_stats fp;
      struct rt_ep_stats fe;
      struct rt_pipe_figs figs = {&fp, &fe, NULL};
      int rc = rt_pipe_generate(&ep->M, ep->pools, &ra, tok, n, &o, &figs, &a, err, sizeof err);
      EXPECT(rc == 0, "%s: expert-parallel run: %s", what, err);
      if (!rc) check_load(&fe, ep->p, what);
      int rc2 = rt_generate(&one->M, one->pools, &rb, tok, n, &o, &b, err, sizeof err);
      EXPECT(rc2 == 0, "%s: one process: %s", what, err);
      if (!rc && !rc2) {
        EXPECT(a.n_tokens == b.n_tokens && same(a.tokens, b.tokens, 4 * (size_t)b.n_tokens), "%s: tokens", what);
        EXPECT(a.prefill_rows == b.prefill_rows && same(a.prefill_logits, b.prefill_logits, 4 * (size_t)(b.prefill_rows * ep->V)),
               "%s: prefill logits differ", what);
        EXPECT(same(a.decode_logits, b.decode_logits, 4 * (size_t)((b.n_tokens - 1) * ep->V)), "%s: decode logits", what);
        expect_same_state(ep->p, &ra, &rb, what);
      }
      rt_gen_result_free(&a);
      rt_gen_result_free(&b);
      rt_request_free(&ra);
      rt_request_free(&rb);
      free(tok);
    }
}

/* Who computed and who sent what, for ep2 (experts 0-1 on rank 0, the
 * owner; 2-3 on rank 1): both shards computed, only the owner dispatched,
 * only rank 1 sent outputs back. */
static void attribution(struct fx *ep) {
  int32_t tok[37];
  make_prompt(tok, 37, ep->V, PROMPT_SEED + 37);
  struct rt_gen_opts o = {.chunk = 16, .replay = -1, .max_new = 1};
  struct rt_request r = {0};
  struct rt_gen_result res;
  struct rt_pipe_stats fp;
  struct rt_ep_stats fe;
  struct rt_pipe_figs figs = {&fp, &fe, NULL};
  int rc = rt_pipe_generate(&ep->M, ep->pools, &r, tok, 37, &o, &figs, &res, err, sizeof err);
  EXPECT(rc == 0, "attribution run: %s", err);
  if (!rc) {
    const struct rt_ep_stats *s = &fe;
    int64_t a = s->rank[0].expert_rows, b = s->rank[1].expert_rows;
    EXPECT(a > 0 && b > 0, "ep2: both shards computed (%lld, %lld)", (long long)a, (long long)b);
    EXPECT(s->rank[1].dispatch_bytes == 0 && s->rank[0].combine_bytes == 0,
           "ep2: rank 1 dispatches nothing, rank 0 sends no combine");
    EXPECT(s->layers == ep->p->n_layers && s->shards == 2, "ep2: %d layers, %d shards", s->layers, s->shards);
  }
  rt_gen_result_free(&res);
  rt_request_free(&r);
  if (rc) return;
  /* the figures are the caller's (pipeline.h: rt_pipe_figs): a second
   * request counts into its own, and the first request's stay as they were */
  struct rt_ep_stats keep = fe, fe2;
  struct rt_pipe_stats fp2;
  struct rt_pipe_figs figs2 = {&fp2, &fe2, NULL};
  rc = rt_pipe_generate(&ep->M, ep->pools, &r, tok, 20, &o, &figs2, &res, err, sizeof err);
  EXPECT(rc == 0, "second run: %s", err);
  EXPECT(!memcmp(&keep, &fe, sizeof fe), "ep2: a second request changed the first request's figures");
  EXPECT(!rc && fe2.passes > 0 && fe2.passes < fe.passes, "ep2: the second request's own passes (%lld, first %lld)",
         (long long)fe2.passes, (long long)fe.passes);
  rt_gen_result_free(&res);
  rt_request_free(&r);
}

static bool has_dep(const struct graph_node *nd, int k) {
  for (int i = 0; i < nd->n_dep; i++)
    if (nd->dep[i] == k) return true;
  return false;
}

/* The transfer node that writes data d (-1: none). */
static int writer_xfer(const struct graph *g, int d) {
  for (int k = 0; k < g->n_node; k++)
    if (g->node[k].op == GRAPH_TRANSFER && g->node[k].xfer_dst == d) return k;
  return -1;
}

/* The shape of one graph of an expert-parallel plan. */
static void check_shape(const struct plan *p, const struct graph *g, const char *what) {
  const struct plan_placement *pl = &p->serving.place;
  int R = pl->n_ep_ranks, ep_xfers = 0, routes = 0;
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *rt = &g->node[k];
    if (rt->op == GRAPH_MOE) {
      EXPECT(!!(rt->flags & GRAPH_F_EP) == plan_ep_layer(p, rt->layer), "%s: %s: route flag", what, rt->name);
      routes += !!(rt->flags & GRAPH_F_EP);
    }
    if (rt->op != GRAPH_MOE || !(rt->flags & GRAPH_F_EP)) continue;
    int owner = rt->place.rank, sum = -1;
    for (int j = k + 1; j < g->n_node && sum < 0; j++)
      if (g->node[j].op == GRAPH_MOE_SUM && g->node[j].layer == rt->layer && g->node[j].a == rt->a) sum = j;
    EXPECT(sum > k, "%s: %s: no sum", what, rt->name);
    if (sum < 0) continue;
    const struct graph_node *sm = &g->node[sum];
    EXPECT_EQ(sm->place.rank, owner, "sum on the owner");
    EXPECT(has_dep(sm, k), "%s: %s: the sum waits for the route", what, sm->name);
    int shards = 0;
    for (int j = k + 1; j < sum; j++) {
      const struct graph_node *sh = &g->node[j];
      if (sh->op != GRAPH_MOE_SHARD) continue;
      int s = shards++, pk = -1, out = -1;
      EXPECT_EQ(sh->place.rank, pl->ep_rank[s], "a shard on its rank");
      for (int u = 0; u < sh->n_use; u++) {
        const struct graph_data *gd = &g->data[sh->use[u].data];
        if (gd->ep == GRAPH_EP_DISPATCH) pk = sh->use[u].data;
        if (gd->ep == GRAPH_EP_OUT) out = sh->use[u].data;
      }
      EXPECT(pk >= 0 && out >= 0 && g->data[pk].ep_shard == s && g->data[out].ep_shard == s, "%s: %s: its packet",
             what, sh->name);
      if (pk < 0 || out < 0) continue;
      int disp = writer_xfer(g, pk);
      bool remote = pl->ep_rank[s] != owner;
      EXPECT(remote == (disp >= 0), "%s: %s: a dispatch transfer iff remote (%d)", what, sh->name, disp);
      EXPECT(g->data[pk].home.rank == pl->ep_rank[s], "%s: %s: its packet on its rank", what, sh->name);
      if (!remote) {
        EXPECT(has_dep(sh, k), "%s: %s: a local shard waits for the route", what, sh->name);
        EXPECT(has_dep(sm, j), "%s: the sum waits for local %s", what, sh->name);
        continue;
      }
      const struct graph_node *dn = &g->node[disp];
      EXPECT((dn->flags & GRAPH_F_EP) && dn->place.rank == owner && has_dep(dn, k) && has_dep(sh, disp),
             "%s: %s: route -> dispatch (%s) -> shard", what, sh->name, dn->name);
      int comb = -1;
      for (int u = 0; u < sm->n_use; u++) {
        const struct graph_data *gd = &g->data[sm->use[u].data];
        if (gd->ep == GRAPH_EP_OUT && gd->ep_shard == s) comb = writer_xfer(g, sm->use[u].data);
      }
      EXPECT(comb > j, "%s: %s: no combine transfer", what, sh->name);
      if (comb <= j) continue;
      const struct graph_node *cn = &g->node[comb];
      EXPECT((cn->flags & GRAPH_F_EP) && cn->xfer_src == out && cn->place.rank == pl->ep_rank[s] &&
                 g->data[cn->xfer_dst].home.rank == owner && has_dep(cn, j) && has_dep(sm, comb),
             "%s: %s: shard -> combine (%s) -> sum", what, sh->name, cn->name);
      ep_xfers += 2;
    }
    EXPECT_EQ(shards, R, "a shard node per shard");
  }
  EXPECT(routes > 0, "%s: no expert-parallel route", what);
  EXPECT_EQ(g->n_ep_transfer, ep_xfers, what);
}

static void shapes(void) {
  static const char *const plans[] = {"tests/plans/ep2-tiny-40.yaml", "tests/plans/ep4-tiny-40.yaml",
                                      "tests/plans/ppep2-tiny-40.yaml", "tests/plans/ppep3-tiny-40.yaml",
                                      "tests/plans/ppep4-tiny-40.yaml"};
  for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
    struct plan p;
    if (!h_load_plan(plans[i], &p)) continue;
    struct graph g;
    char what[160];
    struct graph_opts go = {.chunk = 16, .replay = -1};
    if (graph_build_prefill(&g, &p, 37, &go, err, sizeof err) == 0) {
      snprintf(what, sizeof what, "%s prefill", plans[i]);
      check_shape(&p, &g, what);
      graph_free(&g);
    } else {
      EXPECT(0, "%s: %s", plans[i], err);
    }
    if (graph_build_decode(&g, &p, 37, err, sizeof err) == 0) {
      snprintf(what, sizeof what, "%s decode", plans[i]);
      check_shape(&p, &g, what);
      graph_free(&g);
    }
    plan_free(&p);
  }
}

static void nccl(void) {
  struct plan p;
  if (!h_load_plan("tests/plans/ep2-tiny-40.yaml", &p)) return;
  struct graph g;
  if (graph_build_decode(&g, &p, 5, err, sizeof err)) {
    EXPECT(0, "decode graph: %s", err);
    plan_free(&p);
    return;
  }
  int k = -1;
  for (int i = 0; i < g.n_node && k < 0; i++)
    if (g.node[i].op == GRAPH_TRANSFER && (g.node[i].flags & GRAPH_F_EP)) k = i;
  EXPECT(k >= 0, "ep2 decode: no expert transfer");
  if (k >= 0) {
    struct graph_node *nd = &g.node[k];
    struct comm_nccl_pair *pair = (struct comm_nccl_pair *)&g; /* must be cleared */
    EXPECT(!rt_ep_nccl_wanted(&g, nd), "a transfer between CPU ranks is not NCCL's");
    EXPECT(rt_ep_nccl_open(&pair, &g, nd, err, sizeof err) == CEDAR_EINVAL && !pair, "not wanted: %s", err);
    g.data[nd->xfer_src].home = (struct graph_place){0, GRAPH_DEV_CUDA, 0};
    g.data[nd->xfer_dst].home = (struct graph_place){0, GRAPH_DEV_CUDA, 1};
    EXPECT(rt_ep_nccl_wanted(&g, nd), "cuda:0 -> cuda:1 of one rank is NCCL's");
    int rc = rt_ep_nccl_open(&pair, &g, nd, err, sizeof err);
    /* refused with why without two GPUs (here); a machine with two opens it */
    EXPECT((rc == CEDAR_EUNSUPPORTED && !pair && err[0]) || (rc == 0 && pair), "the pair: rc %d: %s", rc, err);
    if (!rc) comm_nccl_close(pair);
    EXPECT(rt_ep_nccl_submit(NULL, &g, nd, NULL, NULL, err, sizeof err) == CEDAR_EINVAL, "no pair: %s", err);
    g.data[nd->xfer_dst].home.rank = 1;
    EXPECT(!rt_ep_nccl_wanted(&g, nd), "two ranks: StarPU-MPI, not NCCL");
  }
  graph_free(&g);
  plan_free(&p);
}

/* A shard rank's weights against the whole model's. */
static void weights_part(void) {
  static const char *const plans[] = {"tests/plans/ep2-tiny-40.yaml", "tests/plans/ppep3-tiny-40.yaml",
                                      "tests/plans/ppep4-tiny-40.yaml", /* P/D: each role's shards, a rank both */
                                      "tests/plans/pdep3-tiny-40.yaml", "tests/plans/pdppep4-tiny-40.yaml"};
  for (size_t pi = 0; pi < sizeof plans / sizeof *plans; pi++) {
    struct plan p;
    if (!h_load_plan(plans[pi], &p)) continue;
    struct weights all;
    if (weights_synth(&all, &p, 7, (uint64_t)1 << 32, err, sizeof err)) {
      EXPECT(0, "%s: %s", plans[pi], err);
      plan_free(&p);
      continue;
    }
    static struct rt_place_cost c;
    EXPECT(rt_place_cost(&p, 1, 1e30, &c) == 0, "%s: accounting: %s", plans[pi], c.error);
    for (int rank = 0; rank < plan_place_ranks(&p); rank++) {
      struct rt_ep_part e;
      struct weights w;
      if (weights_synth_part(&w, &p, 7, (uint64_t)1 << 32, false, rt_ep_part_init(&e, &p, rank), err, sizeof err)) {
        EXPECT(0, "%s rank %d: %s", plans[pi], rank, err);
        continue;
      }
      int64_t held_rows = 0;
      for (size_t i = 0; i < w.list.n; i++) {
        const struct weights_spec *s = &w.list.t[i];
        uint64_t rb = s->ndim > 0 && s->shape[0] ? s->nbytes / (uint64_t)s->shape[0] : s->nbytes;
        int64_t lo = w.part[i].lo;
        uint64_t n = weights_held_bytes(&w, i);
        bool expert = strstr(s->name, ".ffn.experts.") != NULL;
        EXPECT(expert || n == s->nbytes, "%s rank %d: %s not whole", plans[pi], rank, s->name);
        if (expert) held_rows += w.part[i].hi - lo;
        EXPECT(!n || !memcmp(w.data[i], (const char *)all.data[i] + (uint64_t)lo * (expert ? rb : 0), n),
               "%s rank %d: %s rows [%lld, %lld) differ from the whole tensor's", plans[pi], rank, s->name,
               (long long)lo, (long long)w.part[i].hi);
      }
      EXPECT(held_rows > 0, "%s rank %d holds no experts", plans[pi], rank);
      EXPECT_EQ(rt_place_held_experts(&p, &w), c.r[rank].experts, "held expert bytes = plan cost --per-rank");
      weights_free(&w);
    }
    int64_t accounted = 0, whole = rt_place_held_experts(&p, &all);
    for (int r = 0; r < c.ranks; r++) accounted += c.r[r].experts;
    if (!plan_place_pd(&p)) {
      EXPECT_EQ(whole, accounted, "the whole model holds every rank's experts");
    } else { /* each role holds every expert once; a rank in both roles' lists holds its cover once */
      EXPECT(accounted > whole && accounted <= 2 * whole, "%s: the ranks hold %lld expert bytes, the model %lld "
             "(P/D: between once and twice)", plans[pi], (long long)accounted, (long long)whole);
    }
    weights_free(&all);
    plan_free(&p);
  }
}

static void refusals(void) {
  struct plan p;
  /* experts with P/D: refused at the experts key */
  static const char text[] = "extends: tests/oracle/plans/tiny-40.yaml\nname: t\nserving:\n  placement:\n"
                             "    prefill: {rank: 0}\n    decode: {rank: 1}\n    experts: {ranks: [0, 1]}\n";
  struct plan_diags dg = {0};
  int lrc = plan_load_string("pd.yaml", text, strlen(text), &p, &dg);
  bool said = false;
  for (size_t i = 0; i < dg.n; i++)
    said |= strstr(dg.d[i].msg, "(P/D) needs each role's shard ranks") && dg.d[i].mark.line == 7 && dg.d[i].hint;
  EXPECT(lrc != 0 && said, "experts with P/D: rc %d, %s", lrc, dg.n ? dg.d[0].msg : "no diagnostic");
  if (lrc == 0) plan_free(&p);
  plan_diags_free(&dg);
  if (!h_load_plan("tests/plans/ep2-tiny-40.yaml", &p)) return;
  struct rt_gen_opts o = {.executor = RT_EXEC_STARPU};
  struct rt_ep_stats fe;
  int rc = rt_ep_begin(&p, &o, true, &fe, err, sizeof err);
  EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, "--executor direct"), "starpu across ranks: rc %d: %s", rc, err);
  rt_ep_end();
  o.executor = RT_EXEC_DIRECT;
  EXPECT(rt_ep_begin(&p, &o, false, &fe, err, sizeof err) == 0, "one process: %s", err);
  rt_ep_end();
  EXPECT(plan_ep_layer(&p, 0) && plan_ep_layer(&p, 39) && !plan_ep_layer(&p, 40), "ep2 layers");
  EXPECT_EQ(plan_expert_rank(&p, 5, 1), 0, "expert 1 of ep2 on rank 0");
  EXPECT_EQ(plan_expert_rank(&p, 5, 2), 1, "expert 2 of ep2 on rank 1");
  plan_free(&p);
  if (!h_load_plan("tests/plans/ppep3-tiny-40.yaml", &p)) return;
  EXPECT(!plan_ep_layer(&p, 3) && plan_ep_layer(&p, 4), "ppep3: layers 4-39 only");
  EXPECT_EQ(plan_place_ranks(&p), 3, "ppep3 ranks");
  EXPECT_EQ(plan_expert_rank(&p, 20, 0), 2, "ppep3: expert 0 on rank 2");
  EXPECT_EQ(plan_expert_rank(&p, 2, 0), 0, "ppep3: L2's experts with its stage");
  plan_free(&p);
}

int main(void) {
  shapes();
  nccl();
  weights_part();
  refusals();
  struct fx one;
  if (fx_open(&one, PLAN_T40)) {
    static const char *const plans[] = {"tests/plans/ep2-tiny-40.yaml", "tests/plans/ep4-tiny-40.yaml",
                                        "tests/plans/ppep2-tiny-40.yaml", "tests/plans/ppep3-tiny-40.yaml",
                                        "tests/plans/ppep4-tiny-40.yaml"};
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++) {
      struct fx ep;
      if (!fx_open(&ep, plans[i])) {
        EXPECT(0, "%s: %s", plans[i], err);
        continue;
      }
      equivalence(&ep, &one, RT_EXEC_DIRECT, i == 0); /* every length and chunk for ep2, one for the rest */
      if (i == 0) {
        attribution(&ep);
        int rc = rt_starpu_init(&(struct rt_starpu_opts){.workers = 2, .sched = "lws"}, err, sizeof err);
        if (rc == 0) {
          equivalence(&ep, &one, RT_EXEC_STARPU, false);
          rt_starpu_shutdown();
        } else {
          EXPECT(0, "StarPU: %s", err);
        }
      }
      fx_close(&ep);
    }
    fx_close(&one);
  }
  /* fp32 numerics: the MoE output is not rounded to bf16, so a combine in
   * another order than the op's (even the two experts of a token swapped)
   * changes bits */
  if (fx_open(&one, "tests/plans/tiny-40-f32.yaml")) {
    struct fx ep;
    if (fx_open(&ep, "tests/plans/ep2-tiny-40-f32.yaml")) {
      equivalence(&ep, &one, RT_EXEC_DIRECT, true);
      fx_close(&ep);
    } else {
      EXPECT(0, "ep2-tiny-40-f32: %s", err);
    }
    fx_close(&one);
  }
  return h_report("ep");
}

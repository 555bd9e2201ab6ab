/* test_devbind.c: a request's state in device slabs (runtime/device/devbind.h,
 * runtime/exec/devseg.h, runtime/exec/exec_dev.c), on the CPU through the host-memory
 * stand-in of a device state (rt_dev_ctx_open_host): the same slabs, twin,
 * bindings, segments and copies a CUDA home uses, with the CPU backend
 * computing.
 *
 *  - the stand-in run: prefill then greedy decode with the request's state
 *    in the slabs (every node bound through the twin; decode steps by layer
 *    segment, their metadata applied from the graph as a replay needs, and,
 *    second, node by node) gives the host run's logits bitwise at every
 *    step, and after the download the same KV entries, rings and tails,
 *    bitwise; before the download the host request's rings were never
 *    written (every position still -1): the state lived in the slabs;
 *  - the regions a decode node binds are the host binding's (its ring and
 *    positions, its tail when the source has pending rows, the pages its
 *    entry ranges cover, the appended ones marked written), each inside its
 *    slab and distinct;
 *  - the parameter block of a decode node: its position and count, the ring
 *    slots p mod window, the page ids of the source it reads;
 *  - the parameter block of a decode node also holds what the CUDA
 *    attention reads on the device inside a segment: its tail's count and
 *    first position, the entries committed and readable, the ring floor,
 *    and as many pages as rt_dev_listed_pages says;
 *  - segments cover every layer node of a decode graph once (but a ring
 *    reset's), one layer each, at most one KV node each; two consecutive
 *    steps with the same pages have the same key and different blocks;
 *  - the twin's token ids and page tables in the stand-in's memory: the
 *    CPU groups read the KV through the twin's table (kv_r_pages), and
 *    after each run the ids are the request's;
 *  - the StarPU executor on the stand-in (its slabs registered on main RAM,
 *    a node's state from those handles, its metadata written back from the
 *    workers): the same logits and state, bitwise, node by node and with a
 *    decode segment's nodes run by its first node's task (the others only
 *    ordering the graph; a mutation that runs only the first node fails);
 *  - refusals: a device pool too small for the request's pages drops the
 *    request with the page named; all request slots taken is refused.
 *
 * Run: ctest --test-dir build -R '^devbind$'.
 */
#include "tests/model_fixture.h"

#include "runtime/device/devbind.h"
#include "runtime/exec/devseg.h"

#define N_PROMPT 22 /* 27 positions in all: ratio-2 tails end with a pending row (downloaded and compared) */
#define N_DECODE 5
#define CAP 64

/* The activation bytes of the largest graph this test runs. */
static size_t act_need(const struct fx *f) {
  struct graph g;
  struct graph_opts go = {.replay = -1};
  size_t need = 0;
  if (graph_build_prefill(&g, f->p, N_PROMPT, &go, err, sizeof err) == 0) {
    need = rt_dev_act_bytes(&g);
    graph_free(&g);
  }
  for (int64_t p = N_PROMPT; p < N_PROMPT + N_DECODE; p++)
    if (graph_build_decode(&g, f->p, p, err, sizeof err) == 0) {
      size_t b = rt_dev_act_bytes(&g);
      if (b > need) need = b;
      graph_free(&g);
    }
  return need;
}

/* prompt, then N_DECODE greedy steps; logits (1 + N_DECODE, V). */
static bool run(const struct fx *f, struct rt_request *r, const int32_t *prompt, float *logits) {
  if (!prefill(f, r, prompt, N_PROMPT, CAP, 0, -1, logits, NULL)) return false;
  for (int s = 0; s < N_DECODE; s++) {
    int32_t tok = greedy(logits + (size_t)s * f->V, f->V);
    if (!decode(f, r, tok, logits + (size_t)(s + 1) * f->V, NULL)) return false;
  }
  return true;
}

/* The same on the StarPU executor: prefill, then the greedy steps. */
static bool run_starpu(const struct fx *f, struct rt_request *r, const int32_t *prompt, float *logits) {
  if (rt_request_init(r, 0, f->p, f->pools, CAP)) return false;
  for (int64_t i = 0; i < N_PROMPT; i++) CEDAR_ASSERT(rt_request_push_token(r, prompt[i]) == 0);
  struct graph g;
  struct graph_opts go = {.replay = -1};
  CEDAR_ASSERT(graph_build_prefill(&g, f->p, N_PROMPT, &go, err, sizeof err) == 0);
  struct rt_exec_out out = {.logits = logits, .pos = NULL};
  int rc = rt_exec_starpu(&g, &f->M, r, &out, NULL, NULL, NULL, NULL, err, sizeof err);
  graph_free(&g);
  EXPECT(rc == 0, "%s: StarPU prefill: %s", f->path, err);
  if (rc) return false;
  r->n_pos = N_PROMPT;
  for (int s = 0; s < N_DECODE; s++) {
    CEDAR_ASSERT(rt_request_push_token(r, greedy(logits + (size_t)s * f->V, f->V)) == 0);
    CEDAR_ASSERT(graph_build_decode(&g, f->p, r->n_pos, err, sizeof err) == 0);
    out.logits = logits + (size_t)(s + 1) * f->V;
    rc = rt_exec_starpu(&g, &f->M, r, &out, NULL, NULL, NULL, NULL, err, sizeof err);
    graph_free(&g);
    EXPECT(rc == 0, "%s: StarPU decode: %s", f->path, err);
    if (rc) return false;
    r->n_pos++;
  }
  return true;
}

static bool host_rings_untouched(const struct fx *f, const struct rt_request *r) {
  for (int l = 0; l < f->p->n_layers; l++)
    for (int i = 0; i < r->ring[l].window; i++)
      if (r->ring[l].pos[i] != -1) return false;
  return true;
}

static void check_regions(const struct fx *f, struct rt_dev_twin *tw, struct rt_request *r) {
  struct graph g;
  if (graph_build_decode(&g, f->p, r->n_pos, err, sizeof err)) return;
  CEDAR_ASSERT(rt_reserve_pages(&g, r) < 0);
  const struct rt_dev_addrs *A = tw->A;
  int checked = 0;
  for (int k = 0; k < g.n_node; k++) {
    const struct graph_node *nd = &g.node[k];
    struct rt_bound st;
    rt_bind_node(&g, r, nd, &st);
    int n = rt_dev_node_regions(tw, &g, r, nd, NULL, 0);
    struct rt_dev_span *s = calloc((size_t)(n ? n : 1), sizeof(*s));
    rt_dev_node_regions(tw, &g, r, nd, s, n);
    int rings = 0, tails = 0, read_pages = 0, write_pages = 0;
    for (int i = 0; i < n; i++) {
      uint8_t *a = s[i].addr;
      EXPECT(a != NULL, "%s: region %d has no address", nd->name, i);
      bool in_kv = a >= A->kv && a + s[i].bytes <= A->kv + A->L.kv_total;
      bool in_req = a >= A->req + (size_t)tw->slot * A->L.req_bytes && a + s[i].bytes <= A->req + (size_t)(tw->slot + 1) * A->L.req_bytes;
      EXPECT(s[i].kind == RT_DEV_PAGE ? in_kv : in_req, "%s: region %d outside its slab", nd->name, i);
      for (int j = 0; j < i; j++) EXPECT(s[j].addr != s[i].addr, "%s: regions %d and %d share an address", nd->name, j, i);
      rings += s[i].kind == RT_DEV_RING;
      tails += s[i].kind == RT_DEV_TAIL;
      read_pages += s[i].kind == RT_DEV_PAGE && s[i].read_kv;
      write_pages += s[i].kind == RT_DEV_PAGE && s[i].write;
    }
    EXPECT(rings == (st.ring != NULL), "%s: %d ring regions, host binds %s", nd->name, rings, st.ring ? "one" : "none");
    bool tail_buf = st.tail && r->tail_buf[st.tail - r->tail];
    EXPECT(tails == tail_buf, "%s: %d tail regions, host tail buffer %s", nd->name, tails, tail_buf ? "yes" : "no");
    if (st.kv_r) {
      int64_t pe = st.kv_r->pool->page_entries;
      EXPECT(read_pages == (st.kv_r_end + pe - 1) / pe, "%s: %d pages read, %lld entries visible", nd->name,
             read_pages, (long long)st.kv_r_end);
    }
    if (st.kv_w && st.kv_w_end > st.kv_w->n_entries) {
      int64_t pe = st.kv_w->pool->page_entries;
      EXPECT(write_pages == (st.kv_w_end + pe - 1) / pe - st.kv_w->n_entries / pe, "%s: %d pages written", nd->name,
             write_pages);
    }
    if (nd->op == GRAPH_ATTN) { /* the parameter block of its step */
      struct rt_dev_params P;
      EXPECT(rt_dev_params_fill(&P, &g, r, tw->slot, nd, err, sizeof err) == 0, "%s: params: %s", nd->name, err);
      EXPECT(P.pos == nd->a && P.n == nd->n && P.request == tw->slot, "%s: params pos %lld n %d", nd->name,
             (long long)P.pos, P.n);
      EXPECT(P.ring_slot[0] == (int32_t)(nd->a % r->ring[nd->layer].window), "%s: ring slot %d", nd->name,
             P.ring_slot[0]);
      const struct rt_kv_seq *q = st.kv_r ? st.kv_r : st.kv_w;
      if (q) {
        EXPECT(P.n_pages > 0 && P.n_pages <= q->n_pages, "%s: %d pages of %d", nd->name, P.n_pages, q->n_pages);
        EXPECT(!memcmp(P.page, q->page_id, sizeof(int32_t) * (size_t)P.n_pages), "%s: page ids differ", nd->name);
        EXPECT(P.n_pages == rt_dev_listed_pages(&g, r, nd), "%s: %d pages listed, rt_dev_listed_pages %lld", nd->name,
               P.n_pages, (long long)rt_dev_listed_pages(&g, r, nd));
      }
      /* what the CUDA attention reads on the device inside a segment */
      EXPECT(!st.tail || (P.tail_count == st.tail->count && P.tail_pos0 == st.tail->pos0), "%s: tail %d@%lld, "
             "host %d@%lld", nd->name, P.tail_count, (long long)P.tail_pos0, st.tail ? st.tail->count : -1,
             st.tail ? (long long)st.tail->pos0 : -1LL);
      EXPECT(!st.kv_w || P.w_entries == st.kv_w->n_entries, "%s: %lld entries committed, host %lld", nd->name,
             (long long)P.w_entries, st.kv_w ? (long long)st.kv_w->n_entries : -1LL);
      EXPECT(!st.kv_r || P.r_entries == st.kv_r_end, "%s: %lld entries readable, graph %lld", nd->name,
             (long long)P.r_entries, (long long)st.kv_r_end);
      int64_t r0 = r->ring[nd->layer].r0 > nd->r0 ? r->ring[nd->layer].r0 : nd->r0;
      EXPECT(P.r0 == r0, "%s: r0 %lld, want %lld", nd->name, (long long)P.r0, (long long)r0);
      checked++;
    }
    free(s);
  }
  EXPECT(checked > 0, "no attention node checked");
  /* segments: every layer node without a ring reset once, one layer each,
   * at most one KV node each; keys of two steps of one parity (key_slot:
   * vendor: a node scoring the slot's keys, which an odd step's ratio-2
   * sources leave as the last step's, runs eagerly) */
  int *end = calloc((size_t)g.n_node, sizeof(int)), *end2 = NULL;
  int n_seg = rt_dev_segments(&g, end);
  EXPECT(n_seg >= f->p->n_layers, "%d segments for %d layers", n_seg, f->p->n_layers);
  for (int k = 0, in = 0; k < g.n_node; k++) {
    if (end[k] > k) {
      in = end[k];
      int kv = 0;
      for (int j = k; j < end[k]; j++) {
        EXPECT(g.node[j].layer == g.node[k].layer, "segment at %s spans layers", g.node[k].name);
        for (int u = 0; u < g.node[j].n_use; u++) {
          const struct graph_data *gd = &g.data[g.node[j].use[u].data];
          if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_KV) {
            kv++;
            break;
          }
        }
      }
      EXPECT(kv <= 1, "segment at %s holds %d KV nodes", g.node[k].name, kv);
    }
    enum graph_op op = g.node[k].op;
    bool layer_op = op == GRAPH_ENGRAM || op == GRAPH_ATTN || op == GRAPH_MOE || op == GRAPH_DEC_KV;
    bool slot = g.node[k].key_src[0] >= 0 || g.node[k].key_src[1] >= 0;
    if (layer_op && !(g.node[k].flags & GRAPH_F_RING_RESET)) EXPECT(k < in || slot, "%s is in no segment", g.node[k].name);
    if (slot) EXPECT(k >= in && end[k] <= k, "%s scores the slot's keys inside a segment", g.node[k].name);
  }
  struct graph g2;
  if (!graph_build_decode(&g2, f->p, r->n_pos + 2, err, sizeof err)) {
    end2 = calloc((size_t)g2.n_node, sizeof(int));
    EXPECT(rt_dev_segments(&g2, end2) == n_seg, "segments differ between two steps");
    for (int k = 0; k < g.n_node && k < g2.n_node; k++) {
      if (end[k] <= k || end2[k] != end[k]) continue;
      struct rt_dev_params P1, P2;
      int l1 = rt_dev_segment_lead(&g, k, end[k]);
      if (rt_dev_params_fill(&P1, &g, r, tw->slot, &g.node[l1], err, sizeof err) ||
          rt_dev_params_fill(&P2, &g2, r, tw->slot, &g2.node[l1], err, sizeof err))
        continue; /* the next step's pages are not reserved: nothing to compare */
      struct rt_cugraph_key k1 = rt_dev_segment_key(&g, k, end[k], &P1), k2 = rt_dev_segment_key(&g2, k, end[k], &P2);
      if (P1.n_pages == P2.n_pages)
        EXPECT(!memcmp(&k1, &k2, sizeof k1), "segment at %s: keys of two steps differ", g.node[k].name);
      EXPECT(P1.pos + 2 == P2.pos, "segment at %s: positions %lld, %lld", g.node[k].name, (long long)P1.pos,
             (long long)P2.pos);
    }
    graph_free(&g2);
  }
  free(end);
  free(end2);
  graph_free(&g);
}

/* The twin's token ids and page tables in the stand-in's memory hold the
 * request's; a rewritten id (a rolled-back suffix) reaches them on the
 * next sync, and only what differs is uploaded. */
static void check_aux(struct rt_dev_ctx *d, struct rt_dev_twin *tw, struct rt_request *r) {
  char err[256];
  EXPECT(tw->aux->tok_n == r->n_tokens && !memcmp(tw->aux->tok_dev, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens),
         "the twin's token ids are not the request's (%lld of %lld)", (long long)tw->aux->tok_n, (long long)r->n_tokens);
  int tables = 0;
  for (int l = 0; l < tw->n_layers; l++) {
    if (!r->seq[l].pool) {
      EXPECT(!tw->aux->pt_dev[l], "layer %d has no KV source but a page table", l);
      continue;
    }
    EXPECT(tw->aux->pt_dev[l] && tw->aux->pt_n[l] == r->seq[l].n_pages, "layer %d: page table of %d pages, the request holds %d",
           l, tw->aux->pt_n[l], r->seq[l].n_pages);
    if (!tw->aux->pt_dev[l]) continue;
    for (int i = 0; i < r->seq[l].n_pages; i++)
      EXPECT(tw->aux->pt_dev[l][i] == rt_dev_addr_page(tw->A, l, r->seq[l].page_id[i]), "layer %d page %d: table entry",
             l, i);
    tables += r->seq[l].n_pages > 0;
  }
  EXPECT(tables > 0, "no page table checked");
  if (r->n_tokens < 2) return;
  int64_t k = r->n_tokens - 2;
  int32_t keep = r->tokens[k];
  r->tokens[k] = keep ^ 1;
  EXPECT(rt_dev_request_twin(d, r, err, sizeof err) == tw && tw->aux->tok_dev[k] == (keep ^ 1) && tw->aux->tok_host[k] == (keep ^ 1),
         "a rewritten token id did not reach the twin: %s", err);
  r->tokens[k] = keep;
  EXPECT(rt_dev_request_twin(d, r, err, sizeof err) == tw && tw->aux->tok_dev[k] == keep, "restoring an id: %s", err);
}

static void test_plan(const char *path) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  int32_t prompt[N_PROMPT];
  make_prompt(prompt, N_PROMPT, f.V, PROMPT_SEED);
  size_t nl = (size_t)(1 + N_DECODE) * f.V;
  float *ref = calloc(nl, sizeof(float)), *got = calloc(nl, sizeof(float));
  struct rt_request rref = {0};
  bool ok = run(&f, &rref, prompt, ref);
  EXPECT(ok, "%s: host run", path);

  struct rt_request shape = {0};
  CEDAR_ASSERT(rt_request_init(&shape, 9, f.p, f.pools, CAP) == 0);
  struct rt_dev_layout L;
  int rc = rt_dev_layout_init(&L, f.p, f.pools, &shape, 64, 2, act_need(&f), err, sizeof err);
  EXPECT(rc == 0, "%s: layout: %s", path, err);
  /* mode 1: direct, by segment; 0: direct, node by node; -1: StarPU, node by
   * node; -2: StarPU, a segment's nodes in its lead's task */
  for (int mode = 1; ok && rc == 0 && mode >= -2; mode--) {
    int segments = mode == -2 ? 1 : mode;
    struct rt_dev_ctx *d = NULL;
    EXPECT(rt_dev_ctx_open_host(&d, &L, err, sizeof err) == 0, "stand-in: %s", err);
    if (!d) break;
    d->segments = segments > 0;
    f.M.dev = d;
    struct rt_request r = {0};
    memset(got, 0, sizeof(float) * nl);
    bool ran = mode >= 0 ? run(&f, &r, prompt, got) : run_starpu(&f, &r, prompt, got);
    EXPECT(ran, "%s: stand-in run (mode %d)", path, mode);
    if (ran) {
      EXPECT(!memcmp(ref, got, sizeof(float) * nl), "%s: stand-in logits differ from the host run (mode %d)",
             path, mode);
      EXPECT(host_rings_untouched(&f, &r), "%s: the host rings were written during a device-home run", path);
      EXPECT(segments > 0 ? d->segment_runs >= N_DECODE * f.p->n_layers : d->segment_runs == 0,
             "%s: %lld decode segments ran (mode %d)", path, (long long)d->segment_runs, mode);
      struct rt_dev_twin *tw = rt_dev_request_twin(d, &r, err, sizeof err);
      EXPECT(tw != NULL, "twin: %s", err);
      if (tw && segments > 0) check_regions(&f, tw, &r);
      if (tw) check_aux(d, tw, &r);
      void *aux_mem = tw ? tw->aux->mem : NULL;
      EXPECT(rt_dev_request_release(d, &r, err, sizeof err) == 0, "download: %s", err);
      if (mode == 1 && tw) { /* the slot's tables outlive its request (segments bake them in) and start empty */
        struct rt_dev_twin *t2 = rt_dev_request_twin(d, &rref, err, sizeof err);
        EXPECT(t2 && t2->aux->mem == aux_mem, "a reclaimed slot's tables moved (%s)", err);
        if (t2) check_aux(d, t2, &rref);
        EXPECT(rt_dev_request_release(d, &rref, err, sizeof err) == 0, "download: %s", err);
      }
      EXPECT(!host_rings_untouched(&f, &r), "%s: the download brought no ring back", path);
      EXPECT(requests_equal(&f, &rref, &r, true), "%s: state after download differs from the host run (mode %d)",
             path, mode);
    }
    f.M.dev = NULL;
    rt_request_free(&r);
    rt_dev_ctx_close(d);
  }

  /* refusals: a device pool of one page (the request's pages have ids past
   * it: the host run's request still holds the first ones); one slot taken */
  struct rt_dev_layout L1;
  if (rt_dev_layout_init(&L1, f.p, f.pools, &shape, 1, 1, act_need(&f), err, sizeof err) == 0) {
    struct rt_dev_ctx *d = NULL;
    if (rt_dev_ctx_open_host(&d, &L1, err, sizeof err) == 0) {
      f.M.dev = d;
      struct rt_request r = {0}, r2 = {0};
      float *lg = calloc((size_t)f.V, sizeof(float));
      CEDAR_ASSERT(rt_request_init(&r, 1, f.p, f.pools, CAP) == 0);
      for (int i = 0; i < N_PROMPT; i++) CEDAR_ASSERT(rt_request_push_token(&r, prompt[i]) == 0);
      struct graph g;
      struct graph_opts go = {.replay = -1};
      CEDAR_ASSERT(graph_build_prefill(&g, f.p, N_PROMPT, &go, err, sizeof err) == 0);
      struct rt_exec_out out = {.logits = lg, .pos = NULL};
      rc = rt_exec_direct(&g, &f.M, &r, &out, NULL, NULL, NULL, err, sizeof err);
      EXPECT(rc == CEDAR_ENOMEM && strstr(err, "past the device pool"), "%s: one-page device pool: rc %d: %s", path,
             rc, err);
      graph_free(&g);
      rt_request_free(&r);
      CEDAR_ASSERT(rt_request_init(&r, 1, f.p, f.pools, CAP) == 0); /* no pages: it takes the one slot */
      EXPECT(rt_dev_request_twin(d, &r, err, sizeof err) != NULL, "a fresh request: %s", err);
      CEDAR_ASSERT(rt_request_init(&r2, 2, f.p, f.pools, CAP) == 0);
      EXPECT(rt_dev_request_twin(d, &r2, err, sizeof err) == NULL && strstr(err, "slots are taken"),
             "a second request in one slot: %s", err);
      f.M.dev = NULL;
      EXPECT(rt_dev_request_release(d, &r, err, sizeof err) == 0, "release: %s", err);
      rt_request_free(&r);
      rt_request_free(&r2);
      free(lg);
      rt_dev_ctx_close(d);
    }
  }
  rt_request_free(&shape);
  rt_request_free(&rref);
  free(ref);
  free(got);
  fx_close(&f);
}

int main(void) {
  struct rt_starpu_opts so = {.workers = 2};
  if (rt_starpu_init(&so, err, sizeof err)) {
    fprintf(stderr, "devbind: StarPU did not start: %s\n", err);
    return 1;
  }
  test_plan(PLAN_TINY);
  test_plan(PLAN_TWO);
  test_plan("plans/v41-mini.yaml");
  rt_starpu_shutdown();
  return h_report("devbind");
}

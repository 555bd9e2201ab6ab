/* test_exec_starpu.c: the StarPU executor (runtime/exec/exec_starpu.c) held to
 * the direct executor bitwise (DESIGN.md decision 1; STYLE.md 8), and the
 * overlap the graph allows, checked on the task times StarPU records.
 *
 * For each scheduler (eager, lws, dmda, prio) and 1 and 2 CPU workers, in
 * one process (StarPU is started and stopped once per configuration), on
 * tests/oracle/plans/tiny.yaml, tiny-dense.yaml and tiny-40.yaml with
 * in-memory synthetic weights:
 *
 *  - cold prefill (CED) and dense prefill at several chunk sizes (the
 *    plan's, odd ones, one-shot), every position's logits, then greedy
 *    decode steps: all logits and all request state bitwise equal to the
 *    direct executor's: every KV source's entry bytes and n_entries, every
 *    tail's count, pos0 and rows, every ring's slots, positions and r0
 *    (SPEC 8.2.12 and 8.8.43 hold for StarPU because they hold for direct,
 *    tests/test_model_*.c);
 *  - rt_generate routed to StarPU gives direct's tokens and logits;
 *  - a request whose page table runs out fails cleanly (ENOMEM, message)
 *    and returns every page;
 *  - recorded task times (StarPU profiling): no task starts before every
 *    task it depends on has ended (the edges were submitted); every Engram
 *    row gather was submitted before any other task;
 *  - with two workers, summed over the configuration's prefills (timing is
 *    the OS's, so one run proves nothing, many do): tasks on different
 *    workers overlap in time (Engram row gathers left out: they wait for
 *    nothing); an attention or MoE task of chunk c+1 starts before a deeper
 *    layer's task of chunk c ends (the wavefront); a decoder-global
 *    projection (dec_kv) of chunk c overlaps encoder work of chunk c+1 on
 *    the other worker.
 *
 * Before StarPU starts: concurrent single-thread sgemm calls (OpenBLAS, as
 * op_linear makes them) from two threads give the bits of serial calls.
 *
 * The graph's own shape (wavefront edges, gathers without edges) is
 * tests/test_graph.c's. CEDAR_STARPU_REPEAT=N repeats the whole matrix
 * (race hunting). Exits 77 when StarPU cannot start here.
 * Run from the repository root: ctest --test-dir build -R exec_starpu.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/sample.h"
#include "base/check.h"
#include "runtime/exec/exec.h"
#include "runtime/gen/generate.h"
#include "scheduler/graph.h"
#include "tests/harness.h"

#define WEIGHT_SEED 11
#define PROMPT_SEED 0x51a7ULL
#define STEPS 3 /* greedy decode steps after each prefill */

static char err[1024];

/* ---- fixture ------------------------------------------------------------- */

struct fx {
  const char *path;
  struct plan p;
  struct weights w;
  struct rt_model M;
  struct rt_kv_pool *pools;
  int V;
  int64_t n;            /* prompt length */
  int32_t *prompt;
  bool ok;
};

static bool fx_open(struct fx *f, const char *path, int64_t n) {
  memset(f, 0, sizeof(*f));
  f->path = path;
  f->pools = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*f->pools));
  if (!h_load_plan(path, &f->p)) return false;
  int rc;
  rc = weights_synth(&f->w, &f->p, WEIGHT_SEED, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err);
  if (!rc) rc = rt_model_init(&f->M, &f->p, &f->w, err, sizeof err);
  if (!rc) rc = rt_kv_pools_init(f->pools, &f->p, err, sizeof err);
  EXPECT(rc == 0, "%s: %s", path, err);
  f->V = f->p.model.vocab;
  f->n = n;
  f->prompt = cedar_xmalloc(sizeof(int32_t) * (size_t)n);
  uint64_t s = PROMPT_SEED;
  for (int64_t i = 0; i < n; i++) f->prompt[i] = (int32_t)(op_rng_next(&s) % (uint64_t)f->V);
  f->ok = rc == 0;
  return f->ok;
}

static void fx_close(struct fx *f) {
  rt_kv_pools_free(f->pools, f->p.n_layers);
  rt_model_free(&f->M);
  weights_free(&f->w);
  plan_free(&f->p);
  free(f->pools);
  free(f->prompt);
  memset(f, 0, sizeof(*f));
}

/* ---- request state, copied for a bitwise comparison ----------------------- */

struct snap {
  int n_layers;
  int64_t kv_n[PLAN_MAX_LAYERS];
  uint8_t *kv[PLAN_MAX_LAYERS];        /* entries, concatenated */
  int tail_count[PLAN_MAX_LAYERS];
  int64_t tail_pos0[PLAN_MAX_LAYERS];
  float *tail[PLAN_MAX_LAYERS];        /* v then g of the pending rows */
  int64_t ring_r0[PLAN_MAX_LAYERS];
  int64_t *ring_pos[PLAN_MAX_LAYERS];  /* (window) */
  uint8_t *ring[PLAN_MAX_LAYERS];      /* filled slots' bytes; empty slots zero */
  size_t ring_bytes[PLAN_MAX_LAYERS];
};

static void snap_take(struct snap *s, const struct rt_request *r) {
  memset(s, 0, sizeof(*s));
  s->n_layers = r->plan->n_layers;
  for (int l = 0; l < s->n_layers; l++) {
    const struct rt_ring *g = &r->ring[l];
    s->ring_r0[l] = g->r0;
    s->ring_pos[l] = cedar_xmalloc(sizeof(int64_t) * (size_t)g->window);
    memcpy(s->ring_pos[l], g->pos, sizeof(int64_t) * (size_t)g->window);
    s->ring_bytes[l] = (size_t)g->window * g->entry_bytes;
    s->ring[l] = cedar_xcalloc(s->ring_bytes[l] ? s->ring_bytes[l] : 1, 1);
    for (int i = 0; i < g->window; i++)
      if (g->pos[i] >= 0) memcpy(s->ring[l] + (size_t)i * g->entry_bytes, g->slot + (size_t)i * g->entry_bytes, g->entry_bytes);
    const struct rt_kv_seq *q = &r->seq[l];
    if (!q->pool) continue;
    size_t eb = q->pool->entry_bytes;
    s->kv_n[l] = q->n_entries;
    s->kv[l] = cedar_xmalloc(eb * (size_t)(q->n_entries + 1));
    for (int64_t e = 0; e < q->n_entries; e++) memcpy(s->kv[l] + (size_t)e * eb, rt_kv_entry(q, e), eb);
    const struct op_comp_tail *t = &r->tail[l];
    s->tail_count[l] = t->count;
    s->tail_pos0[l] = t->pos0;
    size_t rows = (size_t)t->count * (size_t)t->d;
    s->tail[l] = cedar_xmalloc(sizeof(float) * (2 * rows + 1));
    if (rows) {
      memcpy(s->tail[l], t->v, sizeof(float) * rows);
      memcpy(s->tail[l] + rows, t->g, sizeof(float) * rows);
    }
  }
}

static void snap_free(struct snap *s) {
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) {
    free(s->kv[l]);
    free(s->tail[l]);
    free(s->ring_pos[l]);
    free(s->ring[l]);
  }
  memset(s, 0, sizeof(*s));
}

/* EXPECT b == a in every field; what names the case. */
static void snap_check(const struct snap *a, const struct snap *b, const struct fx *f, const char *what) {
  for (int l = 0; l < a->n_layers; l++) {
    EXPECT(a->ring_r0[l] == b->ring_r0[l], "%s: L%d ring r0 %" PRId64 " != direct %" PRId64, what, l, b->ring_r0[l],
           a->ring_r0[l]);
    EXPECT(!memcmp(a->ring_pos[l], b->ring_pos[l], a->ring_bytes[l] ? sizeof(int64_t) * (size_t)f->p.model.window : 0),
           "%s: L%d ring positions differ", what, l);
    EXPECT(!memcmp(a->ring[l], b->ring[l], a->ring_bytes[l]), "%s: L%d ring slot bytes differ", what, l);
    if (!a->kv[l]) continue;
    size_t eb = f->pools[l].entry_bytes;
    EXPECT(a->kv_n[l] == b->kv_n[l], "%s: L%d n_entries %" PRId64 " != direct %" PRId64, what, l, b->kv_n[l],
           a->kv_n[l]);
    if (a->kv_n[l] == b->kv_n[l])
      EXPECT(!memcmp(a->kv[l], b->kv[l], eb * (size_t)a->kv_n[l]), "%s: L%d entry bytes differ", what, l);
    EXPECT(a->tail_count[l] == b->tail_count[l] && a->tail_pos0[l] == b->tail_pos0[l],
           "%s: L%d tail (count %d, pos0 %" PRId64 ") != direct (%d, %" PRId64 ")", what, l, b->tail_count[l],
           b->tail_pos0[l], a->tail_count[l], a->tail_pos0[l]);
    size_t rows = (size_t)a->tail_count[l] * (size_t)f->p.model.head_dim;
    if (a->tail_count[l] == b->tail_count[l])
      EXPECT(!memcmp(a->tail[l], b->tail[l], sizeof(float) * 2 * rows), "%s: L%d tail rows differ", what, l);
  }
}

/* ---- recorded times --------------------------------------------------------- */

/* Evidence of overlap, summed over the two-worker prefills of one
 * configuration. */
struct overlap {
  int64_t pairs;    /* tasks on different workers overlapping */
  int64_t wave;     /* (chunk c+1 task, deeper chunk c task) with the first starting before the second ends */
  int64_t deckv;    /* dec_kv(c) overlapping encoder work of chunk c+1 on the other worker */
  int prefills;
};

static bool overlaps(const struct rt_task_time *a, const struct rt_task_time *b) {
  return a->worker != b->worker && a->start_us < b->end_us && b->start_us < a->end_us;
}

static bool is_encoder_work(const struct graph *g, const struct graph_node *nd) {
  return nd->layer >= 0 && nd->op != GRAPH_DEC_KV && g->plan->layer[nd->layer].region == PLAN_ENCODER;
}

static bool is_layer_work(const struct graph_node *nd) { return nd->op == GRAPH_ATTN || nd->op == GRAPH_MOE; }

/* Engram row gathers wait for nothing, so they overlap anything: left out. */
static void count_overlap(const struct graph *g, const struct rt_task_time *t, struct overlap *ov) {
  ov->prefills++;
  for (int i = 0; i < g->n_node; i++)
    for (int j = i + 1; j < g->n_node; j++) {
      const struct graph_node *a = &g->node[i], *b = &g->node[j];
      if (a->op == GRAPH_ENGRAM_GATHER || b->op == GRAPH_ENGRAM_GATHER) continue;
      ov->pairs += overlaps(&t[i], &t[j]);
      if (is_layer_work(a) && is_layer_work(b) && b->chunk == a->chunk + 1 && b->layer < a->layer &&
          !(b->flags & GRAPH_F_REPLAY) && !(a->flags & GRAPH_F_REPLAY) && t[j].start_us < t[i].end_us)
        ov->wave++;
      if (a->op == GRAPH_DEC_KV && b->chunk == a->chunk + 1 && is_encoder_work(g, b) && overlaps(&t[i], &t[j]))
        ov->deckv++;
    }
}

/* Edges honoured and gathers submitted first: these hold on every run. */
static void check_times(const struct graph *g, const struct rt_task_time *t, int workers, const char *what) {
  int late = 0, first_bad = -1;
  for (int k = 0; k < g->n_node; k++)
    for (int i = 0; i < g->node[k].n_dep; i++)
      if (t[k].start_us < t[g->node[k].dep[i]].end_us) {
        if (first_bad < 0) first_bad = k;
        late++;
      }
  EXPECT(late == 0, "%s: %d tasks started before a task they depend on ended (first: %s)", what, late,
         first_bad >= 0 ? g->node[first_bad].name : "-");
  double gathers_last = -1e300, others_first = 1e300;
  for (int k = 0; k < g->n_node; k++) {
    if (g->node[k].op == GRAPH_ENGRAM_GATHER)
      gathers_last = t[k].submit_us > gathers_last ? t[k].submit_us : gathers_last;
    else
      others_first = t[k].submit_us < others_first ? t[k].submit_us : others_first;
    EXPECT(t[k].worker >= 0 && t[k].worker < workers, "%s: %s ran on worker %d of %d", what, g->node[k].name,
           t[k].worker, workers);
  }
  EXPECT(gathers_last <= others_first, "%s: an Engram row gather was submitted after another task", what);
}

/* ---- one case: prefill at a chunk size, then decode steps ------------------- */

struct outcome {
  float *logits;           /* (rows + STEPS, V): prefill rows, then each decode step */
  int64_t rows;
  struct snap st[1 + STEPS];
  bool ok;
};

static void outcome_free(struct outcome *o) {
  free(o->logits);
  for (int i = 0; i <= STEPS; i++) snap_free(&o->st[i]);
  memset(o, 0, sizeof(*o));
}

static int exec(bool starpu, const struct graph *g, const struct fx *f, struct rt_request *r, float *logits,
                struct rt_task_time *times) {
  struct rt_exec_out out = {.logits = logits, .pos = NULL};
  if (!starpu) return rt_exec_direct(g, &f->M, r, &out, NULL, NULL, NULL, err, sizeof err);
  return rt_exec_starpu(g, &f->M, r, &out, NULL, times, NULL, NULL, err, sizeof err);
}

/* Run one graph; under StarPU check its times and count overlap. */
static bool run_one(bool starpu, const struct graph *g, const struct fx *f, struct rt_request *r, float *logits,
                    struct overlap *ov, const char *what) {
  struct rt_task_time *t = starpu ? cedar_xcalloc((size_t)g->n_node, sizeof(*t)) : NULL;
  int rc = exec(starpu, g, f, r, logits, t);
  EXPECT(rc == 0, "%s: %s", what, err);
  if (!rc && starpu) {
    check_times(g, t, rt_starpu_workers(), what);
    if (ov && g->flow != GRAPH_DECODE && g->n_prompt > g->chunk) count_overlap(g, t, ov);
  }
  free(t);
  return rc == 0;
}

static bool run_case(const struct fx *f, int chunk, bool starpu, struct outcome *o, struct overlap *ov,
                     const char *what) {
  memset(o, 0, sizeof(*o));
  struct rt_request r;
  CEDAR_ASSERT(rt_request_init(&r, 0, &f->p, f->pools, f->n + STEPS) == 0);
  for (int64_t i = 0; i < f->n; i++) CEDAR_ASSERT(rt_request_push_token(&r, f->prompt[i]) == 0);
  struct graph g;
  struct graph_opts go = {.chunk = chunk, .replay = -1, .all_logits = true};
  CEDAR_ASSERT(graph_build_prefill(&g, &f->p, f->n, &go, err, sizeof err) == 0);
  o->rows = g.out_rows;
  o->logits = cedar_xmalloc(sizeof(float) * (size_t)(o->rows + STEPS) * f->V);
  bool ok = run_one(starpu, &g, f, &r, o->logits, ov, what);
  graph_free(&g);
  r.n_pos = f->n;
  if (ok) snap_take(&o->st[0], &r);
  for (int s = 0; s < STEPS && ok; s++) {
    const float *last = o->logits + (size_t)(o->rows + s - 1) * f->V;
    CEDAR_ASSERT(rt_request_push_token(&r, op_sample_greedy(last, f->V)) == 0);
    CEDAR_ASSERT(graph_build_decode(&g, &f->p, r.n_pos, err, sizeof err) == 0);
    ok = run_one(starpu, &g, f, &r, o->logits + (size_t)(o->rows + s) * f->V, NULL, what);
    graph_free(&g);
    r.n_pos++;
    if (ok) snap_take(&o->st[1 + s], &r);
  }
  rt_request_free(&r);
  o->ok = ok;
  return ok;
}

static void compare(const struct fx *f, const struct outcome *ref, const struct outcome *got, const char *what) {
  if (!ref->ok || !got->ok) return;
  size_t n = (size_t)(ref->rows + STEPS) * f->V;
  EXPECT(got->rows == ref->rows, "%s: %" PRId64 " logits rows, direct %" PRId64, what, got->rows, ref->rows);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(&got->logits[i], &ref->logits[i], sizeof(float)) != 0;
  EXPECT(bad == 0, "%s: %zu of %zu logits differ from direct", what, bad, n);
  for (int s = 0; s <= STEPS; s++) {
    char w[256];
    snprintf(w, sizeof w, "%s, state after %s %d", what, s ? "decode step" : "prefill", s);
    snap_check(&ref->st[s], &got->st[s], f, w);
  }
}

/* ---- the matrix ------------------------------------------------------------- */

#define N_FX 3
#define N_CHUNK 4

struct suite {
  struct fx fx[N_FX];
  int chunk[N_FX][N_CHUNK];
  struct outcome ref[N_FX][N_CHUNK];
};

static void cases_init(struct suite *S) {
  static const char *path[N_FX] = {"tests/oracle/plans/tiny.yaml", "tests/oracle/plans/tiny-dense.yaml",
                                   "tests/oracle/plans/tiny-40.yaml"};
  static const int64_t n[N_FX] = {45, 45, 90};
  for (int i = 0; i < N_FX; i++) {
    if (!fx_open(&S->fx[i], path[i], n[i])) continue;
    int c[N_CHUNK] = {0, 7, 13, (int)n[i]}; /* the plan's, two odd ones, one-shot */
    for (int k = 0; k < N_CHUNK; k++) {
      S->chunk[i][k] = c[k];
      char w[160];
      snprintf(w, sizeof w, "%s chunk %d, direct", path[i], c[k]);
      run_case(&S->fx[i], c[k], false, &S->ref[i][k], NULL, w);
    }
  }
}

/* rt_generate on StarPU gives direct's tokens and logits (generate.c's
 * routing); a request that runs out of pages fails cleanly. */
static void generate_and_failure(struct fx *f, const char *cfg) {
  struct rt_gen_result a, b;
  struct rt_request ra, rb;
  struct rt_gen_opts go = {.chunk = 0, .replay = -1, .max_new = 4, .top_p = 1};
  EXPECT(rt_generate(&f->M, f->pools, &ra, f->prompt, f->n, &go, &a, err, sizeof err) == 0, "%s", err);
  go.executor = RT_EXEC_STARPU;
  EXPECT(rt_generate(&f->M, f->pools, &rb, f->prompt, f->n, &go, &b, err, sizeof err) == 0, "%s: %s", cfg, err);
  EXPECT(a.n_tokens == b.n_tokens && !memcmp(a.tokens, b.tokens, sizeof(int32_t) * (size_t)a.n_tokens) &&
             !memcmp(a.prefill_logits, b.prefill_logits, sizeof(float) * (size_t)f->V) &&
             !memcmp(a.decode_logits, b.decode_logits, sizeof(float) * (size_t)f->V * 3),
         "%s: rt_generate on StarPU differs from direct", cfg);
  rt_gen_result_free(&a);
  rt_gen_result_free(&b);
  rt_request_free(&ra);
  rt_request_free(&rb);

  /* No allocation-failure hook exists in state.c: shrink one ratio-1
   * source's reserved page table to one page (as tests/test_model_*.c does)
   * and prefill more positions than a page holds. */
  int src = -1;
  for (int l = 0; l < f->p.n_layers; l++)
    if (plan_is_kv_source(&f->p.layer[l]) && f->p.layer[l].ratio == 1) src = l;
  CEDAR_ASSERT(src >= 0);
  int64_t n = 2 * (int64_t)f->pools[src].page_entries + 3;
  struct rt_request r;
  CEDAR_ASSERT(rt_request_init(&r, 1, &f->p, f->pools, n) == 0);
  uint64_t seed = 9;
  for (int64_t i = 0; i < n; i++) CEDAR_ASSERT(rt_request_push_token(&r, (int32_t)(op_rng_next(&seed) % (uint64_t)f->V)) == 0);
  r.seq[src].cap_pages = 1;
  struct graph g;
  CEDAR_ASSERT(graph_build_prefill(&g, &f->p, n, NULL, err, sizeof err) == 0);
  float *lg = cedar_xmalloc(sizeof(float) * (size_t)f->V);
  err[0] = 0;
  int rc = exec(true, &g, f, &r, lg, NULL);
  char name[16];
  snprintf(name, sizeof name, "L%d.", src);
  EXPECT(rc == CEDAR_ENOMEM && strstr(err, name) && strstr(err, "exhausted"),
         "%s: an exhausted page table gave %d (%s)", cfg, rc, err);
  graph_free(&g);
  free(lg);
  rt_request_free(&r);
  int64_t held = 0;
  for (int l = 0; l < f->p.n_layers; l++) held += f->pools[l].pages_in_use;
  EXPECT(held == 0, "%s: %" PRId64 " pages still held after the failed request", cfg, held);
}

static void run_config(struct suite *S, const char *sched, int workers) {
  struct rt_starpu_opts so = {.workers = workers, .sched = sched, .profile = true};
  int rc = rt_starpu_init(&so, err, sizeof err);
  EXPECT(rc == 0, "rt_starpu_init(%s, %d): %s", sched, workers, err);
  if (rc) return;
  char cfg[64];
  snprintf(cfg, sizeof cfg, "%s x%d", sched, workers);
  struct overlap ov = {0}, ov_ced = {0};
  for (int i = 0; i < N_FX; i++) {
    struct fx *f = &S->fx[i];
    if (!f->ok) continue;
    for (int k = 0; k < N_CHUNK; k++) {
      char w[200];
      snprintf(w, sizeof w, "%s, %s chunk %d", cfg, f->path, S->chunk[i][k]);
      struct outcome o;
      run_case(f, S->chunk[i][k], true, &o, f->p.serving.ced ? &ov_ced : &ov, w);
      compare(f, &S->ref[i][k], &o, w);
      outcome_free(&o);
    }
  }
  generate_and_failure(&S->fx[0], cfg);
  rt_starpu_shutdown();
  if (workers < 2) return;
  ov.pairs += ov_ced.pairs;
  ov.wave += ov_ced.wave;
  printf("  %s: %d chunked prefills; overlapping task pairs %" PRId64 ", wavefront pairs %" PRId64
         ", dec_kv beside the next chunk %" PRId64 "\n",
         cfg, ov.prefills + ov_ced.prefills, ov.pairs, ov.wave, ov_ced.deckv);
  EXPECT(ov.pairs > 0, "%s: no two tasks ran at once on the two workers", cfg);
  EXPECT(ov.wave > 0, "%s: no chunk ran ahead of a deeper layer of the previous chunk", cfg);
  EXPECT(ov_ced.deckv > 0, "%s: no dec_kv ran beside encoder work of the next chunk", cfg);
}

/* ---- OpenBLAS from two threads ---------------------------------------------- */

#define GEMM_N 37   /* odd rows, like a chunk's tail */
#define GEMM_IN 256
#define GEMM_OUT 192
#define GEMM_REPS 40

struct gemm_job {
  const float *x, *W;
  float *y;   /* (GEMM_REPS, GEMM_N, GEMM_OUT) */
};

static void *gemm_loop(void *arg) {
  struct gemm_job *j = arg;
  for (int r = 0; r < GEMM_REPS; r++)
    op_linear(j->y + (size_t)r * GEMM_N * GEMM_OUT, j->x + (size_t)r * GEMM_IN, j->W, GEMM_N, GEMM_IN, GEMM_OUT,
              GEMM_IN, GEMM_OUT);
  return NULL;
}

/* Two threads of op_linear at once give the serial bits (Debian's
 * libopenblas0-pthread with one BLAS thread, as the model sets it). */
static void test_concurrent_sgemm(void) {
  op_blas_init();
  size_t nx = (size_t)(GEMM_N + GEMM_REPS) * GEMM_IN, ny = (size_t)GEMM_REPS * GEMM_N * GEMM_OUT;
  float *x[2], *W[2], *ser[2], *par[2];
  uint64_t seed = 5;
  for (int t = 0; t < 2; t++) {
    x[t] = cedar_xmalloc(sizeof(float) * nx);
    W[t] = cedar_xmalloc(sizeof(float) * GEMM_IN * GEMM_OUT);
    ser[t] = cedar_xmalloc(sizeof(float) * ny);
    par[t] = cedar_xmalloc(sizeof(float) * ny);
    h_fill(x[t], nx, &seed, -1, 1);
    h_fill(W[t], (size_t)GEMM_IN * GEMM_OUT, &seed, -1, 1);
    struct gemm_job j = {x[t], W[t], ser[t]};
    gemm_loop(&j);
  }
  struct gemm_job jp[2] = {{x[0], W[0], par[0]}, {x[1], W[1], par[1]}};
  pthread_t th[2];
  for (int t = 0; t < 2; t++) CEDAR_ASSERT(pthread_create(&th[t], NULL, gemm_loop, &jp[t]) == 0);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < 2; t++) {
    EXPECT(!memcmp(ser[t], par[t], sizeof(float) * ny), "thread %d: concurrent sgemm differs from serial", t);
    free(x[t]);
    free(W[t]);
    free(ser[t]);
    free(par[t]);
  }
}

int main(void) {
  test_concurrent_sgemm();
  struct rt_starpu_opts probe = {.workers = 1, .sched = "eager"};
  if (rt_starpu_init(&probe, err, sizeof err)) {
    printf("SKIP: StarPU does not start here: %s\n", err);
    return 77;
  }
  rt_starpu_shutdown();
  static struct suite S;
  cases_init(&S);
  const char *rep = getenv("CEDAR_STARPU_REPEAT");
  int repeat = rep ? atoi(rep) : 1;
  static const char *sched[] = {"eager", "lws", "dmda", "prio"};
  for (int it = 0; it < (repeat > 0 ? repeat : 1); it++)
    for (int s = 0; s < 4; s++)
      for (int w = 1; w <= 2; w++) run_config(&S, sched[s], w);
  for (int i = 0; i < N_FX; i++) {
    for (int k = 0; k < N_CHUNK; k++) outcome_free(&S.ref[i][k]);
    if (S.fx[i].ok || S.fx[i].pools) fx_close(&S.fx[i]);
  }
  return h_report("exec_starpu");
}

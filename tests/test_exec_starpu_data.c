/* test_exec_starpu_data.c: the StarPU executor's data are real buffers
 * (runtime/exec/exec_starpu_data.h), registered at the right lifetimes.
 *
 * On tests/oracle/plans/tiny.yaml (CED, ratio-2 and ratio-1 sources) with
 * synthetic weights, one request prefills and decodes on StarPU and a twin
 * request runs the same tokens on the direct executor. Then:
 *  - every committed KV entry, read through its source's page list
 *    (rt_starpu_page_read: the list's handle acquired for reading, so StarPU
 *    brings it home), has the bytes of the direct executor's entry (another
 *    request, other memory: the handle covers the pages' real buffers, not
 *    a stand-in), pages appended after the list was registered included;
 *  - every layer's SWA ring read through its handle has the direct ring's
 *    bytes in every filled slot;
 *  - a request's page lists are one handle per KV source, however many
 *    pages it holds (the 0.3 us StarPU spends per task buffer was paid per
 *    page before), and its other buffers are registered once (2 per ring,
 *    1 per ratio-2 tail, tokens, 2 for the kept encoder outputs), not per
 *    graph;
 *  - freeing the request drops its handles; a request no StarPU graph ran
 *    has no page list (EINVAL);
 *  - StarPU shut down while a request and its pools are alive releases
 *    their handles; freeing them afterwards is clean (ASan/LSan in CI);
 *  - an activation that cannot be allocated fails the request with
 *    CEDAR_ENOMEM and a message naming it, on both executors, instead of
 *    aborting the process (the next request runs).
 * Exits 77 when StarPU cannot start here.
 * Run from the repository root: ctest --test-dir build -R exec_starpu_data.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "ops/sample.h"
#include "runtime/exec/exec.h"
#include "scheduler/graph.h"
#include "tests/harness.h"

#define PLAN "tests/oracle/plans/tiny.yaml"
#define N_PROMPT 45 /* odd: a ratio-2 tail is left pending */
#define STEPS 3

static char err[1024];

/* Under ASan, let a failed allocation return NULL as libc's does (the
 * out-of-memory case below), instead of ASan's report and abort. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

struct fx {
  struct plan p;
  struct weights w;
  struct rt_model M;
  struct rt_kv_pool *pools;
};

static bool fx_open(struct fx *f) {
  memset(f, 0, sizeof(*f));
  f->pools = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*f->pools));
  if (!h_load_plan(PLAN, &f->p)) return false;
  f->p.serving.page_tokens = 2; /* many pages a source, and decode steps that add pages after the lists exist */
  int rc = weights_synth(&f->w, &f->p, 5, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err);
  if (!rc) rc = rt_model_init(&f->M, &f->p, &f->w, err, sizeof err);
  if (!rc) rc = rt_kv_pools_init(f->pools, &f->p, err, sizeof err);
  EXPECT(rc == 0, "fixture: %s", err);
  return rc == 0;
}

static void fx_close(struct fx *f) {
  rt_kv_pools_free(f->pools, f->p.n_layers);
  rt_model_free(&f->M);
  weights_free(&f->w);
  plan_free(&f->p);
  free(f->pools);
}

/* Prefill N_PROMPT seeded tokens, then STEPS decode steps on fixed tokens,
 * on one executor. */
static bool run_request(struct fx *f, struct rt_request *r, int id, bool starpu) {
  CEDAR_ASSERT(rt_request_init(r, id, &f->p, f->pools, N_PROMPT + STEPS + 1) == 0);
  uint64_t seed = 77;
  for (int i = 0; i < N_PROMPT; i++)
    rt_request_push_token(r, (int32_t)(op_rng_next(&seed) % (uint64_t)f->p.model.vocab));
  float *lg = cedar_xmalloc(sizeof(float) * (size_t)f->p.model.vocab);
  bool ok = true;
  for (int s = 0; s <= STEPS && ok; s++) {
    struct graph g;
    int rc = s == 0 ? graph_build_prefill(&g, &f->p, N_PROMPT, &(struct graph_opts){.replay = -1}, err, sizeof err)
                    : graph_build_decode(&g, &f->p, N_PROMPT + s - 1, err, sizeof err);
    EXPECT(rc == 0, "graph: %s", err);
    if (rc) break;
    struct rt_exec_out out = {.logits = lg, .pos = NULL};
    rc = starpu ? rt_exec_starpu(&g, &f->M, r, &out, NULL, NULL, NULL, NULL, err, sizeof err)
                : rt_exec_direct(&g, &f->M, r, &out, NULL, NULL, NULL, err, sizeof err);
    EXPECT(rc == 0, "%s step %d: %s", starpu ? "starpu" : "direct", s, err);
    ok = rc == 0;
    r->n_pos = s == 0 ? N_PROMPT : r->n_pos + 1;
    if (ok && s < STEPS) rt_request_push_token(r, (int32_t)((s * 37 + 5) % f->p.model.vocab));
    graph_free(&g);
  }
  free(lg);
  return ok;
}

/* Every committed entry through the page handles equals the twin's. */
static void check_pages(struct fx *f, struct rt_request *sp, struct rt_request *ref) {
  for (int l = 0; l < f->p.n_layers; l++) {
    struct rt_kv_seq *s = &sp->seq[l];
    if (!s->pool) continue;
    EXPECT_EQ(s->n_entries, ref->seq[l].n_entries, "layer %d entries", l);
    size_t pb = rt_kv_page_bytes(s->pool), eb = s->pool->entry_bytes;
    uint8_t *page = cedar_xmalloc(pb);
    for (int i = 0; i < s->n_pages; i++) {
      int64_t got = rt_starpu_page_read(sp, l, i, page, pb);
      EXPECT(got == (int64_t)pb, "layer %d page %d: read %" PRId64 " bytes through its list, want %zu", l, i, got, pb);
      if (got != (int64_t)pb) continue;
      for (int64_t e = (int64_t)i * s->pool->page_entries;
           e < s->n_entries && e < (int64_t)(i + 1) * s->pool->page_entries; e++)
        EXPECT(!memcmp(page + (size_t)(e % s->pool->page_entries) * eb, rt_kv_entry(&ref->seq[l], e), eb),
               "layer %d entry %" PRId64 ": bytes through the page handle differ from the direct run's", l, e);
    }
    free(page);
  }
}

static void check_rings(struct fx *f, struct rt_request *sp, struct rt_request *ref) {
  for (int l = 0; l < f->p.n_layers; l++) {
    const struct rt_ring *a = &sp->ring[l], *b = &ref->ring[l];
    size_t bytes = (size_t)a->window * a->entry_bytes;
    uint8_t *buf = cedar_xmalloc(bytes);
    int64_t got = rt_starpu_ring_read(sp, l, buf, bytes);
    EXPECT(got == (int64_t)bytes, "layer %d ring: read %" PRId64 " bytes, want %zu", l, got, bytes);
    for (int i = 0; got == (int64_t)bytes && i < a->window; i++) {
      EXPECT_EQ(a->pos[i], b->pos[i], "layer %d ring slot %d position", l, i);
      if (b->pos[i] >= 0)
        EXPECT(!memcmp(buf + (size_t)i * a->entry_bytes, b->slot + (size_t)i * b->entry_bytes, a->entry_bytes),
               "layer %d ring slot %d: bytes through the handle differ from the direct run's", l, i);
    }
    free(buf);
  }
}

static int64_t kv_sources(const struct rt_request *r) {
  int64_t n = 0;
  for (int l = 0; l < r->plan->n_layers; l++) n += r->seq[l].pool != NULL;
  return n;
}

static int64_t want_request_bufs(const struct rt_request *r) {
  int64_t n = 1 + (r->xe ? 2 : 0); /* tokens, encoder outputs and their positions */
  for (int l = 0; l < r->plan->n_layers; l++) n += 2 + (r->tail_buf[l] != NULL);
  return n;
}

/* A graph whose first activation cannot be had (1 PiB): the request fails
 * cleanly on both executors; a normal request runs after it. */
static void check_oom(struct fx *f) {
  for (int starpu = 0; starpu < 2; starpu++) {
    struct rt_request r;
    CEDAR_ASSERT(rt_request_init(&r, 9, &f->p, f->pools, N_PROMPT + 1) == 0);
    for (int i = 0; i < N_PROMPT; i++) rt_request_push_token(&r, i % f->p.model.vocab);
    struct graph g;
    CEDAR_ASSERT(graph_build_prefill(&g, &f->p, N_PROMPT, &(struct graph_opts){.replay = -1}, err, sizeof err) == 0);
    int big = -1;
    for (int d = 0; d < g.n_data && big < 0; d++)
      if (g.data[d].kind == GRAPH_ACT) big = d;
    g.data[big].bytes = (int64_t)1 << 50;
    err[0] = 0;
    int rc = starpu ? rt_exec_starpu(&g, &f->M, &r, NULL, NULL, NULL, NULL, NULL, err, sizeof err)
                    : rt_exec_direct(&g, &f->M, &r, NULL, NULL, NULL, NULL, err, sizeof err);
    EXPECT(rc == CEDAR_ENOMEM && strstr(err, "out of memory") && strstr(err, g.data[big].name),
           "%s: an activation of 1 PiB gave %d (%s)", starpu ? "starpu" : "direct", rc, err);
    graph_free(&g);
    rt_request_free(&r);
  }
}

int main(void) {
  struct fx f;
  if (!fx_open(&f)) {
    fx_close(&f);
    return h_report("exec_starpu_data");
  }
  struct rt_starpu_opts so = {.workers = 2, .sched = "eager"};
  if (rt_starpu_init(&so, err, sizeof err)) {
    fprintf(stderr, "skip: StarPU cannot start here: %s\n", err);
    fx_close(&f);
    return 77;
  }
  struct rt_request ref, r;
  bool ok = run_request(&f, &ref, 0, false) && run_request(&f, &r, 1, true);
  int64_t prefill_pages = 0, held = 0; /* pages past the prefill's: appended after the lists were registered */
  for (int l = 0; l < f.p.n_layers; l++)
    if (r.seq[l].pool) {
      held += r.seq[l].n_pages;
      prefill_pages += (N_PROMPT / r.seq[l].pool->ratio + r.seq[l].pool->page_entries - 1) / r.seq[l].pool->page_entries;
    }
  EXPECT(held > prefill_pages, "decode steps added no page (%" PRId64 " held, %" PRId64 " after prefill)", held,
         prefill_pages);
  int64_t pages, bufs;
  rt_starpu_handle_counts(&pages, &bufs);
  if (ok) {
    check_pages(&f, &r, &ref);
    check_rings(&f, &r, &ref);
    /* Only the StarPU request's page lists were ever bound; one per source. */
    EXPECT_EQ(pages, kv_sources(&r), "page-list handles after prefill and %d decode steps", STEPS);
    EXPECT(held > kv_sources(&r), "the fixture holds %" PRId64 " pages in %" PRId64 " sources: more pages than lists",
           held, kv_sources(&r));
    EXPECT_EQ(bufs, want_request_bufs(&r), "request buffer handles (registered once, not per graph)");
    for (int l = 0; l < f.p.n_layers; l++)
      if (ref.seq[l].pool && ref.seq[l].n_pages) {
        uint8_t b[16];
        EXPECT(rt_starpu_page_read(&ref, l, 0, b, sizeof b) == CEDAR_EINVAL,
               "layer %d: a request no StarPU graph ran has a page list", l);
        EXPECT(rt_starpu_page_read(&r, l, r.seq[l].n_pages, b, sizeof b) == CEDAR_EINVAL,
               "layer %d: page %d past the %d held read through the list", l, r.seq[l].n_pages, r.seq[l].n_pages);
        break;
      }
  }
  rt_request_free(&ref);
  rt_request_free(&r);
  check_oom(&f);
  rt_starpu_handle_counts(&pages, &bufs);
  EXPECT_EQ(bufs, 0, "request buffer handles after rt_request_free");
  EXPECT_EQ(pages, 0, "page-list handles after rt_request_free (they are the request's)");
  /* StarPU stopped under a live request: its handles go with StarPU. */
  struct rt_request live;
  if (run_request(&f, &live, 2, true)) {
    rt_starpu_shutdown();
    rt_starpu_handle_counts(&pages, &bufs);
    EXPECT(pages == 0 && bufs == 0, "%" PRId64 " page and %" PRId64 " request handles outlive StarPU", pages, bufs);
  } else {
    rt_starpu_shutdown();
  }
  rt_request_free(&live);
  fx_close(&f);
  return h_report("exec_starpu_data");
}

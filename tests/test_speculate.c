/* test_speculate.c: speculative decoding's verify, accept and rollback
 * (runtime/engine/speculate.h) on the small plans with synthetic weights.
 *
 * Synthetic weights make a real drafter's acceptance meaningless, so the
 * drafts come from the forced drafter: the greedy plain continuation where
 * a draft is to agree and another id where not. For every plan and every k
 * = 0..L (the first k drafts of every round agree, the next one does not)
 * and for random agreement:
 *  - the tokens equal plain greedy decoding's, bit for bit (SPEC 8.9.47b);
 *  - after EVERY commit the request's state equals a plain request decoded
 *    to the same position: global entries of every source (counts, bytes,
 *    pages held), every tail (rows, count, pos0), all rings (bytes and
 *    position tags: the tiny plans' window of 8 wraps every other round),
 *    the kept encoder outputs (CED), the token history (Engram reads it);
 *  - the per-position acceptance counts are what k forces (vLLM's
 *    metrics: mean acceptance length 1 + k exactly when k < L).
 * Prompt lengths 13 and 14 put the first verify step on an odd and an even
 * position, so SPEC 7.8's ratio-2 case (x1 accepted at an even position, x2
 * rejected: x1 must stay pending in the tail) occurs at every k.
 * Also: a commit of 0 positions restores everything (the profile's path),
 * and graph_build_verify refuses more rows than the window.
 *
 * Run: ctest --test-dir build -R '^speculate$'.
 */
#include "tests/model_fixture.h"

#include "runtime/engine/speculate.h"

#define NEW 23 /* tokens generated per request */
#define LMAX 5

struct lockstep {
  struct fx *f;
  struct rt_request plain;   /* decoded one position at a time */
  const int32_t *ref;        /* ref[0] = first generated token */
  int64_t n_prompt;
  int checks, bad;
  const char *what;
};

/* plain decodes until it holds the speculative request's positions, then
 * the two states must be equal. */
static void on_commit(void *user, const struct rt_request *r, int64_t pos, int c) {
  struct lockstep *ls = user;
  struct fx *f = ls->f;
  float *lg = malloc(sizeof(float) * (size_t)f->V);
  while (ls->plain.n_pos < r->n_pos) {
    int64_t k = ls->plain.n_pos - ls->n_prompt; /* the token consumed there: ref[k] */
    struct rt_exec_stats st = {0};
    if (!decode(f, &ls->plain, ls->ref[k], lg, &st)) break;
  }
  free(lg);
  ls->checks++;
  bool eq = requests_equal(f, r, &ls->plain, true);
  if (!eq) {
    struct state_cmp sc = state_compare(f->p, r, &ls->plain);
    EXPECT(eq, "%s: after the commit of %d at %lld the state differs from plain decoding: %lld of %lld entries, "
           "tails %g (shape %s), ring tags %d codes %d (far %d) scales %d; first at position %lld layer %d (%s)",
           ls->what, c, (long long)pos, (long long)sc.kv_bad, (long long)sc.kv_total, sc.tail_rel,
           sc.tail_shape_bad ? "differs" : "same", sc.ring.tags, sc.ring.codes, sc.ring.far_codes, sc.ring.scales,
           (long long)sc.origin.pos, sc.origin.layer, sc.origin.far ? "far" : "a rounding flip");
  }
  const struct plan *p = f->p;
  for (int l = 0; l < p->n_layers; l++) {
    if (!r->seq[l].pool) continue;
    EXPECT(r->seq[l].n_pages == ls->plain.seq[l].n_pages, "%s: L%d holds %d pages, plain %d", ls->what, l,
           r->seq[l].n_pages, ls->plain.seq[l].n_pages);
    eq &= r->seq[l].n_pages == ls->plain.seq[l].n_pages;
  }
  EXPECT(r->n_tokens == ls->plain.n_tokens &&
             !memcmp(r->tokens, ls->plain.tokens, sizeof(int32_t) * (size_t)r->n_tokens),
         "%s: token history differs at %lld", ls->what, (long long)pos);
  if (r->xe_cap > 0) {
    size_t row = rt_xe_row_floats(&p->model);
    bool xe_eq = !memcmp(r->xe_pos, ls->plain.xe_pos, sizeof(int64_t) * (size_t)r->xe_cap);
    for (int s = 0; xe_eq && s < r->xe_cap; s++)
      if (r->xe_pos[s] >= 0) xe_eq = !memcmp(r->xe + s * row, ls->plain.xe + s * row, sizeof(float) * row);
    EXPECT(xe_eq, "%s: kept encoder outputs differ after the commit at %lld", ls->what, (long long)pos);
    eq &= xe_eq;
  }
  if (!eq) ls->bad++;
}

/* The plain greedy continuation of prompt: ref (NEW). */
static bool plain_ref(struct fx *f, const int32_t *prompt, int64_t n, int32_t *ref) {
  struct rt_request r;
  struct rt_gen_opts o = {.max_new = NEW, .replay = -1, .top_p = 1};
  struct rt_gen_result res;
  int rc = rt_generate(&f->M, f->pools, &r, prompt, n, &o, &res, err, sizeof err);
  EXPECT(rc == 0, "%s: plain rt_generate: %s", f->path, err);
  if (!rc) memcpy(ref, res.tokens, sizeof(int32_t) * NEW);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  return rc == 0;
}

static void run_case(struct fx *f, const int32_t *prompt, int64_t n, const int32_t *ref, float rate, int k_agree) {
  char what[160];
  snprintf(what, sizeof what, "%s prompt %lld %s %g", f->path, (long long)n, rate >= 0 ? "rate" : "k",
           rate >= 0 ? (double)rate : (double)k_agree);
  struct lockstep ls = {.f = f, .ref = ref, .n_prompt = n, .what = what};
  /* the plain twin: the same prefill, then decoded in lockstep */
  float *lg = malloc(sizeof(float) * (size_t)f->V);
  struct rt_exec_stats st = {0};
  bool ok = prefill(f, &ls.plain, prompt, n, n + NEW + LMAX + 2, 0, -1, lg, &st);
  free(lg);
  if (!ok) return;
  struct rt_forced fd = {.ref = ref, .n_ref = NEW, .ref_pos0 = n, .rate = rate, .k_agree = k_agree, .rng = 99,
                         .V = f->V};
  struct rt_spec_opts so = {.drafter = rt_forced_drafter(&fd, LMAX), .lmax = LMAX, .on_commit = on_commit,
                            .user = &ls};
  struct rt_gen_opts o = {.max_new = NEW, .replay = -1, .top_p = 1};
  struct rt_request r;
  struct rt_gen_result res;
  struct rt_spec_stats ss;
  int rc = rt_generate_spec(&f->M, f->pools, &r, prompt, n, &o, &so, &res, &ss, err, sizeof err);
  EXPECT(rc == 0, "%s: rt_generate_spec: %s", what, err);
  if (!rc) {
    EXPECT(res.n_tokens == NEW && !memcmp(res.tokens, ref, sizeof(int32_t) * NEW),
           "%s: speculative greedy tokens differ from plain greedy", what);
    EXPECT(ls.checks == ss.rounds && ls.checks > 0 && ls.bad == 0, "%s: %d of %d commits left a state unlike plain",
           what, ls.bad, ls.checks);
    EXPECT(ss.num_accepted_tokens + ss.rounds == NEW - 1, "%s: %lld accepted + %lld rounds != %d tokens after the "
           "first", what, (long long)ss.num_accepted_tokens, (long long)ss.rounds, NEW - 1);
    if (rate < 0) /* every round with L > k drafts accepts exactly k */
      for (int i = 0; i < LMAX; i++)
        EXPECT(i >= k_agree || ss.accepted_per_pos[i] >= ss.num_drafts - 1,
               "%s: position %d accepted %lld of %lld drafts", what, i, (long long)ss.accepted_per_pos[i],
               (long long)ss.num_drafts);
    if (rate < 0 && k_agree == 0) EXPECT(ss.num_accepted_tokens == 0, "%s: accepted a wrong draft", what);
  }
  rt_gen_result_free(&res);
  rt_request_free(&r);
  rt_request_free(&ls.plain);
}

/* Commit 0 of a step restores the request to the bytes it had. */
static void check_full_rollback(struct fx *f, const int32_t *prompt, int64_t n) {
  float *lg = malloc(sizeof(float) * (size_t)f->V * (LMAX + 1));
  struct rt_request a, b;
  struct rt_exec_stats st = {0};
  bool ok = prefill(f, &a, prompt, n, n + 2 * LMAX + 4, 0, -1, lg, &st) &&
            prefill(f, &b, prompt, n, n + 2 * LMAX + 4, 0, -1, lg, &st);
  if (ok) {
    double t[LMAX + 1];
    a.pending = 3;
    int rc = rt_spec_profile(&f->M, &a, &(struct rt_gen_opts){.max_new = 1, .top_p = 1}, LMAX, 1, t, err, sizeof err);
    EXPECT(rc == 0, "%s: profile: %s", f->path, err);
    EXPECT(a.n_pos == n && a.n_tokens == n && requests_equal(f, &a, &b, true),
           "%s: a fully rolled-back step left state behind", f->path);
    for (int L = 0; L <= LMAX; L++) EXPECT(t[L] > 0, "%s: t_round[%d] = %g", f->path, L, t[L]);
    struct graph g;
    EXPECT(graph_build_verify(&g, f->p, n, f->p->model.window + 1, err, sizeof err) == CEDAR_EINVAL,
           "%s: a verify step longer than the window is accepted", f->path);
  }
  rt_request_free(&a);
  rt_request_free(&b);
  free(lg);
}

static void one_plan(const char *path) {
  struct fx f;
  if (!fx_open(&f, path)) {
    fx_close(&f);
    return;
  }
  for (int64_t n = 13; n <= 14; n++) {
    int32_t prompt[16], ref[NEW];
    make_prompt(prompt, n, f.V, PROMPT_SEED + (uint64_t)n);
    if (!plain_ref(&f, prompt, n, ref)) continue;
    for (int k = 0; k <= LMAX; k++) run_case(&f, prompt, n, ref, -1.0f, k);
    run_case(&f, prompt, n, ref, 0.5f, 0);
    check_full_rollback(&f, prompt, n);
  }
  fx_close(&f);
}

/* The rejection rule keeps the target's distribution: over N rounds of one
 * draft (one-hot q at x, or a spread q) the first committed token is
 * distributed as p, the distribution the plain sampler draws from: the
 * softmax of the row, and (second case) of the row after the repetition
 * penalty over the ids consumed so far (3 and 2 here: 2.0 -> 2.0 / 1.5,
 * -0.5 -> -0.5 * 1.5) cut to its top 3 (ids 3, 0, 1). Each frequency is
 * within 5 binomial standard deviations sqrt(p (1 - p) / N) of p (a false
 * failure has probability < 1e-5 per id), plus the fp32 rounding of p
 * itself (1e-6). */
static void check_rejection_rule(void) {
  enum { V = 6, N = 200000 };
  float logits[2 * V] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f}; /* row 1 (bonus) is never read by a rejection */
  for (int i = 0; i < V; i++) logits[V + i] = logits[i];
  float qrow[V] = {0.05f, 0.6f, 0.05f, 0.1f, 0.1f, 0.1f};
  for (int c = 0; c < 2; c++) {
    struct rt_gen_opts o = {.temperature = 1.0f, .top_p = 1.0f, .top_k = c ? 3 : 0, .rep_penalty = c ? 1.5f : 0};
    double l[V], p[V], z = 0;
    for (int i = 0; i < V; i++) l[i] = logits[i];
    if (c) {
      l[3] = (double)(2.0f / 1.5f), l[2] = (double)(-0.5f * 1.5f);
      l[2] = l[4] = l[5] = -INFINITY; /* outside the top 3 of (1, 0.2, -0.75, 1.33, 0, -3) */
    }
    for (int i = 0; i < V; i++) z += exp(l[i]);
    for (int i = 0; i < V; i++) p[i] = exp(l[i]) / z;
    float prob[V], resid[V], pen[V];
    int32_t order[V], out[2], seen[3] = {3, 2, 0}; /* before the round, y0; then the draft */
    for (int mode = 0; mode < 2; mode++) {
      const float *q = mode ? qrow : NULL;
      int32_t draft = 1; /* under q: an id q over-weights, so rejections happen */
      uint64_t rng = 12345;
      long cnt[V] = {0};
      for (int t = 0; t < N; t++) {
        if (mode) { /* draw the draft from q, as a sampling drafter would */
          double u = op_rng_uniform(&rng), acc = 0;
          draft = V - 1;
          for (int i = 0; i < V; i++)
            if ((acc += qrow[i]) > u) {
              draft = i;
              break;
            }
        }
        seen[2] = draft;
        int a = rt_spec_accept_sampled(logits, &draft, q, 1, V, &o, seen, 1, c ? pen : NULL, &rng, prob, order,
                                       resid, out, 0, err, sizeof err);
        CEDAR_ASSERT(a >= 0);
        cnt[out[0]]++;
      }
      for (int i = 0; i < V; i++) {
        double f = (double)cnt[i] / N, sd = sqrt(p[i] * (1 - p[i]) / N);
        EXPECT(fabs(f - p[i]) <= 5 * sd + 1e-6,
               "rejection rule (%s, %s): id %d drawn %.5f of the time, p = %.5f (5 sd = %.5f)",
               c ? "penalty 1.5, top-k 3" : "plain", mode ? "spread q" : "one-hot q", i, f, p[i], 5 * sd);
      }
    }
  }
}

int main(void) {
  check_rejection_rule();
  one_plan(PLAN_TINY);
  one_plan(PLAN_DENSE);
  one_plan(PLAN_T40);
  one_plan(PLAN_TWO);
  return h_report("speculate");
}

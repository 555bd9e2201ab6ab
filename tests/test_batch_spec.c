/* test_batch_spec.c: speculative decoding inside continuous batching
 * (runtime/engine/batch.h: rt_batch_speculate; runtime/engine/speculate.h:
 * rt_spec_req; the verify row through runtime/gen/step.h beside the batch's
 * decode rows).
 *
 *  - seven requests batched, five of them speculative with the forced
 *    drafter (every draft agrees; half agree at random; the first of each
 *    round agrees and the next does not; none agrees; every draft agrees
 *    under a repetition penalty) beside two plain ones: every request's
 *    tokens are bitwise its plain greedy tokens alone (rt_generate, same
 *    options), the request whose drafts all agree commits several tokens in
 *    one step, and every page returns at the end;
 *  - the refusals, each with its message: a sampled request, a prefix
 *    cache, more drafts than the bound, a request already admitted.
 * Plan: tests/oracle/plans/tiny-40.yaml (the V4.1 schedule at toy widths).
 * Run: ctest --test-dir build -R '^batch_spec$' --output-on-failure
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/batch.h"
#include "tests/model_fixture.h"

enum { N = 7, MAX_NEW = 14, LMAX = 4 };

/* Plain greedy alone: the reference tokens (and the forced drafter's). */
static bool solo(struct fx *f, const int32_t *prompt, int64_t n, float rep_penalty, int32_t *tok) {
  struct rt_gen_opts go = {.chunk = 16, .replay = -1, .max_new = MAX_NEW, .top_p = 1, .rep_penalty = rep_penalty};
  struct rt_request r;
  struct rt_gen_result res;
  int rc = rt_generate(&f->M, f->pools, &r, prompt, n, &go, &res, err, sizeof err);
  EXPECT(rc == 0 && res.n_tokens == MAX_NEW, "solo run: %s", err);
  if (!rc) memcpy(tok, res.tokens, sizeof(int32_t) * MAX_NEW);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  return rc == 0;
}

static int64_t pages_in_use(const struct fx *f) {
  int64_t n = 0;
  for (int l = 0; l < f->p->n_layers; l++) n += f->pools[l].pages_in_use;
  return n;
}

static void batched(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  int32_t *prompt[N], ref[N][MAX_NEW];
  int64_t len[N];
  /* forced drafters: rate (>= 0: Bernoulli) or the pattern k_agree (rate < 0); plain when spec is false */
  const struct { bool spec; float rate; int k_agree; float pen; } kind[N] = {
      {true, 1, 0, 0}, {true, 0.5f, 0, 0}, {true, -1, 1, 0}, {false, 0, 0, 0},
      {true, 0, 0, 0}, {false, 0, 0, 1.3f}, {true, 1, 0, 1.3f}};
  bool ok = true;
  for (int i = 0; i < N; i++) {
    len[i] = 5 + (i * 23) % 61;
    prompt[i] = malloc(sizeof(int32_t) * (size_t)len[i]);
    make_prompt(prompt[i], len[i], f.V, PROMPT_SEED + 7 * (uint64_t)i);
    ok &= solo(&f, prompt[i], len[i], kind[i].pen, ref[i]);
  }
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = N, .step_tokens = 16 + N * (LMAX + 1), .chunk = 16};
  int rc = ok ? rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err) : -1;
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (rc) goto out;
  struct rt_forced fd[N];
  int h[N];
  for (int i = 0; i < N; i++) {
    h[i] = rt_batch_submit(&b, prompt[i], len[i], MAX_NEW, 1, i, err, sizeof err);
    rt_batch_sample(&b, h[i], 0, 1, 0, kind[i].pen);
    if (!kind[i].spec) continue;
    fd[i] = (struct rt_forced){ref[i], MAX_NEW, len[i], kind[i].rate, kind[i].k_agree, 99 + (uint64_t)i, f.V};
    rc = rt_batch_speculate(&b, h[i], rt_forced_drafter(&fd[i], LMAX), LMAX, err, sizeof err);
    EXPECT(rc == 0, "rt_batch_speculate %d: %s", i, err);
  }
  struct rt_batch_step st;
  int64_t steps = 0;
  int most = 0; /* the most tokens request 0 (every draft agrees) committed in one step */
  while (rt_batch_pending(&b)) {
    int before = b.q[h[0]]->n_tokens;
    rt_batch_run_step(&b, &st);
    EXPECT(st.tokens <= o.step_tokens, "a step ran %lld tokens, over the budget %d", (long long)st.tokens,
           o.step_tokens);
    if (b.q[h[0]]->n_tokens - before > most) most = b.q[h[0]]->n_tokens - before;
    CEDAR_ASSERT(++steps < 10000);
  }
  int same = 0;
  for (int i = 0; i < N; i++) {
    const struct rt_bq *q = b.q[h[i]];
    bool eq = q->state == RT_BQ_DONE && q->n_tokens == MAX_NEW && !memcmp(q->tokens, ref[i], sizeof ref[i]);
    if (!eq) fprintf(stderr, "request %d (%s): state %d (%s), %d tokens\n", i, kind[i].spec ? "speculative" : "plain",
                     q->state, q->err, q->n_tokens);
    same += eq;
  }
  EXPECT_EQ(same, N, "requests bitwise their plain greedy tokens alone");
  EXPECT(most >= 2, "the request whose drafts all agree committed at most %d token(s) a step", most);
  printf("tiny-40: %d requests (5 speculative) in %lld steps, up to %d tokens a step for the one whose drafts agree: "
         "%d of %d bitwise plain greedy\n", N, (long long)steps, most, same, N);
  rt_batch_free(&b);
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the batch");
out:
  for (int i = 0; i < N; i++) free(prompt[i]);
  fx_close(&f);
}

static void refusals(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  int32_t prompt[8];
  make_prompt(prompt, 8, f.V, PROMPT_SEED);
  int32_t ref[4] = {0};
  struct rt_forced fd = {ref, 4, 8, 1, 0, 1, f.V};
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = 2, .step_tokens = 64, .chunk = 16};
  int rc = rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err);
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (!rc) {
    int h = rt_batch_submit(&b, prompt, 8, 4, 1, 0, err, sizeof err);
    rt_batch_sample(&b, h, 0.8f, 1, 0, 0);
    rc = rt_batch_speculate(&b, h, rt_forced_drafter(&fd, LMAX), LMAX, err, sizeof err);
    EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, "accepts greedily"), "a sampled request: rc %d: %s", rc, err);
    rt_batch_sample(&b, h, 0, 1, 0, 0);
    rc = rt_batch_speculate(&b, h, rt_forced_drafter(&fd, LMAX), RT_SPEC_LMAX + 1, err, sizeof err);
    EXPECT(rc == CEDAR_EINVAL && strstr(err, "drafts a round"), "too many drafts: rc %d: %s", rc, err);
    struct rt_batch_step st;
    rt_batch_run_step(&b, &st); /* admitted: too late */
    rc = rt_batch_speculate(&b, h, rt_forced_drafter(&fd, LMAX), LMAX, err, sizeof err);
    EXPECT(rc == CEDAR_EINVAL && strstr(err, "before its first step"), "an admitted request: rc %d: %s", rc, err);
    rt_batch_free(&b);
  }
  struct pc_cache *cache = cedar_xcalloc(1, sizeof *cache);
  rc = pc_init(cache, f.p, f.pools, f.w.list.fingerprint, 0, (int64_t)1 << 30, err, sizeof err);
  EXPECT(rc == 0, "pc_init: %s", err);
  if (rc == 0) {
    o.cache = cache;
    if (rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err) == 0) {
      int h = rt_batch_submit(&b, prompt, 8, 4, 1, 0, err, sizeof err);
      rc = rt_batch_speculate(&b, h, rt_forced_drafter(&fd, LMAX), LMAX, err, sizeof err);
      EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, "prefix cache"), "a prefix cache: rc %d: %s", rc, err);
      rt_batch_free(&b);
    }
    pc_free(cache);
  }
  free(cache);
  fx_close(&f);
}

int main(void) {
  batched();
  refusals();
  return h_report("batch_spec");
}

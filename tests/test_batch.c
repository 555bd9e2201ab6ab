/* test_batch.c: continuous batching (runtime/engine/batch.h, scheduler/batch_policy.h).
 *
 *  - admission under the token budget: bp_plan_step's rule case by case
 *    (decode rows first, prefill segments oldest first and never split,
 *    admission in arrival order up to max_requests, stopping at the first
 *    that does not fit), and on a live loop every step runs at most
 *    step_tokens tokens with at most max_requests requests running;
 *  - state isolation (SPEC 7.9): 16 requests of different lengths (1 to
 *    131 prompt tokens, 8 to 19 new), batched, give bitwise the tokens and
 *    every token's logits each gets alone (rt_generate, same chunk), greedy
 *    and sampled (temperature 0.8, top-p 0.9, each its own seed), with
 *    requests arriving while others decode;
 *  - the abort storm: 300 requests aborted at random points (waiting, in
 *    their prefill, decoding) leave 0 pages in use, and the survivors'
 *    outputs equal their solo runs bitwise;
 *  - the prefix cache under batching: a request batched beside others hits
 *    the blocks an earlier one inserted and gives bitwise what the same
 *    request gives alone after the same earlier request;
 *  - a plan placed on CUDA is refused with the reason (the batched decode
 *    calls the CPU op groups);
 *  - a sampler per request (rt_batch_sample, what cedar serve sets from each
 *    request): six requests with different temperature, top-p, top-k and
 *    repetition penalty, batched, each bitwise its rt_generate run with the
 *    same options; rt_batch_stop ends one early as finished (its pages
 *    return) and rt_batch_forget drops what a finished one kept.
 * Plans: tests/oracle/plans/tiny-40.yaml (the V4.1 schedule at toy widths,
 * CED), tiny-dense-40.yaml (dense prefill) and plans/v41-mini.yaml (the
 * V4.1 structure at CPU widths, where the ops take their wider paths).
 * Run: ctest --test-dir build -R '^batch$' --output-on-failure
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine/batch.h"
#include "scheduler/batch_policy.h"
#include "tests/model_fixture.h"

/* ---- the policy ----------------------------------------------------------- */

static void policy_cases(void) {
  struct bp_limits lim = {4, 20};
  int out[8], adm;
  /* three decoding, one prefilling 16: 3 + 16 = 19 fit; a waiting one of 8 does not */
  struct bp_req a[] = {{BP_DECODE, 0}, {BP_PREFILL, 16}, {BP_DECODE, 0}, {BP_DECODE, 0}, {BP_WAITING, 8}};
  int t = bp_plan_step(a, 5, &lim, out, &adm);
  EXPECT_EQ(t, 19, "tokens of step a");
  EXPECT(out[0] == 1 && out[1] == 16 && out[2] == 1 && out[3] == 1 && out[4] == 0 && adm == 0, "step a's picks");
  /* a prefill segment that does not fit is skipped, a later smaller one runs; admission stops at max_requests */
  struct bp_req c[] = {{BP_PREFILL, 20}, {BP_PREFILL, 5}, {BP_DECODE, 0}, {BP_WAITING, 1}, {BP_WAITING, 1}};
  t = bp_plan_step(c, 5, &lim, out, &adm);
  EXPECT(out[0] == 0 && out[1] == 5 && out[2] == 1 && out[3] == 1 && out[4] == 0 && adm == 1 && t == 7,
         "step c: %d %d %d %d %d admitted %d tokens %d", out[0], out[1], out[2], out[3], out[4], adm, t);
  /* first come, first served: a waiting request that does not fit blocks those behind it */
  struct bp_req d[] = {{BP_WAITING, 20}, {BP_WAITING, 2}};
  struct bp_limits l2 = {4, 20};
  t = bp_plan_step(d, 2, &l2, out, &adm);
  EXPECT(out[0] == 20 && out[1] == 0 && adm == 1 && t == 20, "step d: the first fills the budget");
  struct bp_req e[] = {{BP_DECODE, 0}, {BP_WAITING, 20}, {BP_WAITING, 2}};
  t = bp_plan_step(e, 3, &l2, out, &adm);
  EXPECT(out[0] == 1 && out[1] == 0 && out[2] == 0 && adm == 0 && t == 1, "step e: FCFS holds the small one back");
}

/* ---- helpers ---------------------------------------------------------------- */

struct solo {
  int32_t *tok;
  float *logits; /* (n_tokens, V) */
  int n_tokens;
};

/* Request (prompt, max_new, seed) alone: rt_generate on its own request. */
static void run_solo(struct fx *f, const int32_t *prompt, int64_t n, int max_new, uint64_t seed, float temp,
                     int chunk, struct pc_cache *cache, struct solo *s) {
  struct rt_gen_opts go = {.chunk = chunk, .replay = -1, .max_new = max_new, .temperature = temp,
                           .top_p = temp > 0 ? 0.9f : 1, .seed = seed, .cache = cache,
                           .save_snapshot = cache != NULL};
  struct rt_request r;
  struct rt_gen_result res;
  int rc = rt_generate(&f->M, f->pools, &r, prompt, n, &go, &res, err, sizeof err);
  EXPECT(rc == 0, "solo run: %s", err);
  s->n_tokens = res.n_tokens;
  s->tok = malloc(sizeof(int32_t) * (size_t)max_new);
  s->logits = malloc(sizeof(float) * (size_t)max_new * f->V);
  memcpy(s->tok, res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
  if (res.n_tokens > 0)
    memcpy(s->logits, res.prefill_logits + (size_t)(res.prefill_rows - 1) * f->V, sizeof(float) * (size_t)f->V);
  if (res.n_tokens > 1)
    memcpy(s->logits + f->V, res.decode_logits, sizeof(float) * (size_t)(res.n_tokens - 1) * f->V);
  rt_gen_result_free(&res);
  rt_request_free(&r);
}

static void solo_free(struct solo *s) {
  free(s->tok);
  free(s->logits);
}

static int64_t pages_in_use(const struct fx *f) {
  int64_t n = 0;
  for (int l = 0; l < f->p->n_layers; l++) n += f->pools[l].pages_in_use;
  return n;
}

/* Batched request h against its solo run, bitwise. */
static bool same_as_solo(const struct fx *f, const struct rt_batch *b, int h, const struct solo *s, const char *what) {
  const struct rt_bq *q = b->q[h];
  bool ok = q->state == RT_BQ_DONE && q->n_tokens == s->n_tokens &&
            !memcmp(q->tokens, s->tok, sizeof(int32_t) * (size_t)s->n_tokens) &&
            !memcmp(q->logits, s->logits, sizeof(float) * (size_t)s->n_tokens * f->V);
  if (!ok) {
    int first = -1;
    for (int i = 0; i < s->n_tokens && i < q->n_tokens && first < 0; i++)
      if (memcmp(q->logits + (size_t)i * f->V, s->logits + (size_t)i * f->V, sizeof(float) * (size_t)f->V)) first = i;
    fprintf(stderr, "%s: request %d (prompt %lld): state %d (%s), %d tokens vs %d alone; first token whose logits "
            "differ: %d\n", what, h, (long long)q->n, q->state, q->err, q->n_tokens, s->n_tokens, first);
  }
  return ok;
}

/* ---- 16 requests batched = alone ------------------------------------------- */

static void sixteen(const char *plan, float temp) {
  struct fx f;
  if (!fx_open(&f, plan)) return;
  enum { N = 16 };
  const int chunk = 16;
  int32_t *prompt[N];
  int64_t len[N];
  int max_new[N];
  struct solo s[N];
  for (int i = 0; i < N; i++) {
    len[i] = 1 + (i * 37) % 131;
    max_new[i] = 8 + (i * 5) % 12;
    prompt[i] = malloc(sizeof(int32_t) * (size_t)len[i]);
    make_prompt(prompt[i], len[i], f.V, PROMPT_SEED + (uint64_t)i);
    run_solo(&f, prompt[i], len[i], max_new[i], 100 + (uint64_t)i, temp, chunk, NULL, &s[i]);
  }
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the solo runs");
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = N, .step_tokens = 16 * chunk + N, .chunk = chunk, .temperature = temp,
                            .top_p = temp > 0 ? 0.9f : 1, .keep_logits = true};
  int rc = rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err);
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (rc) return;
  /* 12 now, the rest while the first decode: prefill segments share steps with decode rows */
  int h[N], max_rows = 0;
  for (int i = 0; i < 12; i++) h[i] = rt_batch_submit(&b, prompt[i], len[i], max_new[i], 100 + (uint64_t)i, i, err, sizeof err);
  int64_t steps = 0;
  struct rt_batch_step st;
  while (rt_batch_pending(&b) || steps < 3) {
    if (steps == 3)
      for (int i = 12; i < N; i++)
        h[i] = rt_batch_submit(&b, prompt[i], len[i], max_new[i], 100 + (uint64_t)i, i, err, sizeof err);
    rt_batch_run_step(&b, &st);
    EXPECT(st.tokens <= o.step_tokens, "a step ran %lld tokens, over the budget %d", (long long)st.tokens, o.step_tokens);
    if (st.decode_rows > max_rows) max_rows = st.decode_rows;
    int running = 0;
    for (int i = 0; i < b.n_live; i++) running += b.q[b.live[i]]->state != RT_BQ_WAITING;
    EXPECT(running <= o.max_requests, "%d running", running);
    steps++;
    CEDAR_ASSERT(steps < 10000);
  }
  EXPECT(max_rows >= 12, "the decode steps never batched 12 rows or more (at most %d)", max_rows);
  int same = 0;
  for (int i = 0; i < N; i++) same += same_as_solo(&f, &b, h[i], &s[i], plan);
  EXPECT_EQ(same, N, "%s, temperature %.1f: requests bitwise equal to their solo runs", plan, temp);
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the batch");
  printf("%s, temperature %.1f: 16 requests in %lld steps, up to %d decode rows a step: %d of 16 bitwise alone\n",
         plan, temp, (long long)steps, max_rows, same);
  rt_batch_free(&b);
  for (int i = 0; i < N; i++) solo_free(&s[i]), free(prompt[i]);
  fx_close(&f);
}

/* ---- the abort storm ------------------------------------------------------ */

static void abort_storm(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  /* the smaller form (CEDAR_TEST_SMALL=1, the ASan build: tests/CMakeLists.txt) storms a third as long */
  enum { N_MAX = 420 };
  const char *sm = getenv("CEDAR_TEST_SMALL");
  const bool small = sm && !strcmp(sm, "1");
  const int N = small ? 140 : N_MAX, SPARED = small ? 20 : 40, ABORTS = small ? 90 : 300;
  const int chunk = 8;
  uint64_t rng = 0xab0127;
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = 16, .step_tokens = 3 * chunk + 16, .chunk = chunk, .keep_logits = true};
  int rc = rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err);
  EXPECT(rc == 0, "rt_batch_init: %s", err);
  if (rc) return;
  int32_t *prompt[N_MAX];
  int64_t len[N_MAX];
  int max_new[N_MAX], h[N_MAX];
  int submitted = 0, aborted = 0, by_state[3] = {0};
  struct rt_batch_step st;
  /* one arrival a step; most steps abort one live request at random (never
   * one of the last SPARED), waiting, in its prefill or decoding */
  while (submitted < N || rt_batch_pending(&b)) {
    if (submitted < N) {
      int i = submitted++;
      len[i] = 1 + (int64_t)(op_rng_next(&rng) % 40);
      max_new[i] = 1 + (int)(op_rng_next(&rng) % 8);
      prompt[i] = malloc(sizeof(int32_t) * (size_t)len[i]);
      make_prompt(prompt[i], len[i], f.V, PROMPT_SEED + 1000 + (uint64_t)i);
      h[i] = rt_batch_submit(&b, prompt[i], len[i], max_new[i], (uint64_t)i, i, err, sizeof err);
    }
    if (aborted < ABORTS && b.n_live && op_rng_next(&rng) % 5 != 0) {
      int hh = b.live[op_rng_next(&rng) % (uint64_t)b.n_live];
      if (hh < N - SPARED) {
        by_state[b.q[hh]->state]++;
        rt_batch_abort(&b, hh);
        aborted++;
      }
    }
    rt_batch_run_step(&b, &st);
  }
  /* finish the aborts the random draw left: survivors beyond 40 are aborted after they finished (no-ops) */
  EXPECT(aborted == ABORTS, "only %d aborts happened", aborted);
  EXPECT(by_state[RT_BQ_WAITING] > 0 && by_state[RT_BQ_PREFILL] > 0 && by_state[RT_BQ_DECODE] > 0,
         "aborts hit every state: waiting %d, prefill %d, decoding %d", by_state[0], by_state[1], by_state[2]);
  EXPECT_EQ(pages_in_use(&f), 0, "pages in use after the storm");
  int survivors = 0, same = 0;
  for (int i = 0; i < N; i++) {
    if (b.q[h[i]]->state != RT_BQ_DONE) continue;
    struct solo s;
    run_solo(&f, prompt[i], len[i], max_new[i], (uint64_t)i, 0, chunk, NULL, &s);
    survivors++;
    same += same_as_solo(&f, &b, h[i], &s, "abort storm");
    solo_free(&s);
  }
  EXPECT(survivors >= SPARED, "%d survivors", survivors);
  EXPECT_EQ(same, survivors, "survivors bitwise equal to their solo runs");
  printf("abort storm: %d requests, %d aborted (waiting %d, prefill %d, decoding %d), %d survivors bitwise alone, "
         "%lld pages in use\n", N, aborted, by_state[0], by_state[1], by_state[2], same, (long long)pages_in_use(&f));
  rt_batch_free(&b);
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the batch is freed");
  for (int i = 0; i < N; i++) free(prompt[i]);
  fx_close(&f);
}

/* ---- the prefix cache under batching ---------------------------------------- */

static void cached(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  const int chunk = 16;
  int B = f.p->serving.prefix_block_tokens;
  int64_t n0 = 2 * B + 5, n1 = 2 * B + 30;
  int32_t *p0 = malloc(sizeof(int32_t) * (size_t)n1), *p1 = malloc(sizeof(int32_t) * (size_t)n1);
  int32_t other[21];
  make_prompt(p0, n1, f.V, 77);
  memcpy(p1, p0, sizeof(int32_t) * (size_t)n1); /* p1 continues p0's first n0 tokens */
  make_prompt(other, 21, f.V, 78);
  /* alone: p0 then p1, one cache */
  struct pc_cache cc1, cc2, *c1 = &cc1, *c2 = &cc2;
  int rc = pc_init(c1, f.p, f.pools, f.w.list.fingerprint, 0, (int64_t)1 << 30, err, sizeof err);
  if (!rc) rc = pc_init(c2, f.p, f.pools, f.w.list.fingerprint, 0, (int64_t)1 << 30, err, sizeof err);
  EXPECT(rc == 0, "pc_init: %s", err);
  if (rc) return;
  struct solo s0, s1;
  run_solo(&f, p0, n0, 3, 1, 0, chunk, c1, &s0);
  run_solo(&f, p1, n1, 4, 2, 0, chunk, c1, &s1);
  /* batched: p0 alone, then p1 beside an unrelated request, one cache */
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = 4, .step_tokens = chunk + 4, .chunk = chunk, .cache = c2,
                            .save_snapshot = true, .keep_logits = true};
  EXPECT(rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err) == 0, "rt_batch_init: %s", err);
  int h0 = rt_batch_submit(&b, p0, n0, 3, 1, 0, err, sizeof err);
  struct rt_batch_step st;
  while (rt_batch_pending(&b)) rt_batch_run_step(&b, &st);
  int h2 = rt_batch_submit(&b, other, 21, 6, 3, 2, err, sizeof err);
  rt_batch_run_step(&b, &st);
  int h1 = rt_batch_submit(&b, p1, n1, 4, 2, 1, err, sizeof err);
  while (rt_batch_pending(&b)) rt_batch_run_step(&b, &st);
  EXPECT(b.q[h1]->hrep.global_hit >= B, "the batched request hit %lld cached tokens", (long long)b.q[h1]->hrep.global_hit);
  EXPECT(same_as_solo(&f, &b, h0, &s0, "cache, first") && same_as_solo(&f, &b, h1, &s1, "cache, hit"),
         "batched with a cache = alone with a cache");
  EXPECT(b.q[h2]->state == RT_BQ_DONE, "the unrelated request finished");
  printf("prefix cache under batching: hit %lld tokens (snapshot %s), bitwise the solo run with the same cache\n",
         (long long)b.q[h1]->hrep.hit, b.q[h1]->hrep.swa_hit ? "yes" : "no");
  rt_batch_free(&b);
  solo_free(&s0), solo_free(&s1);
  pc_free(c1);
  pc_free(c2);
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the caches are freed");
  free(p0), free(p1);
  fx_close(&f);
}

/* A plan placed on CUDA: refused, nothing run on the CPU in its place. */
static void cuda_refused(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  f.p->serving.prefill_device = f.p->serving.decode_device = PLAN_DEV_CUDA;
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = 2, .step_tokens = 12, .chunk = 8};
  EXPECT(rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err) == CEDAR_EUNSUPPORTED &&
             strstr(err, "continuous batching runs the op groups on the CPU"),
         "a CUDA plan in the batcher: %s", err);
  f.p->serving.prefill_device = f.p->serving.decode_device = PLAN_DEV_CPU;
  fx_close(&f);
}

/* ---- a sampler per request, stop and forget ------------------------------------ */

static void per_request(void) {
  struct fx f;
  if (!fx_open(&f, PLAN_T40)) return;
  enum { N = 6 };
  static const struct { float t, p; int k; float pen; } sm[N] = {
      {0, 1, 0, 1}, {0.8f, 1, 5, 1}, {1.0f, 0.9f, 40, 1.3f}, {0, 1, 0, 2.0f}, {0.7f, 0.95f, 0, 0.8f}, {1.2f, 1, 3, 1}};
  const int chunk = 16, max_new = 12;
  int32_t *prompt[N];
  int64_t len[N];
  float *solo_lg[N];
  int32_t solo_tok[N][12];
  int solo_n[N];
  for (int i = 0; i < N; i++) {
    len[i] = 3 + 17 * i;
    prompt[i] = malloc(sizeof(int32_t) * (size_t)len[i]);
    make_prompt(prompt[i], len[i], f.V, PROMPT_SEED + 50 + (uint64_t)i);
    struct rt_gen_opts go = {.chunk = chunk, .replay = -1, .max_new = max_new, .temperature = sm[i].t,
                             .top_p = sm[i].p, .top_k = sm[i].k, .rep_penalty = sm[i].pen, .seed = 7 + (uint64_t)i};
    struct rt_request r;
    struct rt_gen_result res;
    EXPECT(rt_generate(&f.M, f.pools, &r, prompt[i], len[i], &go, &res, err, sizeof err) == 0, "solo: %s", err);
    solo_n[i] = res.n_tokens;
    memcpy(solo_tok[i], res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
    solo_lg[i] = malloc(sizeof(float) * (size_t)(max_new - 1) * f.V);
    memcpy(solo_lg[i], res.decode_logits, sizeof(float) * (size_t)(res.n_tokens - 1) * f.V);
    rt_gen_result_free(&res);
    rt_request_free(&r);
  }
  struct rt_batch b;
  struct rt_batch_opts o = {.max_requests = N + 1, .step_tokens = 4 * chunk + N + 1, .chunk = chunk, .keep_logits = true};
  EXPECT(rt_batch_init(&b, &f.M, f.pools, &o, err, sizeof err) == 0, "rt_batch_init: %s", err);
  int h[N];
  for (int i = 0; i < N; i++) {
    h[i] = rt_batch_submit(&b, prompt[i], len[i], max_new, 7 + (uint64_t)i, i, err, sizeof err);
    rt_batch_sample(&b, h[i], sm[i].t, sm[i].p, sm[i].k, sm[i].pen);
  }
  /* one more, stopped after its third token */
  int hs = rt_batch_submit(&b, prompt[0], len[0], max_new, 1, N, err, sizeof err);
  struct rt_batch_step st;
  for (int guard = 0; rt_batch_pending(&b) && guard < 1000; guard++) {
    rt_batch_run_step(&b, &st);
    if (b.q[hs] && b.q[hs]->n_tokens == 3) rt_batch_stop(&b, hs);
  }
  for (int i = 0; i < N; i++) {
    const struct rt_bq *q = b.q[h[i]];
    bool ok = q->state == RT_BQ_DONE && q->n_tokens == solo_n[i] &&
              !memcmp(q->tokens, solo_tok[i], sizeof(int32_t) * (size_t)solo_n[i]) &&
              !memcmp(q->logits + f.V, solo_lg[i], sizeof(float) * (size_t)(solo_n[i] - 1) * f.V);
    EXPECT(ok, "request %d (T %g, top-p %g, top-k %d, penalty %g) batched = alone", i, sm[i].t, sm[i].p, sm[i].k,
           sm[i].pen);
  }
  EXPECT(b.q[hs]->state == RT_BQ_DONE && b.q[hs]->n_tokens == 3, "rt_batch_stop: done after 3 tokens (state %d, %d)",
         b.q[hs]->state, b.q[hs]->n_tokens);
  EXPECT_EQ(pages_in_use(&f), 0, "pages after the batch (stopped request included)");
  rt_batch_forget(&b, hs);
  EXPECT(b.q[hs] == NULL, "rt_batch_forget drops the finished request");
  rt_batch_abort(&b, hs); /* a forgotten handle is a no-op */
  rt_batch_stop(&b, hs);
  printf("a sampler per request: %d requests (greedy, top-k, top-p, penalties) bitwise alone; one stopped after 3 "
         "tokens, forgotten; %lld pages in use\n", N, (long long)pages_in_use(&f));
  rt_batch_free(&b);
  for (int i = 0; i < N; i++) free(prompt[i]), free(solo_lg[i]);
  fx_close(&f);
}

int main(void) {
  policy_cases();
  per_request();
  cuda_refused();
  sixteen(PLAN_T40, 0);
  sixteen(PLAN_T40, 0.8f);
  sixteen("tests/oracle/plans/tiny-dense-40.yaml", 0);
  sixteen("plans/v41-mini.yaml", 0); /* the V4.1 structure at CPU widths: the ops' wider code paths */
  abort_storm();
  cached();
  return h_report("batch");
}

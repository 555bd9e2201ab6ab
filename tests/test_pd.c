/* test_pd.c: prefill and decode on different homes, both roles in one
 * process (runtime/dist/pd.h; the same graph and messages mpirun runs, the
 * transfers applied as local copies), with the decoder replay on P (P
 * ships the decoder rings and y1) and on D (P ships the kept encoder
 * outputs; D replays and samples y1), SPEC 7.6.
 *
 *  - equivalence: for several prompt lengths (odd and even, shorter and
 *    longer than the window and the replay) and chunk sizes, on the direct
 *    and the StarPU executor, the P/D run's tokens, prefill logits and
 *    decode logits, and every byte of D's request state (each source's
 *    entries, tails with their rows and boundaries, every ring's slots,
 *    positions and replay start, the token history, the kept encoder
 *    outputs; the bytes of empty slots are not state), equal the single-process run of the same plan bitwise;
 *  - bytes by state class equal what the plan says the package holds
 *    (rt_pd_expected_bytes, from plan_cost);
 *  - the ready barrier (SPEC 7.3, 8.9.45): a missing tail, an SWA boundary
 *    mismatch, a page still in flight, a state version mismatch and an
 *    ambiguous y1 each make D refuse, naming the condition; a corrupt
 *    message fails its checksum; each time the request's pages return;
 *  - a request with a prefix cache is refused with the reason, and
 *    CEDAR_PD_TEST_FAULT's values parse (a bad one is refused by name);
 *  - non-finite logits on the decode home fail the request with the
 *    sampler's message, no -1 in the token stream, pages returned.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "runtime/exec/exec.h"
#include "runtime/gen/generate.h"
#include "runtime/dist/pd.h"
#include "tests/model_fixture.h"

#define PD_PLAN "tests/plans/pd-tiny-40.yaml" /* tiny-40 with P on rank 0, D on rank 1 */
#define PD_PLAN_D "tests/plans/pd-tiny-40-replay-d.yaml" /* the same, the decoder replay on D */

static bool same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* Every byte of request state, a (P/D's D) against b (one process). */
static void expect_same_state(const struct plan *p, const struct rt_request *a, const struct rt_request *b,
                              const char *what) {
  EXPECT(a->n_pos == b->n_pos && a->n_tokens == b->n_tokens, "%s: positions %lld/%lld, ids %lld/%lld", what,
         (long long)a->n_pos, (long long)b->n_pos, (long long)a->n_tokens, (long long)b->n_tokens);
  EXPECT(same_bytes(a->tokens, b->tokens, 4 * (size_t)b->n_tokens), "%s: token history differs", what);
  for (int l = 0; l < p->n_layers; l++) {
    const struct rt_kv_seq *x = &a->seq[l], *y = &b->seq[l];
    if (y->pool) {
      EXPECT(x->n_entries == y->n_entries, "%s: L%d has %lld entries, one process %lld", what, l,
             (long long)x->n_entries, (long long)y->n_entries);
      for (int64_t e = 0; e < x->n_entries && e < y->n_entries; e++)
        if (!same_bytes(rt_kv_entry(x, e), rt_kv_entry(y, e), y->pool->entry_bytes)) {
          EXPECT(false, "%s: L%d entry %lld differs", what, l, (long long)e);
          break;
        }
      if (y->pool->ratio > 1) {
        EXPECT(a->tail[l].count == b->tail[l].count && a->tail[l].pos0 == b->tail[l].pos0,
               "%s: L%d tail %d@%lld vs %d@%lld", what, l, a->tail[l].count, (long long)a->tail[l].pos0,
               b->tail[l].count, (long long)b->tail[l].pos0);
        EXPECT(same_bytes(a->tail_buf[l], b->tail_buf[l],
                          4 * (size_t)op_comp_tail_floats(y->pool->ratio, p->model.head_dim)),
               "%s: L%d tail rows differ", what, l);
      }
    }
    const struct rt_ring *r = &a->ring[l], *s = &b->ring[l];
    bool ok = r->r0 == s->r0 && same_bytes(r->pos, s->pos, 8 * (size_t)s->window);
    for (int i = 0; ok && i < s->window; i++) /* an empty slot's bytes are whatever the allocator gave */
      ok = s->pos[i] < 0 || same_bytes(r->slot + (size_t)i * s->entry_bytes, s->slot + (size_t)i * s->entry_bytes,
                                       s->entry_bytes);
    EXPECT(ok, "%s: L%d ring differs", what, l);
  }
  size_t row = sizeof(float) * (size_t)p->model.hc_streams * p->model.hidden;
  bool ok = a->xe_cap == b->xe_cap && same_bytes(a->xe_pos, b->xe_pos, 8 * (size_t)b->xe_cap);
  for (int i = 0; ok && i < b->xe_cap; i++)
    ok = b->xe_pos[i] < 0 || same_bytes((const uint8_t *)a->xe + row * i, (const uint8_t *)b->xe + row * i, row);
  EXPECT(ok, "%s: kept encoder outputs differ", what);
}

static int64_t pages_in_use(const struct fx *f) {
  int64_t n = 0;
  for (int l = 0; l < f->p->n_layers; l++) n += f->pools[l].ratio > 0 ? f->pools[l].pages_in_use : 0;
  return n;
}

static void check_equivalence(struct fx *pd, struct fx *one, enum rt_executor ex) {
  static const int64_t lens[] = {1, 7, 16, 37, 64, 101};
  static const int chunks[] = {40, 16, 7};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
      int64_t n = lens[i];
      int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
      make_prompt(tok, n, pd->V, PROMPT_SEED + (uint64_t)n);
      struct rt_gen_opts o = {.chunk = chunks[c], .replay = -1, .max_new = 4, .all_logits = true, .executor = ex};
      struct rt_request ra = {0}, rb = {0};
      struct rt_gen_result a, b;
      struct rt_pd_stats st;
      char what[96];
      snprintf(what, sizeof what, "%s n=%lld chunk=%d", rt_executor_name(ex), (long long)n, chunks[c]);
      int rc = rt_pd_generate(&pd->M, pd->pools, &ra, tok, n, &o, &a, &st, NULL, err, sizeof err);
      EXPECT(rc == 0, "%s: P/D run: %s", what, err);
      int rc2 = rt_generate(&one->M, one->pools, &rb, tok, n, &o, &b, err, sizeof err);
      EXPECT(rc2 == 0, "%s: one process: %s", what, err);
      if (!rc && !rc2) {
        EXPECT(a.n_tokens == b.n_tokens && same_bytes(a.tokens, b.tokens, 4 * (size_t)b.n_tokens), "%s: tokens differ",
               what);
        EXPECT(a.prefill_rows == b.prefill_rows &&
                   same_bytes(a.prefill_logits, b.prefill_logits, 4 * (size_t)(b.prefill_rows * pd->V)) &&
                   same_bytes(a.prefill_pos, b.prefill_pos, 8 * (size_t)b.prefill_rows),
               "%s: prefill logits differ", what);
        EXPECT(same_bytes(a.decode_logits, b.decode_logits, 4 * (size_t)((b.n_tokens - 1) * pd->V)),
               "%s: decode logits differ", what);
        expect_same_state(pd->p, &ra, &rb, what);
        for (int k = 0; k < RT_PD_META; k++)
          EXPECT(st.bytes[k] == st.expected[k], "%s: %s moved %lld B, the plan says %lld B", what,
                 rt_pd_class_name(k), (long long)st.bytes[k], (long long)st.expected[k]);
        EXPECT(st.bytes[RT_PD_KV] > 0 || n < 2, "%s: no KV moved", what);
        EXPECT(st.overlap == 1.0, "%s: local copies run inside the graph, yet overlap %.3f", what, st.overlap);
      }
      rt_gen_result_free(&a);
      rt_gen_result_free(&b);
      rt_request_free(&ra);
      rt_request_free(&rb);
      EXPECT(pages_in_use(pd) == 0, "%s: D's pages not returned", what);
      free(tok);
    }
}

static void expect_refusal(struct fx *pd, enum rt_pd_fault f, int64_t n, const char *want, const char *label) {
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
  make_prompt(tok, n, pd->V, PROMPT_SEED);
  struct rt_gen_opts o = {.chunk = 16, .replay = -1, .max_new = 3};
  struct rt_request r = {0};
  struct rt_gen_result res;
  struct rt_pd_stats st;
  rt_pd_set_fault(f);
  err[0] = 0;
  int rc = rt_pd_generate(&pd->M, pd->pools, &r, tok, n, &o, &res, &st, NULL, err, sizeof err);
  rt_pd_set_fault(RT_PD_FAULT_NONE);
  EXPECT(rc == CEDAR_EINVAL, "%s: D decoded (rc %d)", label, rc);
  EXPECT(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", label, err, want);
  EXPECT(res.n_tokens == 0, "%s: tokens generated past the barrier", label);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  EXPECT(pages_in_use(pd) == 0, "%s: pages not returned", label);
  free(tok);
}

static void check_refusals_and_faults(struct fx *pd) {
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  struct pc_cache *fake = (struct pc_cache *)&tok; /* never dereferenced: refused before any use */
  struct rt_gen_opts o = {.chunk = 16, .replay = -1, .max_new = 2, .cache = fake};
  struct rt_request r = {0};
  struct rt_gen_result res;
  struct rt_pd_stats st;
  err[0] = 0;
  int rc = rt_pd_generate(&pd->M, pd->pools, &r, tok, 8, &o, &res, &st, NULL, err, sizeof err);
  EXPECT(rc == CEDAR_EUNSUPPORTED && strstr(err, "runs without the prefix cache") && strstr(err, "turn the prefix"),
         "a prefix cache with P/D: rc %d, '%s'", rc, err);
  EXPECT(pages_in_use(pd) == 0, "prefix-cache refusal: pages held");
  static const char *const good[] = {"hold-kv", "corrupt", "truncate", "p-dies:1", "d-dies:17"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    EXPECT(rt_pd_fault_parse(good[i], err, sizeof err) == 0, "fault '%s' refused: %s", good[i], err);
  static const char *const bad[] = {"", "p-dies:", "p-dies:0", "d-dies:x", "p-dies:3x", "hold", "corrupt2"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err[0] = 0;
    EXPECT(rt_pd_fault_parse(bad[i], err, sizeof err) == CEDAR_EINVAL && strstr(err, "want hold-kv"),
           "fault '%s' accepted (or unclear: '%s')", bad[i], err);
  }
  rt_pd_set_fault(RT_PD_FAULT_NONE);
}

/* Non-finite logits on the decode home fail the request cleanly: the
 * embedding row of the token the prefill samples (y1) is poisoned with NaN,
 * so the prefill (prompt ids only) is finite and D's first decode step is
 * not. The request fails with the sampler's message, no -1 enters the
 * token stream, and D's pages return (the defect of pd_run.c's own decode
 * loop, which stored the sampler's -1 as a token). */
static void check_nonfinite_decode(struct fx *f, const char *label) {
  const int64_t n = 16;
  int32_t tok[16];
  struct rt_gen_opts o = {.chunk = 16, .replay = -1, .max_new = 3};
  struct rt_request r = {0};
  struct rt_gen_result res;
  struct rt_pd_stats st;
  int32_t t = 1, y1 = -1;
  for (; t < 64; t++) { /* a prompt id the model does not answer with itself */
    for (int i = 0; i < n; i++) tok[i] = t;
    int rc = rt_pd_generate(&f->M, f->pools, &r, tok, n, &o, &res, &st, NULL, err, sizeof err);
    EXPECT(rc == 0, "%s: clean run: %s", label, err);
    y1 = rc == 0 && res.n_tokens ? res.tokens[0] : -1;
    rt_gen_result_free(&res);
    rt_request_free(&r);
    if (y1 >= 0 && y1 != t) break;
  }
  if (y1 < 0 || y1 == t) {
    EXPECT(false, "%s: no prompt id below 64 whose first answer differs", label);
    return;
  }
  const int d = f->p->model.hidden;
  float *row = (float *)f->M.embed.data + (size_t)y1 * d, *keep = malloc(sizeof(float) * (size_t)d);
  memcpy(keep, row, sizeof(float) * (size_t)d);
  for (int i = 0; i < d; i++) row[i] = NAN;
  err[0] = 0;
  int rc = rt_pd_generate(&f->M, f->pools, &r, tok, n, &o, &res, &st, NULL, err, sizeof err);
  memcpy(row, keep, sizeof(float) * (size_t)d);
  free(keep);
  EXPECT(rc == CEDAR_EINVAL && strstr(err, "NaN or +inf") && strstr(err, "position 16"),
         "%s: NaN logits on D: rc %d, '%s'", label, rc, err);
  for (int i = 0; i < res.n_tokens; i++)
    EXPECT(res.tokens[i] >= 0 && res.tokens[i] < f->V, "%s: token %d is %d", label, i, res.tokens[i]);
  rt_gen_result_free(&res);
  rt_request_free(&r);
  EXPECT(pages_in_use(f) == 0, "%s: D's pages not returned", label);
}

int main(void) {
  struct fx pd, pdd, one;
  if (!fx_open(&pd, PD_PLAN) || !fx_open(&pdd, PD_PLAN_D) || !fx_open(&one, PLAN_T40)) return h_report("pd");
  EXPECT(rt_pd_split(pd.p) && !rt_pd_split(one.p), "the P/D plan splits, tiny-40 does not");
  EXPECT(rt_pd_role_of(pd.p) == RT_PD_LOCAL, "without mpirun both roles run here");
  EXPECT(pdd.p->serving.pd_replay == PLAN_REPLAY_ON_DECODE, "replay: decode not loaded");
  check_equivalence(&pd, &one, RT_EXEC_DIRECT);
  check_equivalence(&pdd, &one, RT_EXEC_DIRECT);
  /* the StarPU executor: transfer tasks run on workers, beside the next tile */
  if (rt_starpu_init(&(struct rt_starpu_opts){.workers = 2, .sched = "lws"}, err, sizeof err) == 0) {
    check_equivalence(&pd, &one, RT_EXEC_STARPU);
    check_equivalence(&pdd, &one, RT_EXEC_STARPU);
    rt_starpu_shutdown();
  } else {
    EXPECT(false, "StarPU: %s", err);
  }
  for (int i = 0; i < 2; i++) {
    struct fx *f = i ? &pdd : &pd;
    expect_refusal(f, RT_PD_FAULT_DROP_TAIL, 37, "condition 3 (compressor tail)", "a missing tail");
    expect_refusal(f, RT_PD_FAULT_DROP_TAIL, 36, "condition 3 (compressor tail)", "a missing tail, even boundary");
    expect_refusal(f, RT_PD_FAULT_SWA_SHIFT, 37, "condition 2 (SWA boundary)", "an SWA boundary mismatch");
    expect_refusal(f, RT_PD_FAULT_INFLIGHT, 37, "still in flight", "a page in flight");
    expect_refusal(f, RT_PD_FAULT_VERSION, 37, "state version mismatch", "a version mismatch");
    expect_refusal(f, RT_PD_FAULT_Y1, 37, "condition 4 (sampled-but-unconsumed token)", "an ambiguous y1");
    expect_refusal(f, RT_PD_FAULT_CORRUPT, 37, "fails its checksum", "a corrupt KV message");
  }
  check_refusals_and_faults(&pd);
  check_nonfinite_decode(&pd, "P/D");
  check_nonfinite_decode(&pdd, "P/D, replay on D");
  fx_close(&pd);
  fx_close(&pdd);
  fx_close(&one);
  return h_report("pd");
}

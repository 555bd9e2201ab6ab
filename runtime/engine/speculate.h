/* speculate.h: speculative decoding of one request (SPEC 3.16, 7.8; issue
 * 16): a drafter proposes L tokens after the pending one, the target
 * verifies all L + 1 positions in one forward (graph_build_verify), the
 * longest agreeing prefix plus the correction or bonus token is committed,
 * and everything the rejected drafts touched is rolled back.
 *
 * Rollback by design (docs/speculative.md, "Rollback"): before a verify step of
 * positions [pos, pos + n) a snapshot keeps exactly what the step can
 * touch: the n ring slots of those positions in every layer (bytes and
 * position tags: a wrapped ring's old neighbours), every source's committed
 * entry count and tail (fp32 rows and counters), the kept encoder outputs
 * of those positions (CED), the token history length (Engram reads it),
 * and, while the step runs, the compressor's projected rows of those
 * positions (rt_tail_log). Committing c of the n positions restores the
 * ring slots and encoder outputs of positions >= pos + c, cuts every global
 * source back to the entries positions < pos + c complete (pages past them
 * go back to the pool), and rebuilds each tail from its old rows and the
 * logged rows of the kept positions: SPEC 7.8's x1 stays pending when x2
 * is rejected. The committed state then equals plain decoding's (SPEC
 * 8.9.47b), which tests/test_speculate.c checks byte for byte.
 *
 * Acceptance: greedy keeps draft i while it equals the argmax of row i;
 * sampled uses the speculative rejection rule (Leviathan, Kalman, Matias,
 * "Fast Inference from Transformers via Speculative Decoding", ICML 2023,
 * Algorithm 1; Chen et al. 2023): accept x with probability min(1, p/q),
 * else draw from norm(max(0, p - q)); all accepted: a bonus draw from p.
 *
 * Drafters: the model's DSpark (runtime/model/mtp.h: rt_mtp_drafter) or a forced one
 * for tests and benchmarks (rt_forced_drafter: agrees with a reference
 * continuation at chosen positions, so every rollback path can be driven).
 * The verify forward is one row of the one step function (runtime/gen/step.h);
 * continuous batching drives a request's rounds through rt_spec_req
 * (below; runtime/engine/batch.h: rt_batch_speculate).
 * Test: tests/test_speculate.c (ctest -R speculate), tests/test_batch_spec.c
 * (inside the batch).
 */
#ifndef CEDAR_RUNTIME_SPECULATE_H
#define CEDAR_RUNTIME_SPECULATE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/gen/generate.h"
#include "runtime/model/model.h"
#include "runtime/model/state.h"
#include "runtime/model/mtp.h"

#define RT_SPEC_LMAX 16 /* drafts a round may verify (plan dspark.draft is 5) */

/* What a verify step of positions [pos, pos + n) may touch, kept before it. */
struct rt_spec_snap {
  const struct plan *p;
  int cap;                        /* n it was sized for */
  int64_t pos, n_tokens;
  int n;
  int64_t n_entries[PLAN_MAX_LAYERS];
  struct op_comp_tail tail[PLAN_MAX_LAYERS];
  float *tail_rows[PLAN_MAX_LAYERS];   /* copy of r->tail_buf (ratio > 1) */
  uint8_t *ring_slot[PLAN_MAX_LAYERS]; /* (cap, entry_bytes) */
  int64_t *ring_pos[PLAN_MAX_LAYERS];  /* (cap) */
  int64_t ring_r0[PLAN_MAX_LAYERS];
  float *xe_rows;                      /* (cap, rt_xe_row_floats) or NULL */
  int64_t *xe_pos;
  struct rt_tail_log log[PLAN_MAX_LAYERS];
};

/* A drafter: up to L tokens continuing r's history (r->n_tokens ids) and y0
 * (the pending token, position r->n_pos). Writes draft (L), q (L, V) the
 * distribution each was drawn from (NULL: one-hot, a deterministic drafter)
 * and conf (L) each draft's estimated acceptance probability, given the
 * ones before it accepted. Returns the drafts written (0..L) or a negative
 * cedar_status with err. */
struct rt_drafter {
  int (*draft)(void *self, const struct rt_model *M, struct rt_request *r, int32_t y0, int L, int32_t *draft,
               float *q /* (L, V) or NULL */, float *conf, char *err, size_t err_len);
  void *self;
  int max_draft;
  bool has_q;          /* draft() fills q; else its drafts are deterministic (q one-hot) */
};

/* The forced drafter: in a round whose pending token is ref[k] (position
 * ref_pos0 + k), draft i is ref[k + 1 + i] where it is to agree and
 * (ref[k + 1 + i] + 1) mod V elsewhere. Modes: every draft agrees with probability rate, drawn from a
 * seeded generator (rate 1: all; 0.5: the benchmark's half), or a fixed
 * pattern: the first k_agree drafts of every round agree, the next one
 * does not. conf is rate (the pattern: 1 up to k_agree, then 0). */
struct rt_forced {
  const int32_t *ref;  /* the greedy plain continuation: ref[0] = first generated token */
  int n_ref;
  int64_t ref_pos0;    /* position of ref[0]'s consumption: the prompt length */
  float rate;          /* >= 0: Bernoulli mode */
  int k_agree;         /* rate < 0: pattern mode */
  uint64_t rng;
  int V;
};
struct rt_drafter rt_forced_drafter(struct rt_forced *f, int max_draft);

struct rt_spec_opts {
  struct rt_drafter drafter;
  int lmax;            /* drafts per round at most (<= RT_SPEC_LMAX, <= drafter.max_draft) */
  bool adaptive;       /* choose L each round from t_round and the drafter's conf (op_dspark_verify_len) */
  double t_round[RT_SPEC_LMAX + 1]; /* measured seconds of a round verifying L drafts; 0: measure it first */
  /* Test hook: called after every commit with the round's position and kept
   * count (the plain-decode equality test checks state there). */
  void (*on_commit)(void *user, const struct rt_request *r, int64_t pos, int c);
  void *user;
};

/* vLLM's names (vllm/v1/spec_decode/metrics.py): num_drafts rounds that
 * verified >= 1 draft, num_draft_tokens, num_accepted_tokens,
 * accepted_per_pos[i]; mean acceptance length = 1 + accepted / drafts,
 * per-position acceptance rate = accepted_per_pos[i] / drafts. */
struct rt_spec_stats {
  int64_t rounds;                 /* verify steps, drafts or not */
  int64_t num_drafts, num_draft_tokens, num_accepted_tokens;
  int64_t accepted_per_pos[RT_SPEC_LMAX];
  int64_t len_hist[RT_SPEC_LMAX + 1]; /* rounds by chosen L */
  double t_round[RT_SPEC_LMAX + 1];   /* the profile used */
  double decode_s;                    /* rounds' wall time */
};
double rt_spec_mean_accept_len(const struct rt_spec_stats *s);

/* Measure t_round[L] for L = 0..lmax on r's live state (each step rolled
 * back completely): the best of `reps` verify forwards. */
int rt_spec_profile(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o, int lmax, int reps,
                    double *t_round, char *err, size_t err_len);

/* The sampled acceptance of one round (speculate.c; exposed for its test):
 * logits (L + 1, V) of the verify rows, the L drafts and their
 * distributions q (L, V) (NULL: one-hot), o's sampler (temperature, top-k,
 * top-p, repetition penalty); seen: the n_seen ids consumed before the
 * round, then the round's L + 1 tokens (row i is penalized over seen[0,
 * n_seen + i + 1)), pen (V) workspace, NULL when o has no penalty; out
 * (L + 1) receives the accepted drafts then the correction or bonus.
 * prob, resid (V) and order (V) are workspace. Returns the drafts accepted,
 * or CEDAR_EINVAL (non-finite logits) with err. */
int rt_spec_accept_sampled(const float *logits, const int32_t *draft, const float *q, int L, int V,
                           const struct rt_gen_opts *o, const int32_t *seen, int64_t n_seen, float *pen,
                           uint64_t *rng, float *prob, int32_t *order, float *resid, int32_t *out, int64_t pos,
                           char *err, size_t err_len);

/* rt_generate's contract, decoding speculatively after the prefill: with a
 * greedy o the tokens equal rt_generate's bit for bit. res->decode_logits
 * is not filled (NULL); tokens, TTFT and ITLs are. Refuses a prefix cache
 * and the StarPU executor (not yet verified under rollback). */
int rt_generate_spec(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                     int64_t n, const struct rt_gen_opts *o, struct rt_spec_opts *so, struct rt_gen_result *res,
                     struct rt_spec_stats *stats, char *err, size_t err_len);

/* One request's speculative rounds driven by another loop (continuous
 * batching: runtime/engine/batch.c), greedy: rt_spec_propose drafts up to
 * want tokens after r->pending, keeps what the verify may touch and pushes
 * the pending token and the drafts (returns the verify row's positions,
 * L + 1, or a negative status with err; r->pending becomes -1); the loop
 * runs that row through the one step function (runtime/gen/step.h) into
 * x->lg, alone; rt_spec_settle_greedy accepts as rt_generate_spec's greedy
 * rounds do (the penalized argmax of each row), commits a + 1 positions,
 * writes them to acc (L + 1) and sets r->pending; returns a, or a negative
 * status with err (non-finite logits: the request fails). A row that
 * failed: rt_spec_abandon (the request is dropped, never continued). The
 * committed tokens equal plain greedy decoding's, bit for bit. */
struct rt_spec_req {
  struct rt_drafter drafter;
  int lmax;
  float rep_penalty;   /* 0 or 1: off */
  struct rt_spec_snap snap;
  int L;               /* this round's drafts */
  int64_t pos;         /* this round's first position */
  int32_t draft[RT_SPEC_LMAX];
  float *lg;           /* (lmax + 1, V): the verify row's logits */
  float *pen;          /* (V) with a penalty */
};
/* 0, or CEDAR_ENOMEM. */
int rt_spec_req_init(struct rt_spec_req *x, const struct rt_model *M, struct rt_drafter d, int lmax, float rep_penalty);
void rt_spec_req_free(struct rt_spec_req *x);
int rt_spec_propose(struct rt_spec_req *x, const struct rt_model *M, struct rt_request *r, int want, char *err,
                    size_t err_len);
int rt_spec_settle_greedy(struct rt_spec_req *x, const struct rt_model *M, struct rt_request *r, int32_t *acc,
                          char *err, size_t err_len);
void rt_spec_abandon(struct rt_request *r);

/* A drafter for speculate.h over D (runtime/model/mtp.h), with its capture (the request's
 * r->mtp_cap must be c: rt_gen_opts.mtp_cap attaches it at the prefill). */
struct rt_mtp_drafter {
  const struct rt_mtp *D;
  struct rt_mtp_cap *cap;
  struct rt_arena ar;
  double draft_s;   /* time in the drafter */
  int64_t blocks;   /* draft blocks run */
};
void rt_mtp_drafter_init(struct rt_mtp_drafter *f, const struct rt_mtp *D, struct rt_mtp_cap *cap);
void rt_mtp_drafter_free(struct rt_mtp_drafter *f);
/* The rt_drafter of f: up to B greedy drafts a round, q NULL (one-hot),
 * conf = sigmoid(raw confidence). */
struct rt_drafter rt_mtp_drafter(struct rt_mtp_drafter *f);

#endif

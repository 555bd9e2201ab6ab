/* batch.h: continuous batching (issue 16, docs/serving.md): the loop that
 * drives many requests through one model step by step.
 *
 * A step serves every running request at once. Requests that are decoding
 * run one position each, and their tiles are batched into the same op
 * groups: one decode graph per request (scheduler/graph.h) walked in
 * lockstep, node by node, where the row-wise op groups (embed, Engram
 * injection, the attention's projections, MoE, head) run once over
 * M = batch rows and the stateful parts (each request's SWA ring,
 * compressor tail, KV append, Top-K and sparse attention, Engram row
 * gather, decoder-global projection) run on each request's own state
 * (rt_attn_rows, runtime/model/model.h): the decode rows go through the
 * one step function every driver calls (runtime/gen/step.h: rt_gen_step,
 * in lockstep on the batch's arena). New requests are admitted at step
 * boundaries and their prefill advances one segment (one tile of the
 * prefill graph, at most serving.batch.chunk positions) a step beside the
 * decode rows, under serving.batch.step_tokens (which requests join a step:
 * scheduler/batch_policy.h). A prefill segment runs the same nodes on the
 * same request state as rt_generate's prefill, in the same order.
 *
 * Isolation (SPEC 7.9): all request state is the request's (struct
 * rt_request: page tables, rings, tails, token history); buses and
 * activations are per request rows of per-step buffers. With row-invariant
 * ops a request's tokens and logits are bitwise those it gets alone
 * (rt_generate with the same chunk), whatever runs beside it.
 *
 * Freeing: a request that finishes, fails or is aborted returns its pages
 * at once (rt_request_free) and its prefix-cache pins (pc_release); with a
 * cache its full blocks are inserted first and its encoder snapshot saved,
 * as rt_generate does.
 *
 * Time: rt_batch.clock advances by each step's measured wall time; every
 * token is stamped with the clock at the end of the step that sampled it.
 * The caller may move the clock forward between steps (serve-sim jumps to
 * the next arrival when nothing runs): cli/serve_sim_batch.c.
 *
 * One thread; the direct executor only (StarPU and P/D plans are refused
 * by rt_batch_init with a message).
 * Speculative requests (rt_batch_speculate): their verify rows run beside
 * the decode rows, greedy, bitwise plain greedy decoding.
 * Test: tests/test_batch_spec.c (speculative beside plain, bitwise plain
 * greedy), tests/test_batch.c (16 requests batched = alone, bitwise; the abort
 * storm; admission under the budget), tests/cli/serve_sim_batch.sh.
 */
#ifndef CEDAR_RUNTIME_BATCH_H
#define CEDAR_RUNTIME_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/speculate.h"
#include "runtime/gen/generate.h"
#include "runtime/gen/sampler.h"
#include "runtime/model/model.h"
#include "runtime/cache/prefix_cache.h"
#include "runtime/model/state.h"
#include "scheduler/graph.h"

enum rt_bq_state { RT_BQ_WAITING = 0, RT_BQ_PREFILL, RT_BQ_DECODE, RT_BQ_DONE, RT_BQ_ABORTED, RT_BQ_FAILED };

struct rt_bq {
  enum rt_bq_state state;
  int64_t user;            /* the caller's tag */
  float temperature, top_p;/* this request's sampler (rt_batch_sample; else the batch's) */
  int top_k;               /* 0: off */
  float rep_penalty;       /* 0 or 1: off; over the prompt and the ids generated so far */
  int32_t *prompt;         /* (n) */
  int64_t n;
  int max_new;
  uint64_t rng;            /* sampling state, seeded by rt_batch_submit */
  struct rt_spec_req *spec;/* speculative rounds (rt_batch_speculate), or NULL */
  struct rt_request r;
  bool r_live;             /* r holds state (pages) */
  /* the prefill graph, run segment by segment */
  struct graph g;
  bool g_live;
  void **buf;              /* (g.n_data) activations and buses alive across segments */
  int *seg;                /* (n_seg + 1) first node of each segment */
  int n_seg, next_seg;
  float *plogits;          /* (g.out_rows, vocab) */
  int64_t out_row;
  struct pc_hit hit;
  struct rt_hit_report hrep;
  double prefill_s;        /* wall seconds of its segments */
  int64_t prefill_tl;      /* token-layers of its prefill */
  /* outputs */
  int32_t *tokens;         /* (max_new) */
  double *t_token;         /* (max_new) clock when each was sampled */
  float *logits;           /* (max_new, vocab) the logits each token was sampled from, with keep_logits */
  int n_tokens;
  double t_submit, t_admit;
  char err[256];           /* FAILED: why */
};

struct rt_batch_opts {
  int max_requests, step_tokens, chunk; /* <= 0: the plan's serving.batch */
  float temperature, top_p;             /* 0: greedy; top_p 1: off */
  int top_k;                            /* 0: off */
  float rep_penalty;                    /* 0 or 1: off (runtime/gen/sampler.h) */
  struct pc_cache *cache;               /* or NULL */
  bool save_snapshot;
  bool keep_logits;                     /* keep every token's logits (tests) */
};

/* What one step ran. */
struct rt_batch_step {
  int decode_rows, prefill_segments, admitted;
  int64_t prefill_tokens, tokens;
  double seconds;
};

struct rt_batch {
  const struct rt_model *M;
  struct rt_kv_pool *pools;
  struct rt_batch_opts o;
  struct rt_bq **q;        /* every request submitted, by handle */
  int n_q, cap_q;
  int *live;               /* handles not finished, in arrival order */
  int n_live;
  double clock;
  int64_t steps, decode_rows, prefill_tokens;
  double decode_s;         /* wall seconds of the batched decode parts of the steps */
  double decode_cpu_s;     /* their CPU seconds (this thread's): the cost when a shared machine descheduled it */
  int64_t decode_steps;    /* steps that ran decode rows */
  double decode_fam_s[RT_FAM_COUNT]; /* the decode parts' time by op family (runtime/model/arena.h) */
  long long decode_experts;/* routed experts their MoE groups ran, distinct per layer and step
                              (rt_arena.experts): what the steps' weight bytes depend on */
  struct rt_sampler smp;   /* the one sampler path's scratch (runtime/gen/sampler.h) */
  struct rt_arena *ar;
};

/* Ready b for M on pools. Returns 0, or CEDAR_EINVAL with a message (a P/D
 * plan; limits against serving.batch's rules). */
int rt_batch_init(struct rt_batch *b, const struct rt_model *M, struct rt_kv_pool *pools,
                  const struct rt_batch_opts *o, char *err, size_t err_len);
/* Abort every request still running, free everything. */
void rt_batch_free(struct rt_batch *b);

/* Queue a request (prompt copied; ids checked by the caller against the
 * vocab). Its handle (>= 0), or CEDAR_EINVAL with a message (empty prompt,
 * max_new < 1). It waits until a step admits it. */
int rt_batch_submit(struct rt_batch *b, const int32_t *prompt, int64_t n, int max_new, uint64_t seed, int64_t user,
                    char *err, size_t err_len);
/* The sampler of request h, before its first step: temperature (0 greedy),
 * top_p (1 off), top_k (0 off) and the repetition penalty (0 or 1 off),
 * applied as rt_generate applies them (ops/sample.h), so a request sampled
 * here gets the tokens rt_generate gives it with the same options. */
void rt_batch_sample(struct rt_batch *b, int h, float temperature, float top_p, int top_k, float rep_penalty);
/* Decode request h speculatively, before its first step: each step it
 * drafts up to lmax tokens with d (clamped to what it has left and what
 * the verify may hold), its verify row runs alone through the step
 * function beside the batch's decode rows, and greedy acceptance commits
 * the agreeing drafts plus the correction or bonus token (speculate.h:
 * rt_spec_req): its tokens are bitwise those plain greedy decoding gives.
 * The step's budget counts lmax + 1 tokens for it. Returns 0, or
 * CEDAR_EINVAL / CEDAR_EUNSUPPORTED with a message (a sampled request:
 * acceptance here is greedy; a prefix cache: the rollback is not checked
 * with cached pages; lmax outside [0, RT_SPEC_LMAX], the drafter's or the
 * window's bound; a request already admitted). */
int rt_batch_speculate(struct rt_batch *b, int h, struct rt_drafter d, int lmax, char *err, size_t err_len);
/* One step (batch_policy.h). Returns the tokens it ran (0: nothing to run). */
int64_t rt_batch_run_step(struct rt_batch *b, struct rt_batch_step *st);
/* Abort request h: its pages return now; a finished one is left as is. */
void rt_batch_abort(struct rt_batch *b, int h);
/* End request h now as finished (a stop string or EOS its caller saw):
 * with a cache its blocks go in as at its last token, then its pages
 * return. Only a decoding request; others are left as they are. */
void rt_batch_stop(struct rt_batch *b, int h);
/* Drop a request that is over (done, aborted or failed) and everything it
 * kept (its tokens, times, logits): a server that runs for days keeps only
 * its live requests. b->q[h] becomes NULL; the handle is never reused. */
void rt_batch_forget(struct rt_batch *b, int h);
/* Requests waiting or running. */
static inline int rt_batch_pending(const struct rt_batch *b) { return b->n_live; }

#endif

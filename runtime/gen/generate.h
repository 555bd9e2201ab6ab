/* generate.h: one request from prompt to generated tokens: compile the
 * prefill graph, run it, sample, then one decode graph per new token
 * (docs/model.md s6). What `cedar run` and the model tests call.
 *
 * Each graph runs on the executor the options choose: the direct one
 * (default: zeroed options keep it) or StarPU's (rt_starpu_init first).
 * on_graph, when set, sees every graph that ran, with its task times under
 * StarPU (traces, DOT export).
 *
 * With a prefix cache (rt_gen_opts.cache) the prompt's cached prefix is
 * attached first and only SPEC 6.5's paths run (docs/runtime.md); at the end
 * the request's blocks go into the cache and its encoder state into the
 * snapshot pool. rt_continue continues a live request instead.
 *
 * Timing: TTFT is the prefill graph plus the first sample; the first ITL is
 * the first decode step (graph build, run, sample); the steady ITL is the
 * mean of the later steps.
 * Not here: argument parsing and printing (cli/cmd_run.c).
 * Test: tests/test_model_*.c, tests/test_prefix_hit.c, tests/cli/serve_sim.sh.
 */
#ifndef CEDAR_RUNTIME_GENERATE_H
#define CEDAR_RUNTIME_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/exec/exec.h"
#include "runtime/cache/prefix_cache.h"
#include "runtime/gen/sampler.h"
#include "runtime/model/state.h"

enum rt_executor { RT_EXEC_DIRECT = 0, RT_EXEC_STARPU };

/* A multi-rank driver's answer on a rank that ran its part of the request
 * while another rank reports it (runtime/dist/: P/D, stages, experts): not
 * an error, nothing to print here. */
#define RT_GEN_ELSEWHERE 1

/* "direct" or "starpu", and back: false, *e untouched, for another name. */
const char *rt_executor_name(enum rt_executor e);
bool rt_executor_parse(const char *name, enum rt_executor *e);

/* Called after each graph ran (prefill, then each decode step): the graph
 * and, under StarPU, each node's record (g->n_node); NULL under direct. */
typedef void (*rt_graph_cb)(void *user, const struct graph *g, const struct rt_task_time *times);

struct rt_gen_opts {
  int chunk;           /* <= 0: serving.prefill_chunk */
  int64_t replay;      /* < 0: serving.replay.decoder */
  int max_new;         /* tokens to generate (>= 1) */
  float temperature;   /* 0: greedy */
  float top_p;         /* 1: off */
  int top_k;           /* 0: off (ops/sample.h) */
  float rep_penalty;   /* repetition penalty over prompt + generated ids (ops/sample.h); 0 or 1: off */
  /* (pd_run.c samples with all of these, as rt_generate does; on_token is rt_generate's only:
   * rt_engine_generate refuses it on a P/D plan) */
  uint64_t seed;       /* sampling */
  /* Teacher forcing (sampler.h; `cedar eval`): the request's whole text,
   * position by position; the token after position p is teacher[p + 1]
   * while p + 1 < n_teacher. NULL: sampled. P/D ranks force it as well. */
  const int32_t *teacher;
  int64_t n_teacher;
  bool all_logits;     /* keep the logits of every prefill position that ran through every layer */
  rt_progress_cb progress; /* prefill progress, or NULL */
  void *user;
  enum rt_executor executor;
  rt_graph_cb on_graph;    /* or NULL */
  void *graph_user;
  /* Prefix caching (issue 6): with a cache, the prompt's longest cached
   * prefix is attached and only what SPEC 6.5 says is recomputed; at the end
   * the request's full blocks are inserted and, with save_snapshot, its
   * encoder state at its final boundary is saved for a continuation. */
  struct pc_cache *cache;
  bool save_snapshot;
  int64_t reserve;     /* extra token capacity in the request, for rt_continue */
  /* Called with each sampled id as soon as it is sampled (streaming text,
   * EOS and stop strings: runtime/text/text_out.h); non-zero ends the request
   * there, the id kept as its last token (rt_gen_result.stopped). NULL: the
   * request runs max_new tokens. */
  int (*on_token)(void *user, int32_t id);
  void *token_user;
  /* The DSpark drafter's capture (runtime/model/mtp.h) attached to the request
   * from its prefill on (speculate.c's --speculate mtp), or NULL. */
  struct rt_mtp_cap *mtp_cap;
  /* A multi-rank driver's binding (runtime/dist/: rt_pipe_bind): with
   * one_rank this process runs only rank's nodes (rt_exec_out.one_rank);
   * after_graph, when set, is called after every graph with the graph's
   * status and returns the status to go on with (layer stages: every rank
   * gets the logits). Zero: one process plays every rank. */
  bool one_rank;
  int rank;
  int (*after_graph)(void *user, const struct graph *g, struct rt_exec_out *out, const struct rt_exec_stats *st,
                     const struct rt_task_time *times, int rc, char *err, size_t err_len);
  void *after_user;
};

/* g on o's executor, as every driver runs a graph: this rank's nodes
 * (o->one_rank), then o->after_graph, then o->on_graph when notify.
 * progress (with o->user) follows the nodes, or NULL. keep: the nodes'
 * times go there (else a buffer of its own when on_graph wants them). */
int rt_gen_run_graph(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                     struct rt_exec_stats *st, const struct rt_gen_opts *o, rt_progress_cb progress, bool notify,
                     struct rt_task_time *keep, char *err, size_t err_len);

/* What a prefix hit reused and what the prefill ran (SPEC 6.5, 6.6). */
struct rt_hit_report {
  int64_t hit;              /* the boundary c the prefill continued from (0 = cold) */
  int64_t global_hit;       /* tokens of global entries attached from the cache (whole blocks) */
  bool swa_hit;             /* path (a): an encoder-SWA snapshot at c was restored */
  int64_t encoder_replay_start, encoder_replay; /* path (b): [start, c) replayed, global writes off */
  int64_t encoder_positions;/* encoder replay + suffix (n - c) */
  int64_t decoder_replay, decoder_cached; /* decoder replay positions, of which below c */
  int64_t new_entries, new_entry_bytes;   /* global entries this prefill appended */
  int64_t bytes_attached;   /* cached pages attached (memory tier) */
  int64_t bytes_restored;   /* snapshot bytes restored */
  int64_t disk_blocks;      /* of the attached blocks, loaded from the disk tier */
  int64_t bytes_from_disk;  /* their bytes (part of bytes_attached) */
  int64_t blocks_inserted;  /* at the end */
};

struct rt_gen_result {
  int32_t *tokens;     /* (max_new) generated ids */
  int n_tokens;
  float *prefill_logits;   /* (prefill_rows, vocab) */
  int64_t *prefill_pos;    /* (prefill_rows) */
  int64_t prefill_rows;
  float *decode_logits;    /* (n_tokens - 1, vocab): the logits each decode step sampled from */
  double ttft_s, first_itl_s, steady_itl_s;
  struct rt_exec_stats prefill, decode;
  int64_t replay;          /* decoder replay length the prefill used (0 dense) */
  int prefill_nodes, prefill_edges, decode_nodes;
  struct rt_hit_report hit;
  bool stopped;            /* on_token ended the request before max_new */
};

/* The sampler options of o (sampler.h). */
struct rt_sample_opts rt_gen_sample_opts(const struct rt_gen_opts *o);

/* The next token from one position's logits (pos) through the one sampler
 * path (sampler.h) into res->tokens and r->pending, then o->on_token: 0, or
 * CEDAR_EINVAL with err (non-finite logits fail the request and never reach
 * the token stream). Defined in step.c beside the loop below. */
int rt_gen_take_token(struct rt_sampler *s, const float *logits, const struct rt_gen_opts *o, uint64_t *rng,
                      int64_t pos, struct rt_request *r, struct rt_gen_result *res, char *err, size_t err_len);

/* The decode loop every single-request driver runs after its prefill
 * (rt_generate; P/D and stages on the decode home): r holds r->n_pos
 * positions and r->pending the last sampled token; res->tokens holds
 * res->n_tokens (>= 1) tokens with room for o->max_new, res->decode_logits
 * room for o->max_new - 1 rows. Steps until o->max_new tokens, until
 * o->on_token stops the request, or until a step or the sampler fails
 * (non-finite logits fail the request: no -1 enters the token stream).
 * Each step is one row of the one step function (step.h: rt_gen_step). */
int rt_gen_decode(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o, struct rt_sampler *s,
                  uint64_t *rng, struct rt_gen_result *res, char *err, size_t err_len);

/* Run prompt (n ids, checked against the vocab by the caller) on a fresh
 * request r (initialised here; the caller frees it with rt_request_free,
 * after reading its state). Returns 0 or a negative cedar_status with err. */
int rt_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len);
/* A live request continues (a session kept in memory): its state covers
 * [0, r->n_pos) and it holds exactly those ids (the last sampled token is
 * not consumed: pass it first in `more` to consume it). Appends `more`,
 * prefills them from the live state, as a prefix hit with its encoder
 * snapshot restored would (SPEC 6.5 path a), then decodes. The request
 * needs room (rt_gen_opts.reserve when it was made). Takes no cache. */
int rt_continue(const struct rt_model *M, struct rt_request *r, const int32_t *more, int64_t n_more,
                const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len);
void rt_gen_result_free(struct rt_gen_result *res);

/* The prefix-cache steps rt_generate takes around a request, for a loop
 * that drives requests step by step (runtime/engine/batch.c): attach the longest
 * cached prefix of prompt to the fresh request r (go->hit, go->swa_hit
 * say where its state ends; a failed restore returns CEDAR_ENOMEM with
 * err), and at the end insert r's blocks and save its encoder snapshot
 * (o->save_snapshot), releasing hit. o->cache must be set. */
int rt_gen_prefix_attach(const struct rt_model *M, struct rt_request *r, const int32_t *prompt, int64_t n,
                         const struct rt_gen_opts *o, struct pc_hit *hit, struct rt_hit_report *h,
                         struct graph_opts *go, char *err, size_t err_len);
void rt_gen_prefix_finish(const struct rt_model *M, struct rt_request *r, const struct rt_gen_opts *o,
                          struct pc_hit *hit, struct rt_hit_report *h, double prefill_s, int64_t prefill_tl);

#endif

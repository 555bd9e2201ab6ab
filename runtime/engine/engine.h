/* engine.h: one model made ready to serve, in one call: the plan (loaded
 * and validated), its weights (synthetic from a seed, or a safetensors file
 * checked against the plan), the model bound to them (runtime/model/model.h), the
 * KV page pools (runtime/model/state.h), optionally the prefix cache and its disk
 * tier (runtime/cache/prefix_cache.h, runtime/cache/disk_tier.h), and the executor,
 * started (StarPU once, through rt_starpu_init, when it is asked for).
 * `cedar run`, `cedar serve-sim` and `cedar bench model` open one, call it,
 * and close it; none of them builds the pieces by hand.
 *
 * Open order: plan, the placement check (runtime/node/backend.h), the caller's on_plan check,
 * weights, model, pools, cache, disk tier, executor. A failed open releases
 * everything it had opened, names the step that failed (rt_engine.failed)
 * so a command can word its message, and leaves nothing to close (closing
 * it anyway is a no-op).
 *
 * StarPU runs once per process at a time. An engine opened on StarPU holds
 * it until it is closed (or switched to direct, rt_engine_set_exec); a
 * second engine asking for StarPU meanwhile is refused with a message
 * (CEDAR_EINVAL); any number of direct engines may be open beside it.
 *
 * The model points into the engine (its plan): an open engine is never
 * copied or moved. Requests are single-threaded on the engine's pools, as
 * rt_generate's are; rt_engine_generate_isolated runs on pools of its own.
 *
 * Not here: flags, prompts and printing (cli/), the forward (generate.h).
 * Test: tests/test_engine.c; the commands through tests/cli/run.sh,
 * serve_sim.sh, bench.sh, trace.sh and oracle_run.sh.
 */
#ifndef CEDAR_RUNTIME_ENGINE_H
#define CEDAR_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/load/checkpoint.h"
#include "runtime/dist/dist.h"
#include "runtime/cache/disk_tier.h"
#include "runtime/model/engram_tier.h"
#include "runtime/exec/exec.h"
#include "runtime/gen/generate.h"
#include "runtime/model/model.h"
#include "runtime/cache/prefix_cache.h"
#include "runtime/model/state.h"
#include "runtime/load/weights.h"
#include "scheduler/plan.h"

/* Which executor runs the graphs, and how StarPU is started for it. */
struct rt_engine_exec {
  enum rt_executor executor; /* RT_EXEC_DIRECT (zeroed) or RT_EXEC_STARPU */
  int workers;               /* StarPU CPU workers; <= 0: StarPU's choice */
  const char *sched;         /* StarPU policy; NULL: StarPU's */
  bool profile;              /* StarPU per-task profiling (traces) */
  bool cuda;                 /* both phases on CUDA device 0, over the plan's serving.placement */
};

/* The prefix cache over the engine's pools (issue 6); off when zeroed. */
struct rt_engine_cache {
  bool on;
  int64_t capacity_bytes;    /* memory tier; < 0: serving.cache.host_cache_bytes; 0: no limit */
  bool snapshots;            /* keep encoder-SWA snapshots (else global blocks only) */
  const char *dir;           /* disk tier directory, or NULL */
};

struct rt_engine_opts {
  const char *plan;          /* plan file (required) */
  const char *weights;       /* safetensors file, or NULL: synthetic weights from seed */
  /* A checkpoint directory in the released layout (runtime/load/checkpoint.h),
   * or NULL. With it, plan NULL means the plan its config.json implies, and
   * a plan given is checked against it (every mismatch in problems); its
   * tensors are the weights (weights must be NULL). */
  const char *model;
  uint64_t seed;
  /* Synthetic weights and --model: false (the default) holds each tensor in
   * its stored format (runtime/load/weights.h "held formats"); true holds
   * the same values as F32 (--weights-format f32). A --weights file is held
   * as the file stores it either way. */
  bool weights_f32;
  uint64_t synth_max_bytes;  /* synthetic weights refused above this; 0: WEIGHTS_DEFAULT_MAX_BYTES */
  struct rt_engine_exec exec;
  int cuda_graphs;           /* a CUDA home's decode segments: 0 default (graphs), 1 graphs, 2 eager (engine_dev.c) */
  int64_t dev_tokens;        /* a CUDA home: positions one request slot holds; 0: 4096 (engine_dev.c) */
  int64_t dev_scratch;       /* a CUDA home: device scratch bytes per worker; 0: 512 MiB (engine_dev.c) */
  struct rt_engine_cache cache;
  /* A tokenizer.json, or NULL: the Engram token map comes from it
   * (runtime/model/engram_map.h) when its size fits the plan; a released
   * checkpoint (released true) must fit. Without one the map is id mod
   * compressed_vocab, and model.cmap_source says which. */
  const char *tokenizer;
  bool released;
  /* Run the plan with serving.ced false: the same layers, sources and
   * weights, every position through every layer (`cedar eval`'s dense
   * reference, runtime/engine/eval.h). */
  bool dense;
  /* Run the plan with model.numerics all f32 (activations, sublayer I/O and
   * linear inputs unrounded): the same weights and caches, `cedar eval`'s
   * reference for what the vendor's bf16/MXFP8 rounding costs. */
  bool f32;
  /* Where the details of a failed step go, when not NULL (the caller frees
   * them): every diagnostic of a plan that did not load, every problem of a
   * weights file that does not match the plan. */
  struct plan_diags *diags;
  struct weights_problems *problems;
  /* Called once the plan has loaded and validated, before the weights are
   * built (which takes seconds): the caller checks its request against the
   * plan (a prompt against the vocab) so a bad one fails first. Non-zero
   * fails the open with the message it wrote. NULL: no check. */
  int (*on_plan)(void *user, const struct plan *p, char *err, size_t err_len);
  void *user;
};

/* The step an open failed at (0 while open or never opened). */
enum rt_engine_step {
  RT_ENGINE_OK = 0,
  RT_ENGINE_PLAN,            /* the plan did not load (details in opts.diags), or with a model: its config.json, or the plan unlike it (opts.problems) */
  RT_ENGINE_PLACEMENT,       /* serving.placement names a rank or device this build cannot run */
  RT_ENGINE_ON_PLAN,         /* the caller's on_plan check refused */
  RT_ENGINE_WEIGHTS,         /* synthesis refused, or the file unreadable or unlike the plan (opts.problems) */
  RT_ENGINE_MODEL,           /* the model or the pools (a format the ops cannot pack) */
  RT_ENGINE_CACHE,           /* the prefix cache or its disk tier */
  RT_ENGINE_EXECUTOR,        /* StarPU did not start, or another engine holds it */
};

struct rt_engine {
  struct rt_engine_opts opts;   /* as opened (strings the caller's; diags, problems, on_plan cleared) */
  struct plan plan;
  struct weights weights;
  struct rt_engram_tier engram; /* where the Engram tables live (serving.engram.tier) */
  struct rt_model model;        /* model.p == &plan */
  struct tokenizer *tok;        /* opts.tokenizer loaded, or NULL */
  struct rt_kv_pool *pools;     /* (PLAN_MAX_LAYERS) by source layer */
  struct pc_cache *cache;       /* or NULL */
  struct dt_tier *disk;         /* or NULL; cache->disk when set */
  struct rt_engine_exec exec;   /* in force */
  bool holds_starpu;            /* this engine started StarPU and stops it */
  struct rt_dev_ctx *dev;       /* a CUDA home's state, weights and graphs (engine_dev.c), or NULL; model.dev */
  enum graph_run run;           /* the driver, read off the plan's compiled prefill (scheduler/graph.h) */
  struct rt_dist_report dist;   /* the last request's figures under P/D, stages or experts (runtime/dist/dist.h) */
  bool open;
  enum rt_engine_step failed;   /* after a failed open */
  char name[96];                /* the plan's name once it loaded (kept after a failed open, for messages) */
};

/* The device home of an open (engine_dev.c, runtime/device/devbind.h): when the
 * plan places a flow on CUDA, the device state sized from e->exec, the
 * weights uploaded once, the graph cache (opts.cuda_graphs, opts.dev_tokens),
 * the device model and its workers' scratch (opts.dev_scratch);
 * hung on e->model.dev. 0 when the plan runs on the CPU (a cuda_graphs
 * choice is then refused). Closed by
 * rt_engine_dev_close. */
int rt_engine_dev_open(struct rt_engine *e, char *err, size_t err_len);
void rt_engine_dev_close(struct rt_engine *e);

/* Open e from o. Returns 0, or a negative cedar_status with a message in
 * err; then e->failed names the step and nothing is left open. */
int rt_engine_open(struct rt_engine *e, const struct rt_engine_opts *o, char *err, size_t err_len);
/* Stop StarPU if this engine holds it, free the cache, disk tier, pools,
 * model, weights and plan. A no-op on a zeroed, failed or closed engine. */
void rt_engine_close(struct rt_engine *e);

/* Switch the executor of an open engine: StarPU this engine holds is
 * stopped, then started again when x asks for it. Returns 0 or a negative
 * cedar_status with a message (the engine is then on the direct executor).
 * Switching to direct never fails. */
int rt_engine_set_exec(struct rt_engine *e, const struct rt_engine_exec *x, char *err, size_t err_len);

/* rt_generate on the engine's model and pools with its executor and its
 * prefix cache (snapshots saved when the cache keeps them): those fields of
 * *o are the engine's, the rest the caller's. r is initialised here; free it
 * with rt_engine_request_free after reading its state, before the close. */
int rt_engine_generate(struct rt_engine *e, struct rt_request *r, const int32_t *prompt, int64_t n,
                       const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len);
void rt_engine_request_free(struct rt_engine *e, struct rt_request *r);

/* One request on the direct executor, on KV pools of its own (made and
 * freed here with its request; no cache), so several threads may run one
 * each at once on the same engine. The caller frees res. */
int rt_engine_generate_isolated(const struct rt_engine *e, const int32_t *prompt, int64_t n,
                                const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len);

#endif

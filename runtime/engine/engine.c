/* engine.c: rt_engine_open / rt_engine_close and the calls through an open
 * engine (engine.h). Opening is one step after another, each undone by
 * rt_engine_close in reverse when a later one fails; the close frees only
 * what is there, so it serves both.
 * Not here: any of the pieces themselves (plan.c, weights.c, model.c,
 * state.c, prefix_cache.c, disk_tier.c, exec_starpu.c, generate.c).
 * Test: tests/test_engine.c.
 */
#include "runtime/engine/engine.h"

#include "ops/basic.h"

#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "runtime/comm/comm.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/expert_par.h"
#include "runtime/node/backend.h"
#include "runtime/device/devbind.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"
#include "scheduler/plan_place.h"
#include "runtime/cache/kv_identity.h"
#include "runtime/model/engram_map.h"
#include "runtime/text/tokenizer.h"

/* ---- the steps of an open ------------------------------------------------ */

static int open_plan(struct rt_engine *e, char *err, size_t len) {
  const struct rt_engine_opts *o = &e->opts;
  if (o->model) {
    int rc = ckpt_plan(o->model, o->plan, &e->plan, o->problems, err, len);
    if (!rc) snprintf(e->name, sizeof e->name, "%s", e->plan.name);
    return rc;
  }
  if (!o->plan) {
    snprintf(err, len, "no plan file given");
    return CEDAR_EINVAL;
  }
  int rc = plan_load(o->plan, &e->plan, o->diags);
  if (rc) {
    snprintf(err, len, "%s: the plan did not load", o->plan);
    return rc;
  }
  snprintf(e->name, sizeof e->name, "%s", e->plan.name);
  return 0;
}

static int open_weights(struct rt_engine *e, char *err, size_t len) {
  const struct rt_engine_opts *o = &e->opts;
  int rc;
  uint64_t max = o->synth_max_bytes ? o->synth_max_bytes : WEIGHTS_DEFAULT_MAX_BYTES;
  struct rt_ep_part epp; /* routed experts on ranks: this rank holds only its shard's (expert_par.h) */
  const struct weights_part *part = rt_pipe_multi(&e->plan) ? rt_ep_part_init(&epp, &e->plan, comm_world_rank()) : NULL;
  if (o->model)
    rc = ckpt_load_held(&e->weights, &e->plan, o->model, true, !o->weights_f32, o->problems, NULL, err, len);
  else if (o->weights)
    rc = weights_load_part(&e->weights, &e->plan, o->weights, part, o->problems, err, len);
  else /* with the mmap tier the Engram tables come from their file */
    rc = weights_synth_part(&e->weights, &e->plan, o->seed, max, e->plan.serving.engram_tier == PLAN_ENGRAM_TIER_MMAP,
                            part, err, len);
  if (!rc && !o->weights && !o->weights_f32 && !e->weights.qw) /* synthetic values are stored values: hold them so */
    rc = weights_hold_stored(&e->weights, err, len);
  if (!rc) rt_ep_note_weights(&e->plan, &e->weights); /* what this rank holds, for its report */
  return rc ? rc : rt_engram_tier_open(&e->engram, &e->plan, &e->weights, err, len);
}

/* The tokenizer whose Engram token map the model takes: the one given, else
 * a released checkpoint's own DIR/tokenizer.json when it has one. A map from
 * a checkpoint's tokenizer (or any tokenizer given with --model) must fit
 * its config's compressed vocabulary. */
static int open_tokenizer(struct rt_engine *e, char *err, size_t len) {
  const char *path = e->opts.tokenizer;
  char own[4096];
  if (!path && e->opts.model) {
    int n = snprintf(own, sizeof own, "%s/tokenizer.json", e->opts.model);
    if (n > 0 && (size_t)n < sizeof own && access(own, F_OK) == 0) path = own;
  }
  if (!path) return 0;
  if (!(e->tok = tok_load(path, err, len))) return CEDAR_EINVAL;
  return rt_model_use_tokenizer(&e->model, e->tok, e->opts.released || e->opts.model, err, len);
}

static int open_model(struct rt_engine *e, char *err, size_t len) {
  int rc = rt_model_init(&e->model, &e->plan, &e->weights, err, len);
  if (!rc) rc = open_tokenizer(e, err, len);
  if (rc) return rc;
  e->pools = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*e->pools));
  return rt_kv_pools_init(e->pools, &e->plan, err, len);
}

/* The prefix cache keyed by plan and weights (runtime/cache/kv_identity.h: another
 * model's or another plan's blocks never match), and under it the disk tier. */
static int open_cache(struct rt_engine *e, char *err, size_t len) {
  const struct rt_engine_cache *c = &e->opts.cache;
  if (!c->on) return 0;
  int64_t cap = c->capacity_bytes >= 0 ? c->capacity_bytes : e->plan.serving.host_cache_bytes;
  uint64_t id = pc_kv_identity(&e->plan, weights_identity(&e->weights));
  struct pc_cache *pc = cedar_xcalloc(1, sizeof(*pc));
  int rc = pc_init(pc, &e->plan, e->pools, id, cap, c->snapshots ? -1 : 0, err, len);
  if (rc) {
    free(pc);
    return rc;
  }
  e->cache = pc;
  if (!c->dir) return 0;
  struct dt_tier *dt = cedar_xcalloc(1, sizeof(*dt));
  rc = dt_init(dt, c->dir, id, e->plan.serving.global_ttl_hours, err, len);
  if (rc) {
    free(dt);
    return rc;
  }
  e->disk = dt;
  e->cache->disk = dt;
  return 0;
}

static void stop_exec(struct rt_engine *e) {
  if (e->holds_starpu) rt_starpu_shutdown();
  e->holds_starpu = false;
  e->exec = (struct rt_engine_exec){0};
}

/* StarPU is the process's: started here only when nobody holds it. */
static int start_exec(struct rt_engine *e, const struct rt_engine_exec *x, char *err, size_t len) {
  if (x->executor != RT_EXEC_STARPU) {
    e->exec = *x;
    return 0;
  }
  if (rt_starpu_running()) {
    snprintf(err, len,
             "StarPU is already started in this process (it runs once per process, and another engine or "
             "caller holds it): close that first, or open this engine on the direct executor");
    return CEDAR_EINVAL;
  }
  struct rt_starpu_opts so = {.workers = x->workers, .sched = x->sched, .profile = x->profile};
  int rc = rt_starpu_init(&so, err, len);
  if (rc) return rc;
  if (op_blas_reserve(rt_starpu_workers(), err, len)) { /* each worker may run sgemm at once */
    rt_starpu_shutdown();
    return CEDAR_ENOMEM;
  }
  e->holds_starpu = true;
  e->exec = *x;
  return 0;
}

/* ---- open and close ------------------------------------------------------ */

/* The driver of e's requests from the graph the plan compiles to (a
 * one-token prefill: its nodes say whether prefill and decode sit on two
 * homes, or ranks share the graph), not from re-reading the plan. */
static int choose_driver(struct rt_engine *e, char *err, size_t err_len) {
  struct graph g;
  int rc = graph_build_prefill(&g, &e->plan, 1, &(struct graph_opts){.replay = -1}, err, err_len);
  if (rc) return rc;
  e->run = graph_run_kind(&g);
  graph_free(&g);
  return 0;
}

int rt_engine_open(struct rt_engine *e, const struct rt_engine_opts *o, char *err, size_t err_len) {
  memset(e, 0, sizeof(*e));
  e->opts = *o;
  enum rt_engine_step step = RT_ENGINE_PLAN;
  int rc = open_plan(e, err, err_len);
  bool have_plan = rc == 0;
  /* The plan has loaded and validated; nothing else is built yet. A plan
   * whose serving.placement cannot run in this build is refused here,
   * before seconds of weights (runtime/node/backend.h). */
  if (!rc) {
    step = RT_ENGINE_PLACEMENT;
    if (o->exec.cuda) { /* `cedar run --device cuda`: the placement the plan would say, marks cleared */
      struct plan_serving *sv = &e->plan.serving;
      sv->prefill_device = sv->decode_device = PLAN_DEV_CUDA;
      sv->prefill_device_id = sv->decode_device_id = 0;
      memset(&sv->mark_prefill_device, 0, sizeof sv->mark_prefill_device);
      memset(&sv->mark_decode_device, 0, sizeof sv->mark_decode_device);
    }
    if (o->dense) e->plan.serving.ced = false; /* the dense reference of the same plan (eval.h) */
    if (o->f32) e->plan.model.num_act_bf16 = e->plan.model.num_io_bf16 = e->plan.model.num_lin_mxfp8 = false;
    rc = rt_placement_check(&e->plan, NULL, err, err_len);
    if (!rc) rc = choose_driver(e, err, err_len);
  }
  if (!rc && o->on_plan) {
    step = RT_ENGINE_ON_PLAN;
    rc = o->on_plan(o->user, &e->plan, err, err_len);
  }
  if (!rc) {
    step = RT_ENGINE_WEIGHTS;
    rc = open_weights(e, err, err_len);
  }
  if (!rc) {
    step = RT_ENGINE_MODEL;
    rc = open_model(e, err, err_len);
  }
  if (!rc) {
    step = RT_ENGINE_CACHE;
    rc = open_cache(e, err, err_len);
  }
  if (!rc) {
    step = RT_ENGINE_EXECUTOR;
    rc = start_exec(e, &o->exec, err, err_len);
    if (!rc) rc = rt_engine_dev_open(e, err, err_len); /* a CUDA home's state (engine_dev.c) */
  }
  if (!rc) {
    e->open = true;
    /* what only the open used: the caller's lists and check may not outlive it */
    e->opts.diags = NULL;
    e->opts.problems = NULL;
    e->opts.on_plan = NULL;
    e->opts.user = NULL;
    return 0;
  }
  /* Everything is zeroed or built, so the close takes back exactly what
   * the steps before the failed one made; the plan goes last. */
  e->open = have_plan;
  rt_engine_close(e);
  e->failed = step;
  return rc < 0 ? rc : CEDAR_EINVAL;
}

void rt_engine_close(struct rt_engine *e) {
  if (!e->open) return;
  rt_engine_dev_close(e); /* its StarPU handles go before StarPU */
  rt_dist_report_free(&e->dist);
  stop_exec(e);
  if (e->cache) pc_free(e->cache); /* its pages go back to the pools first */
  free(e->cache);
  if (e->disk) dt_free(e->disk);
  free(e->disk);
  if (e->pools) rt_kv_pools_free(e->pools, e->plan.n_layers);
  free(e->pools);
  rt_model_free(&e->model);
  tok_free(e->tok);
  weights_free(&e->weights);
  rt_engram_tier_close(&e->engram);
  plan_free(&e->plan);
  char name[sizeof e->name];
  memcpy(name, e->name, sizeof name);
  memset(e, 0, sizeof(*e));
  memcpy(e->name, name, sizeof name);
}

/* ---- calls through an open engine ------------------------------------------ */

int rt_engine_set_exec(struct rt_engine *e, const struct rt_engine_exec *x, char *err, size_t err_len) {
  CEDAR_ASSERT(e->open);
  stop_exec(e);
  return start_exec(e, x, err, err_len);
}

int rt_engine_generate(struct rt_engine *e, struct rt_request *r, const int32_t *prompt, int64_t n,
                       const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len) {
  CEDAR_ASSERT(e->open);
  struct rt_gen_opts go = *o;
  go.executor = e->exec.executor;
  go.cache = e->cache;
  go.save_snapshot = e->cache && e->opts.cache.snapshots;
  if (e->run == GRAPH_RUN_PD) { /* prefill and decode on two homes (runtime/dist/pd.h); 1: this rank prints nothing */
    if (o->on_token) { /* pd_run.c samples with the whole sampler (bitwise generate.c's), but streams no text */
      memset(r, 0, sizeof *r), memset(res, 0, sizeof *res);
      snprintf(err, err_len, "plan %s runs prefill and decode apart, which returns ids only: text output (EOS, "
               "--stop) needs a one-process plan (--ids, or --tokens)", e->plan.name);
      return CEDAR_EINVAL;
    }
    return rt_dist_generate(e->run, &e->model, e->pools, r, prompt, n, &go, res, &e->dist, err, err_len);
  }
  if (e->run == GRAPH_RUN_RANKS) /* layer stages, expert shards (runtime/dist/pipeline.h) */
    return rt_dist_generate(e->run, &e->model, e->pools, r, prompt, n, &go, res, &e->dist, err, err_len);
  rt_dist_report_free(&e->dist); /* one home: no distribution figures */
  int rc = rt_generate(&e->model, e->pools, r, prompt, n, &go, res, err, err_len);
  if (!rc && e->dev) rc = rt_dev_request_download(e->dev, r, err, err_len); /* the host reads r's state next */
  return rc;
}

void rt_engine_request_free(struct rt_engine *e, struct rt_request *r) {
  if (e->dev) { /* its device slot back; the state was downloaded after the run */
    char err[256];
    if (rt_dev_request_release(e->dev, r, err, sizeof err)) LOG_WARN("%s", err);
  }
  rt_request_free(r); /* the request's pages are the engine's pools': freed while it is open */
}

int rt_engine_generate_isolated(const struct rt_engine *e, const int32_t *prompt, int64_t n,
                                const struct rt_gen_opts *o, struct rt_gen_result *res, char *err, size_t err_len) {
  CEDAR_ASSERT(e->open);
  struct rt_gen_opts go = *o;
  go.executor = RT_EXEC_DIRECT;
  go.cache = NULL;
  go.save_snapshot = false;
  if (e->run == GRAPH_RUN_PD) {
    snprintf(err, err_len, "prefill and decode on different homes (serving.placement) run one request at a time "
             "(cedar run); concurrent isolated requests do not take a P/D plan yet");
    return CEDAR_EUNSUPPORTED;
  }
  if (e->dev) { /* its request slots are shared, one thread at a time (engine_dev.c) */
    snprintf(err, err_len, "plan %s runs on a CUDA home, whose request slots take one thread at a time; concurrent "
             "isolated requests do not run there yet", e->plan.name);
    return CEDAR_EUNSUPPORTED;
  }
  struct rt_kv_pool *pools = cedar_xcalloc(PLAN_MAX_LAYERS, sizeof(*pools));
  struct rt_request r = {0};
  int rc = rt_kv_pools_init(pools, &e->plan, err, err_len);
  if (!rc) rc = rt_generate(&e->model, pools, &r, prompt, n, &go, res, err, err_len);
  rt_request_free(&r);
  rt_kv_pools_free(pools, e->plan.n_layers);
  free(pools);
  return rc;
}

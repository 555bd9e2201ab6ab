/* engine_dev.c: an engine's device home (engine.h: rt_engine_dev_open,
 * rt_engine_dev_close). When the plan (or `cedar run --device cuda`)
 * places a flow on CUDA, the request state lives on that device
 * (runtime/device/devbind.h): the slabs sized for batch_max_requests request
 * slots of dev_tokens positions each, every KV pool given the pages one
 * slot's positions need times the slots (the largest source's count, for
 * every pool: one figure for the layout), the activations of the largest
 * graph of that length, the weights uploaded once, the CUDA graph cache
 * (graphs unless --cuda-graphs off), and the device model with its workers
 * (dev_scratch bytes of scratch each: rt_dev_ctx_open_model). The context hangs on model.dev, so
 * every executor binds the CUDA nodes' state there.
 *
 * Refused with a device home, each with the reason: the prefix cache and a
 * P/D split or layer stages (they read and write the host request's bytes
 * mid-run; the download step they would need is not wired into them yet).
 *
 * Test: tests/test_devbind.c (the same context over host memory); the CUDA
 * open runs only on a GPU (tests/gpu/run.sh). */
#include <string.h>

#include "base/check.h"
#include "base/log.h"
#include "runtime/device/devbind.h"
#include "runtime/engine/engine.h"
#include "runtime/dist/pd.h"
#include "scheduler/plan_place.h"

/* Positions one request slot holds when the caller does not say. */
#define RT_DEV_DEFAULT_TOKENS 4096
/* A worker's device scratch when the caller does not say: a node's
 * temporaries (its largest is a prefill chunk's MoE or its indexer's scores
 * over every entry); a node that needs more fails naming the bytes it asked
 * for, and --cuda-scratch gives them. */
#define RT_DEV_DEFAULT_SCRATCH ((int64_t)512 << 20)

static bool cuda_home(const struct plan *p) {
  return graph_place_of(p, GRAPH_PREFILL_CED).dev == GRAPH_DEV_CUDA ||
         graph_place_of(p, GRAPH_DECODE).dev == GRAPH_DEV_CUDA;
}

int rt_engine_dev_open(struct rt_engine *e, char *err, size_t err_len) {
  const struct plan *p = &e->plan;
  const struct rt_engine_opts *x = &e->opts;
  if (!cuda_home(p)) {
    if (x->cuda_graphs || x->dev_scratch) {
      const char *f = x->cuda_graphs ? "--cuda-graphs" : "--cuda-scratch";
      snprintf(err, err_len, "%s applies to a CUDA home, and plan %s runs on the CPU: add --device cuda "
               "(or place the plan on cuda), or drop %s", f, p->name, f);
      return CEDAR_EINVAL;
    }
    return 0;
  }
  if (e->cache || rt_pd_split(p) || plan_has_stages(p) || p->serving.place.n_ep_ranks) {
    snprintf(err, err_len, "plan %s on a CUDA home: %s reads the host request's state mid-run, and its download "
             "step from the device is not built yet; run without it", p->name,
             e->cache ? "the prefix cache" : "a P/D split or layer stages");
    return CEDAR_EUNSUPPORTED;
  }
  int64_t tokens = x->dev_tokens > 0 ? x->dev_tokens : RT_DEV_DEFAULT_TOKENS;
  int slots = p->serving.batch_max_requests > 0 ? p->serving.batch_max_requests : 1;
  struct rt_request shape = {0};
  if (rt_request_init(&shape, 0, p, e->pools, tokens)) {
    snprintf(err, err_len, "device state: out of memory for a request of %lld positions", (long long)tokens);
    return CEDAR_ENOMEM;
  }
  int64_t pages = 0;
  for (int l = 0; l < p->n_layers; l++)
    if (e->pools[l].entry_bytes) {
      int64_t n = (tokens + e->pools[l].page_entries - 1) / e->pools[l].page_entries;
      if (n > pages) pages = n;
    }
  size_t act = 0;
  struct graph g;
  struct graph_opts go = {.replay = -1};
  if (graph_build_prefill(&g, p, tokens < p->serving.prefill_chunk ? tokens : p->serving.prefill_chunk, &go, err,
                          err_len) == 0) {
    act = rt_dev_act_bytes(&g);
    graph_free(&g);
  }
  if (graph_build_decode(&g, p, tokens - 1, err, err_len) == 0) {
    size_t b = rt_dev_act_bytes(&g);
    act = b > act ? b : act;
    graph_free(&g);
  }
  struct rt_dev_layout L;
  int rc = pages * slots > INT32_MAX ? CEDAR_EINVAL : 0;
  if (rc) snprintf(err, err_len, "device state: %lld pages per pool is too many", (long long)(pages * slots));
  if (!rc) rc = rt_dev_layout_init(&L, p, e->pools, &shape, (int)(pages * slots), slots, act, err, err_len);
  rt_request_free(&shape);
  if (!rc) rc = rt_dev_ctx_open_cuda(&e->dev, &L, 0, &e->weights, x->cuda_graphs != 2, err, err_len);
  if (!rc)
    rc = rt_dev_ctx_open_model(e->dev, &e->model, (size_t)(x->dev_scratch > 0 ? x->dev_scratch : RT_DEV_DEFAULT_SCRATCH),
                               err, err_len);
  if (rc) {
    rt_dev_ctx_close(e->dev);
    e->dev = NULL;
  }
  if (!rc) e->model.dev = e->dev;
  return rc;
}

void rt_engine_dev_close(struct rt_engine *e) {
  if (e->dev && e->dev->graphs) { /* CEDAR_LOG=info: what tests/gpu/run.sh reads to see graphs did replay */
    struct rt_cugraph_stats gs = rt_cugraph_cache_stats(e->dev->graphs);
    for (int i = 0; i < e->dev->n_cw_sp; i++) /* the StarPU CUDA workers' own caches */
      if (e->dev->graphs_sp[i]) {
        struct rt_cugraph_stats w = rt_cugraph_cache_stats(e->dev->graphs_sp[i]);
        gs.captures += w.captures, gs.replays += w.replays, gs.eager_runs += w.eager_runs;
      }
    LOG_INFO("CUDA graphs (%s): %lld captures, %lld replays, %lld eager segment runs", e->dev->graphs_on ? "on" : "off",
             (long long)gs.captures, (long long)gs.replays, (long long)gs.eager_runs);
  }
  rt_dev_ctx_close(e->dev);
  e->dev = NULL;
  e->model.dev = NULL;
}

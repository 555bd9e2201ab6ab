/* dist.h: what the distribution features (P/D, layer stages, expert
 * parallel) add to the node dispatch, and the one check of whether a plan's
 * placement can run in this build and this process.
 *
 * rt_dist_register puts the features' node entries into the backend table
 * (runtime/node/backend.h): TRANSFER (P/D's state package, a stage
 * boundary's copy, expert dispatch and combine), MOE_SHARD, MOE_SUM and an
 * expert-parallel layer's route (MOE with GRAPH_F_EP). The dispatcher knows
 * none of them by name.
 *
 * rt_placement_check says, before anything runs, whether a plan's
 * serving.placement can run here: every node's device has a backend with
 * an entry for each op group its graphs hold, every rank exists, stages
 * and expert shards sit on CPU ranks mpirun gave. `cedar plan check` and
 * every command that runs a plan call it, so a placement that cannot run
 * is refused with the plan's file:line:col, never run somewhere else
 * without a word.
 *
 * Test: tests/test_backend_nodes.c, tests/test_place.c, tests/test_ep.c.
 */
#ifndef CEDAR_RUNTIME_DIST_DIST_H
#define CEDAR_RUNTIME_DIST_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "runtime/dist/expert_par.h"
#include "runtime/dist/pd.h"
#include "runtime/dist/pipeline.h"
#include "runtime/gen/generate.h"
#include "scheduler/graph.h"
#include "scheduler/plan.h"

/* Register the features' node entries (and the CUDA backend). Idempotent;
 * called by the placement check, the engine's open and each feature's
 * driver. */
void rt_dist_register(void);

/* What one request's distribution measured, returned to its caller (the
 * engine keeps its last request's: rt_engine.dist): P/D's transfer figures,
 * the layer stages' and the routed experts', each rank's gathered on the
 * reporting rank, and P's part of a P/D trace. A part is valid when its
 * flag is set (the trace when pd_trace.g is set). The drivers write into
 * it while the request runs: no module keeps a request's figures. */
struct rt_dist_report {
  bool pd, pipe, ep;
  struct rt_pd_stats pd_stats;
  struct rt_pipe_stats pipe_stats;
  struct rt_ep_stats ep_stats;
  struct rt_pd_trace pd_trace; /* owned: rt_dist_report_free */
};
/* Free what rep owns and zero it (a zeroed report: nothing). */
void rt_dist_report_free(struct rt_dist_report *rep);

/* One request through the driver of run (GRAPH_RUN_PD: rt_pd_generate;
 * GRAPH_RUN_RANKS: rt_pipe_generate), its figures into *rep (zeroed, or a
 * previous request's report: freed first). Returns what
 * the driver returns (RT_GEN_ELSEWHERE on a rank that does not report). */
int rt_dist_generate(enum graph_run run, const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r,
                     const int32_t *prompt, int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res,
                     struct rt_dist_report *rep, char *err, size_t err_len);

/* 0 when every flow, stage and expert shard of plan p can run here; else
 * CEDAR_EUNSUPPORTED with "file:line:col: serving.placement...: why; what
 * to set instead" and, when at is not NULL, the place in *at (file NULL:
 * a default value). */
int rt_placement_check(const struct plan *p, struct plan_mark *at, char *err, size_t err_len);

#endif

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

#include <stddef.h>

#include "scheduler/plan.h"

/* Register the features' node entries (and the CUDA backend). Idempotent;
 * called by the placement check, the engine's open and each feature's
 * driver. */
void rt_dist_register(void);

/* Ranks this process can play: under mpirun the ranks it gave; without,
 * one process plays the prefill and decode roles of ranks 0 and 1. */
int rt_ranks_available(void);

/* 0 when every flow, stage and expert shard of plan p can run here; else
 * CEDAR_EUNSUPPORTED with "file:line:col: serving.placement...: why; what
 * to set instead" and, when at is not NULL, the place in *at (file NULL:
 * a default value). */
int rt_placement_check(const struct plan *p, struct plan_mark *at, char *err, size_t err_len);

#endif

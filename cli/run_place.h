/* run_place.h: layer and expert placement in the commands' output:
 * `cedar plan cost --per-rank` (runtime/dist/place_cost.h) as a table or JSON,
 * `cedar plan diff --per-rank` side by side, and the pipeline section of
 * `cedar run` (runtime/dist/pipeline.h: stages, bytes moved, busy time and
 * bubbles per rank, the efficiency against the ideal), and its expert-parallel
 * section (cli/run_ep.c). */
#ifndef CEDAR_CLI_RUN_PLACE_H
#define CEDAR_CLI_RUN_PLACE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/gen/generate.h"
#include "runtime/dist/place_cost.h"
#include "runtime/model/state.h"
#include "runtime/dist/dist.h"
#include "scheduler/plan.h"

struct cJSON;

void place_cost_print(FILE *f, const struct plan *p, const struct rt_place_cost *c);
struct cJSON *place_cost_json(const struct plan *p, const struct rt_place_cost *c);
void place_cost_diff(FILE *f, const struct plan *pa, const struct rt_place_cost *a, const struct plan *pb,
                     const struct rt_place_cost *b);

/* The expert-parallel section (cli/run_ep.c, runtime/dist/expert_par.h). */
void run_ep_text(FILE *f, const struct plan *p, const struct rt_dist_report *rep);
void run_ep_json(struct cJSON *j, const struct plan *p, const struct rt_dist_report *rep);
/* The last pipeline request's prefill bubbles (under mpirun; zeros else). */
struct run_pipe_fig {
  int ranks, stages, chunks;
  double busy_s;          /* every rank's own non-transfer node time, summed */
  double rank_time_s;     /* the first stage's start to the last rank's end */
  double efficiency;      /* busy / (rank-time x ranks) */
  double bubble;          /* 1 - efficiency */
  double ideal, ideal_bubble; /* C / (C + S - 1) for C chunks through S equal stages; 1 - that */
  double decode_wall_s;   /* the longest rank's summed decode step time */
};
void run_pipe_figures(const struct plan *p, const struct rt_dist_report *rep, struct run_pipe_fig *f);
void run_pipe_text(FILE *f, const struct plan *p, const struct rt_dist_report *rep, int64_t decode_steps);
void run_pipe_json(struct cJSON *j, const struct plan *p, const struct rt_dist_report *rep);
/* Under mpirun with stages: the global entries of every rank's layers
 * (gathered on rank 0) replace this rank's own in b; nothing otherwise. */
void run_pipe_state_bytes(struct rt_state_bytes *b, const struct rt_dist_report *rep);
/* `cedar run --trace` on rank 0 of layer stages under mpirun: graph g's
 * nodes on the rank that ran each (a process per rank, a track per StarPU
 * worker), each transfer's arrival on its receiving rank's "StarPU-MPI
 * receives" track with a flow from the send. false (nothing added) when g
 * has no such record (runtime/dist/pipeline.h: rt_pipe_graph_trace). */
struct viz_trace;
bool run_pipe_trace_graph(struct viz_trace *t, const struct graph *g, int request);
/* A rank other than 0 writes its --dump to PATH.rankN (its layers' state,
 * the logits and tokens every rank has). */
int run_pipe_dump(const char *path, const struct rt_model *M, const struct rt_request *r,
                  const struct rt_gen_result *res, char *err, size_t err_len);

#endif

/* run_pd.h: the transfer figures `cedar run` prints for a plan whose
 * prefill and decode run on different homes (runtime/dist/pd.h): bytes by state
 * class against the plan's package, messages, time and overlap; and the
 * package `cedar plan cost` prints. */
#ifndef CEDAR_CLI_RUN_PD_H
#define CEDAR_CLI_RUN_PD_H

#include <stdint.h>
#include <stdio.h>

#include "runtime/dist/dist.h"
#include "scheduler/plan.h"

struct cJSON;
struct viz_trace;

void run_pd_text(FILE *f, const struct plan *p, const struct rt_dist_report *rep);
void run_pd_json(struct cJSON *j, const struct plan *p, const struct rt_dist_report *rep);
/* `cedar plan cost`: the P->D state package after a prompt of n tokens
 * (scheduler/plan_cost_pd.h), for a plan whose prefill and decode are on
 * different homes; nothing otherwise. */
void run_pd_cost_print(FILE *f, const struct plan *p, int64_t n);
void run_pd_cost_json(struct cJSON *j, const struct plan *p, int64_t n);
/* `cedar run --trace` on the decode rank of a P/D run under mpirun: the
 * trace becomes one process per rank (D's, which already holds D's graphs,
 * and P's prefill graph from the request's report, x) with a flow per
 * transfer from its send on P to its arrival on D. Nothing when the
 * request left no P part (x->g NULL). */
void run_pd_trace(struct viz_trace *t, const struct plan *p, const struct rt_pd_trace *x);

#endif

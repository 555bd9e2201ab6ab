/* run_pd.h: the transfer figures `cedar run` prints for a plan whose
 * prefill and decode run on different homes (runtime/pd.h): bytes by state
 * class against the plan's package, messages, time and overlap; and the
 * package `cedar plan cost` prints. */
#ifndef CEDAR_CLI_RUN_PD_H
#define CEDAR_CLI_RUN_PD_H

#include <stdint.h>
#include <stdio.h>

#include "scheduler/plan.h"

struct cJSON;

void run_pd_text(FILE *f, const struct plan *p);
void run_pd_json(struct cJSON *j, const struct plan *p);
/* `cedar plan cost`: the P->D state package after a prompt of n tokens
 * (scheduler/plan_cost_pd.h), for a plan whose prefill and decode are on
 * different homes; nothing otherwise. */
void plan_cost_pd_print(FILE *f, const struct plan *p, int64_t n);
void plan_cost_pd_json(struct cJSON *j, const struct plan *p, int64_t n);

#endif

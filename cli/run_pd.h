/* run_pd.h: the transfer figures `cedar run` prints for a plan whose
 * prefill and decode run on different homes (runtime/pd.h): bytes by state
 * class against the plan's package, messages, time and overlap. */
#ifndef CEDAR_CLI_RUN_PD_H
#define CEDAR_CLI_RUN_PD_H

#include <stdio.h>

#include "scheduler/plan.h"

struct cJSON;

void run_pd_text(FILE *f, const struct plan *p);
void run_pd_json(struct cJSON *j, const struct plan *p);

#endif

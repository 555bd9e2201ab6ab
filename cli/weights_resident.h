/* weights_resident.h: the line `cedar run`, `bench model` and `serve-sim`
 * print about the weights held in memory: resident bytes by format
 * (runtime/load/weights.h, weights_resident) beside `plan cost`'s
 * stored-format figure for the same plan (runtime/dist/place_cost.h). */
#ifndef CEDAR_CLI_WEIGHTS_RESIDENT_H
#define CEDAR_CLI_WEIGHTS_RESIDENT_H

#include <stdio.h>

#include "runtime/load/weights.h"
#include "scheduler/plan.h"

/* "resident weights: ... ; plan cost (stored formats): N" on f. */
void cli_weights_resident_line(FILE *f, const struct plan *p, const struct weights *w);

#endif

/* plan_dot.h: a plan's layer and bus-ownership graph as Graphviz DOT. */
#ifndef CEDAR_PLAN_DOT_H
#define CEDAR_PLAN_DOT_H

#include <stdio.h>

#include "scheduler/plan.h"

/* Write the graph; returns 0 or a negative cedar_status on a write error. */
int viz_plan_dot_write(const struct plan *p, FILE *f);

#endif

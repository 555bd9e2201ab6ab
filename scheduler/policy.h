/* policy.h: scheduling policy over a compiled graph: the order in which
 * ready nodes should run when workers have a choice. Executors map it onto
 * their runtime (runtime/exec/exec_starpu.c hands it to StarPU as task
 * priorities); the graph's edges alone decide what is ready, so a policy
 * changes speed, never results.
 *
 * Not here: the edges (graph.c), placement (graph.h: graph_place_of).
 * Test: tests/test_backend_nodes.c (check_policy: range and wavefront order).
 */
#ifndef CEDAR_SCHEDULER_POLICY_H
#define CEDAR_SCHEDULER_POLICY_H

#include "scheduler/graph.h"

/* Tiles of a graph: one more than the largest node chunk index. */
int sched_tiles(const struct graph *g);

/* Critical path first: node k's rank in [0, max], larger = more urgent,
 * scaled into [lo, hi] (a runtime's priority range; lo when hi <= lo). */
int sched_priority(const struct graph *g, int k, int tiles, int lo, int hi);

#endif

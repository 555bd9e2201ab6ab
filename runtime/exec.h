/* exec.h: executors of a graph (scheduler/graph.h) on one request.
 *
 * The direct executor (exec_direct.c) runs the nodes on the calling thread
 * in the graph's order, which is a topological order of its edges (the
 * compiler asserts every edge points backwards). It is the reference every
 * parallel executor is held to, bitwise.
 *
 * Activations and buses are allocated when first written and freed after
 * their last use (graph_data.last_use); the peak is reported. State data
 * objects are the request's (runtime/state.h); weights are the model's.
 * The HEAD nodes' logits are copied to the caller's buffer in node order.
 *
 * Not here: the graph (scheduler/), the op groups (runtime/model.h).
 * Test: tests/test_model.c, tests/cli/run.sh.
 */
#ifndef CEDAR_RUNTIME_EXEC_H
#define CEDAR_RUNTIME_EXEC_H

#include <stdint.h>

#include "runtime/model.h"
#include "scheduler/graph.h"

struct rt_exec_stats {
  int64_t nodes;
  int64_t token_layers;            /* positions x layers of the ATTN nodes run */
  double seconds;                  /* wall time of the whole graph */
  double op_seconds[GRAPH_OP_COUNT];
  int64_t op_nodes[GRAPH_OP_COUNT];
  int64_t act_peak_bytes;          /* activations and buses alive at once */
  int64_t scratch_peak_bytes;      /* the largest scratch one node used */
};

/* Progress callback: called after each node with (done, total). */
typedef void (*rt_progress_cb)(void *user, int done, int total);

struct rt_exec_out {
  float *logits;   /* (g->out_rows, vocab), caller-owned, or NULL */
  int64_t *pos;    /* (g->out_rows) the position of each row, or NULL */
};

/* Run g on request r. Returns 0, or a negative cedar_status with a message
 * when the request fails (pages exhausted): the request's state is then
 * unusable but the process and other requests are not affected. Stats are
 * accumulated into *st when not NULL. */
int rt_exec_direct(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, rt_progress_cb progress, void *user, char *err, size_t err_len);

#endif

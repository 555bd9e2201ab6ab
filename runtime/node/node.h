/* node.h: running one node of a graph (scheduler/graph.h) on a request,
 * as every executor does: bind the node's request state from its data
 * accesses, then call its op group's entry in the backend table of the
 * node's device (runtime/node/backend.h). What executors share: the stats
 * they count, the HEAD rows' destination, the per-node records of a trace.
 *
 * Not here: executors (runtime/exec/exec.h), the op groups
 * (runtime/model/model.h), device-side binding (runtime/device/devbind.h).
 * Test: tests/test_backend_nodes.c, and every model test through the
 * executors.
 */
#ifndef CEDAR_RUNTIME_NODE_NODE_H
#define CEDAR_RUNTIME_NODE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"
#include "scheduler/graph.h"

struct rt_exec_stats {
  int64_t nodes;
  int64_t token_layers;            /* positions x layers of the ATTN nodes run */
  double seconds;                  /* wall time of the whole graph */
  double op_seconds[GRAPH_OP_COUNT];
  int64_t op_nodes[GRAPH_OP_COUNT];
  int64_t act_peak_bytes;          /* activations and buses alive at once */
  int64_t scratch_peak_bytes;      /* the largest scratch one node used */
  double family_seconds[RT_FAM_COUNT]; /* time inside the ops, by op family (runtime/model/arena.h) */
};

/* Progress callback: called after each node with (done, total). */
typedef void (*rt_progress_cb)(void *user, int done, int total);

struct rt_exec_out {
  float *logits;   /* (g->out_rows, vocab), caller-owned, or NULL */
  int64_t *pos;    /* (g->out_rows) the position of each row, or NULL */
  /* Whose nodes run: with one_rank, only those of `rank` (graph_runs_on:
   * layer stages and expert shards under mpirun, where each process is one
   * rank); without, every node (one process plays every rank). */
  bool one_rank;
  int rank;
};

/* rt_run_node's code when the node's scratch (its arena) could not be had:
 * the process is out of memory or at its address-space limit. A runtime
 * status beside the cedar_status codes (negative; callers test non-zero). */
#define RT_ENOMEM_SCRATCH (-64)

/* The message of a node that failed with rc (rt_run_node's codes). */
void rt_node_error(const struct graph_node *nd, int rc, char *err, size_t err_len);

/* Bind the request state node nd works on from its data accesses
 * (exec_node.c): its ring, tail, and the KV sources it appends to and
 * reads, with the entry ranges the graph declares. */
void rt_bind_node(const struct graph *g, struct rt_request *r, const struct graph_node *nd, struct rt_bound *st);

/* One node on its buffers (buf: (g->n_data), the activation and bus
 * buffers by data id; other entries are not read) and its bound state (st,
 * or NULL: rt_bind_node's), through the backend of the node's device
 * (backend.h), as every executor runs it. out_row: a HEAD's first row in
 * out. Returns 0, CEDAR_ENOMEM (KV pages), RT_ENOMEM_SCRATCH (scratch) or
 * CEDAR_EUNSUPPORTED (no backend entry for the node's op group on its device). */
int rt_run_node(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                void *const *buf, const struct rt_bound *st, struct rt_exec_out *out, int64_t out_row,
                struct rt_arena *ar);
/* What a CUDA entry runs with besides the node (backend.h's rt_node_ctx
 * fields): the stream its kernels launch on (a cudaStream_t; StarPU's local
 * stream in a CUDA codelet, NULL for CUDA's default stream), the device
 * parameter block inside a graph segment (runtime/exec/devseg.h; NULL outside
 * one) and the device model, worker and token ids (struct rt_cuda_env:
 * runtime/device/devbind.h's rt_dev_env; NULL for a CPU node). */
struct rt_node_dev {
  void *stream;
  const void *params;
  const struct rt_cuda_env *cuda;
};

/* rt_run_node with the device side dv (NULL: none, as rt_run_node). */
int rt_run_node_dev(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                    void *const *buf, const struct rt_bound *st, struct rt_exec_out *out, int64_t out_row,
                    struct rt_arena *ar, const struct rt_node_dev *dv);

/* When and where one node ran, in microseconds since rt_starpu_init. From
 * StarPU's per-task profiling when it is on (rt_starpu_opts.profile), else
 * from the task's own clock (submit_us is then 0). */
struct rt_task_time {
  int worker;
  double submit_us, start_us, end_us;
};

#endif

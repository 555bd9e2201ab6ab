/* backend.h: the node backends, ggml-backend style: a table of op-group
 * functions per device kind, so a node runs through the entry its device
 * chooses (graph_node.place.dev) and a CUDA twin is one more table.
 *
 *   cpu   the op groups of runtime/model/model.c through exec_node.c.
 *   cuda  registered by the device home (runtime/device/cuda_backend.c:
 *         rt_device_register) in CUDA builds; without it every slot is
 *         NULL, so a node placed on cuda is refused, never run elsewhere.
 *
 * Features that add node kinds to a graph (P/D's state transfer, layer
 * stages, expert parallel: runtime/dist/) register their entries here when
 * they open (rt_backend_feature): the op group, the node flags that select
 * their nodes, and the function. The dispatcher (node.h: rt_run_node)
 * takes a node's feature entry before its backend's own and knows no
 * feature by name.
 *
 * Not here: binding a node's data (exec_node.c), executors
 * (runtime/exec/exec.h), whether a plan's placement can run here (one
 * check: runtime/dist/place_check.h).
 * Test: tests/test_backend_nodes.c.
 */
#ifndef CEDAR_RUNTIME_BACKEND_H
#define CEDAR_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"
#include "scheduler/graph.h"

struct rt_exec_out;
struct rt_cuda_model;
struct rt_cuda_worker;

/* What a CUDA entry needs besides the node (runtime/device/node_cuda.h). All three
 * are filled by the executor that runs CUDA nodes (cudastate's side:
 * exec_direct / exec_starpu through the engine's device state); a CUDA entry
 * refuses its node when ctx.cuda is NULL. */
struct rt_cuda_env {
  const struct rt_cuda_model *cm; /* filled by the engine: rt_cuda_model_open once per device */
  struct rt_cuda_worker *cw;      /* filled by the executor: one per stream that runs nodes (rt_cuda_worker_open) */
  const int32_t *tokens;          /* filled by the binder: the request's ids on the device, id p at [p] (r->tokens' copy) */
};

/* Everything one node runs on: the graph, the model, the request, the node,
 * its activation and bus buffers by data id, the request state bound from
 * its accesses, where HEAD rows go, and the worker's scratch arena. */
struct rt_node_ctx {
  const struct graph *g;
  const struct rt_model *M;
  struct rt_request *r;
  const struct graph_node *nd;
  void *const *buf;              /* (g->n_data); entries of other kinds are not read */
  const struct rt_bound *st;
  struct rt_exec_out *out;
  int64_t out_row;               /* HEAD: its first row in out */
  struct rt_arena *ar;
  /* CUDA entries: the stream to launch on (a cudaStream_t: StarPU's
   * starpu_cuda_get_local_stream() in a STARPU_CUDA_ASYNC codelet; NULL,
   * CUDA's default stream, from the direct executor). CPU entries: NULL. */
  void *stream;
  /* CUDA entries: the device model, worker and tokens (filled by the
   * executor, cudastate's side). CPU entries: NULL. */
  const struct rt_cuda_env *cuda;
  /* CUDA entries inside a graph segment (runtime/exec/devseg.h): the device
   * parameter block (struct rt_dev_params) the step's per-step values come
   * from: a captured graph replays with new values there, so kernels read
   * positions, ring slots and page ids from it, never from host arguments.
   * NULL outside a segment. Filled by the executors (cudastate). */
  const void *params;
};

typedef int (*rt_group_fn)(const struct rt_node_ctx *c);

struct rt_backend {
  const char *name;
  enum graph_device dev;
  rt_group_fn run[GRAPH_OP_COUNT]; /* NULL: this backend cannot run that op group */
  /* The reason the last entry of this backend refused its node on this
   * thread ("" none), for the node's message (rt_node_error); or NULL. */
  const char *(*why)(void);
};

extern const struct rt_backend rt_backend_cpu; /* exec_node.c */

/* The backend of a device kind: the CPU's, or the one registered for the
 * kind (rt_backend_set), else a table with no entries. */
const struct rt_backend *rt_backend_for(enum graph_device dev);

/* Register the backend of b->dev (the device home does for cuda). Idempotent. */
void rt_backend_set(const struct rt_backend *b);

/* A feature's entry: nodes of op group `op` on device kind `dev` whose flags
 * satisfy (flags & mask) == value run fn (mask 0: every node of the op
 * group). Two entries that could select the same node are a programming
 * error (asserted); registering the same (dev, op, mask, value) again
 * replaces fn. Thread-safe; entries are never removed. */
void rt_backend_feature(enum graph_device dev, enum graph_op op, uint32_t mask, uint32_t value, rt_group_fn fn);

/* The entry node nd runs through: its feature entry, else its device
 * backend's (NULL: none here). */
rt_group_fn rt_backend_entry(const struct graph_node *nd);

/* The op groups b and the features registered for b->dev have no entry
 * for, comma-separated, into list (at most len bytes; "" when none;
 * TRANSFER counted only when with_transfer). Returns how many. */
int rt_backend_missing(const struct rt_backend *b, bool with_transfer, char *list, size_t len);

#endif

/* backend.h: the node backends, ggml-backend style: a table of op-group
 * functions per device kind, so a node runs through the entry its device
 * chooses (graph_node.place.dev) and a CUDA twin is one more table.
 *
 *   cpu   the op groups of runtime/model.c through exec_node.c: every op
 *         group but TRANSFER (one process moves nothing between homes).
 *   cuda  every op group but TRANSFER (runtime/node_cuda.h: the groups'
 *         kernels/ launchers on ctx.stream over device-resident data; CUDA
 *         builds only, empty without CUDA); StarPU's codelets take a CUDA
 *         function for exactly the filled slots (exec_starpu.c).
 *
 * rt_placement_check says, before anything runs, whether a plan's
 * serving.placement can run in this build and this process: every node's
 * device must have a backend with an entry for each op group its graphs
 * hold, and every rank must exist. `cedar plan check` and every command
 * that runs a plan call it, so a placement that cannot run is refused with
 * the plan's file:line:col, never run somewhere else without a word.
 *
 * Not here: binding a node's data (exec_node.c), executors (exec.h).
 * Test: tests/test_backend_nodes.c.
 */
#ifndef CEDAR_RUNTIME_BACKEND_H
#define CEDAR_RUNTIME_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/model.h"
#include "scheduler/graph.h"

struct rt_exec_out;
struct rt_cuda_model;
struct rt_cuda_worker;

/* What a CUDA entry needs besides the node (runtime/node_cuda.h). All three
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
  /* CUDA entries inside a graph segment (runtime/devseg.h): the device
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
};

extern const struct rt_backend rt_backend_cpu;  /* exec_node.c */
extern const struct rt_backend rt_backend_cuda; /* backend.c: runtime/node_cuda.h's entries (CUDA builds) */

/* The backend of a device kind. */
const struct rt_backend *rt_backend_for(enum graph_device dev);

/* How many ranks this process can run: 1 until StarPU-MPI is wired in. */
int rt_ranks_available(void);

/* The op groups b has no entry for, comma-separated, into list (at most
 * len bytes; "" when none; TRANSFER counted only when with_transfer).
 * Returns how many. */
int rt_backend_missing(const struct rt_backend *b, bool with_transfer, char *list, size_t len);

/* 0 when graph nodes can run on CUDA device 0 here: the build has CUDA,
 * the CUDA runtime sees a device, and rt_backend_cuda has an entry for
 * every op group. Else CEDAR_EUNSUPPORTED with the first reason in err
 * ("no CUDA device: cudaErrorNoDevice: ...", "no CUDA entry for op groups
 * embed, attn, ..."). Used by `cedar run --device cuda`, `cedar env` and
 * rt_placement_check. */
int rt_cuda_ready(char *err, size_t err_len);

/* 0 when every flow of plan p can run here; else CEDAR_EUNSUPPORTED with
 * "file:line:col: serving.placement...: why; what to set instead" and,
 * when at is not NULL, the place in *at (file NULL: a default value). */
int rt_placement_check(const struct plan *p, struct plan_mark *at, char *err, size_t err_len);

#endif

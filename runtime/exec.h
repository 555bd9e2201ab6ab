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
 * The StarPU executor (exec_starpu.c) runs the same graph as StarPU tasks,
 * one per node, on CPU workers: the graph's edges are the only ordering it
 * submits (starpu_task_declare_deps_array; implicit sequential consistency
 * off), and its outputs and request state are bitwise those of the direct
 * executor under every scheduler (docs/runtime.md, "The StarPU executor").
 * StarPU is started once per process (rt_starpu_init) and stopped at the
 * end (rt_starpu_shutdown).
 *
 * Not here: the graph (scheduler/), the op groups (runtime/model.h).
 * Test: tests/test_model_*.c, tests/test_exec_starpu.c, tests/cli/run.sh,
 * tests/cli/trace.sh.
 */
#ifndef CEDAR_RUNTIME_EXEC_H
#define CEDAR_RUNTIME_EXEC_H

#include <stdbool.h>
#include <stddef.h>
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
  double family_seconds[RT_FAM_COUNT]; /* time inside the ops, by op family (runtime/arena.h) */
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
 * parameter block inside a graph segment (runtime/devseg.h; NULL outside
 * one) and the device model, worker and token ids (struct rt_cuda_env:
 * runtime/devbind.h's rt_dev_env; NULL for a CPU node). */
struct rt_node_dev {
  void *stream;
  const void *params;
  const struct rt_cuda_env *cuda;
};

/* rt_run_node with the device side dv (NULL: none, as rt_run_node). */
int rt_run_node_dev(const struct graph *g, const struct rt_model *M, struct rt_request *r, const struct graph_node *nd,
                    void *const *buf, const struct rt_bound *st, struct rt_exec_out *out, int64_t out_row,
                    struct rt_arena *ar, const struct rt_node_dev *dv);

/* The direct executor when M->dev is set and g runs on its home
 * (exec_dev.c, runtime/devbind.h): the request's state bound in the device
 * slabs, activations in the device's activation slab, decode segments
 * through the CUDA graph cache when it is on. rt_exec_direct calls it. */
int rt_exec_direct_dev(const struct graph *g, const struct rt_model *M, struct rt_request *r,
                       struct rt_exec_out *out, struct rt_exec_stats *st, rt_progress_cb progress, void *user,
                       char *err, size_t err_len);

/* ---- the StarPU executor (exec_starpu.c) ------------------------------ */

struct rt_starpu_opts {
  int workers;          /* CPU workers; <= 0: StarPU's choice (STARPU_NCPU, else one per core) */
  const char *sched;    /* policy: eager, lws, dmda, prio, ...; NULL: StarPU's (STARPU_SCHED, else lws) */
  bool profile;         /* StarPU per-task profiling: submit/start/end times for traces */
};

/* Start StarPU once for this process: CPU workers only (no CUDA or OpenCL
 * workers yet), one scratch arena per worker. Options are checked before
 * any StarPU call (an unknown policy lists the known ones). Returns 0,
 * CEDAR_EINVAL (bad option, or StarPU already started) or
 * CEDAR_EUNSUPPORTED (starpu_init failed, or fewer workers than asked),
 * with a message. */
int rt_starpu_init(const struct rt_starpu_opts *o, char *err, size_t err_len);
/* Stop StarPU and free the arenas; a no-op when not started. */
void rt_starpu_shutdown(void);
bool rt_starpu_running(void);
/* The policy and worker count in force, and a worker's name ("CPU 0"). */
const char *rt_starpu_sched(void);
int rt_starpu_workers(void);
void rt_starpu_worker_name(int worker, char *buf, size_t len);
/* Now, on the clock of struct rt_task_time (microseconds since rt_starpu_init); 0 when StarPU is not up. */
double rt_starpu_now_us(void);

/* When and where one node ran, in microseconds since rt_starpu_init. From
 * StarPU's per-task profiling when it is on (rt_starpu_opts.profile), else
 * from the task's own clock (submit_us is then 0). */
struct rt_task_time {
  int worker;
  double submit_us, start_us, end_us;
};

/* Run g on request r as StarPU tasks, as rt_exec_direct does on one thread
 * (same outputs, same state, bitwise). times (g->n_node), when not NULL,
 * receives each node's record. progress is called from this thread while
 * the tasks run. Fails with CEDAR_EINVAL when StarPU is not started. */
int rt_exec_starpu(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, struct rt_task_time *times, rt_progress_cb progress, void *user,
                   char *err, size_t err_len);

/* The StarPU data behind the executor (exec_starpu_data.c): copy page id of
 * pool, or layer's SWA ring slots of r, through its data handle (acquired
 * for reading, so StarPU brings it home first) into dst; the bytes copied,
 * or CEDAR_EINVAL when StarPU is not running or that buffer has no handle
 * yet. And how many handles are registered now: KV pages (once per pool
 * slot) and request buffers (once per request). */
int64_t rt_starpu_page_read(struct rt_kv_pool *pool, int32_t id, void *dst, size_t cap);
int64_t rt_starpu_ring_read(struct rt_request *r, int layer, void *dst, size_t cap);
void rt_starpu_handle_counts(int64_t *pages, int64_t *request_bufs);

#endif

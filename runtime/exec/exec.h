/* exec.h: executors of a graph (scheduler/graph.h) on one request.
 *
 * The direct executor (exec_direct.c) runs the nodes on the calling thread
 * in the graph's order, which is a topological order of its edges (the
 * compiler asserts every edge points backwards). It is the reference every
 * parallel executor is held to, bitwise.
 *
 * Activations and buses are allocated when first written and freed after
 * their last use (graph_data.last_use); the peak is reported. State data
 * objects are the request's (runtime/model/state.h); weights are the model's.
 * The HEAD nodes' logits are copied to the caller's buffer in node order.
 *
 * The StarPU executor (exec_starpu.c) runs the same graph as StarPU tasks,
 * one per node, on StarPU's workers: the graph's edges are the only ordering it
 * submits (starpu_task_declare_deps_array; implicit sequential consistency
 * off), and its outputs and request state are bitwise those of the direct
 * executor under every scheduler (docs/runtime.md, "The StarPU executor").
 * StarPU is started once per process (rt_starpu_init) and stopped at the
 * end (rt_starpu_shutdown).
 *
 * Not here: the graph (scheduler/), the op groups (runtime/model/model.h).
 * Test: tests/test_model_*.c, tests/test_exec_starpu.c, tests/cli/run.sh,
 * tests/cli/trace.sh.
 */
#ifndef CEDAR_RUNTIME_EXEC_EXEC_H
#define CEDAR_RUNTIME_EXEC_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"
#include "runtime/node/node.h"
#include "scheduler/graph.h"


/* Run g on request r. Returns 0, or a negative cedar_status with a message
 * when the request fails (pages exhausted): the request's state is then
 * unusable but the process and other requests are not affected. Stats are
 * accumulated into *st when not NULL. */
int rt_exec_direct(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, rt_progress_cb progress, void *user, char *err, size_t err_len);

/* The direct executor when M->dev is set and g runs on its home
 * (exec_dev.c, runtime/device/devbind.h): the request's state bound in the device
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

/* Start StarPU once for this process: its CPU workers, and its CUDA workers
 * when the build and the plan's device home have them (docs/cuda.md), one
 * scratch arena per worker. Options are checked before
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

/* Run g on request r as StarPU tasks, as rt_exec_direct does on one thread
 * (same outputs, same state, bitwise). times (g->n_node), when not NULL,
 * receives each node's record. progress is called from this thread while
 * the tasks run. Fails with CEDAR_EINVAL when StarPU is not started. */
int rt_exec_starpu(const struct graph *g, const struct rt_model *M, struct rt_request *r, struct rt_exec_out *out,
                   struct rt_exec_stats *st, struct rt_task_time *times, rt_progress_cb progress, void *user,
                   char *err, size_t err_len);

/* The StarPU data behind the executor (exec_starpu_data.c): copy page i
 * of r's KV source layer, or layer's SWA ring slots of r, through its data
 * handle (the page list: exec_starpu_pages.c; acquired for reading, so
 * StarPU brings it home first) into dst; the bytes copied, or CEDAR_EINVAL
 * when StarPU is not running or that buffer has no handle yet. And how many
 * handles are registered now: KV page lists (one per request and source)
 * and the other request buffers (once per request). */
int64_t rt_starpu_page_read(struct rt_request *r, int layer, int page, void *dst, size_t cap);
int64_t rt_starpu_ring_read(struct rt_request *r, int layer, void *dst, size_t cap);
void rt_starpu_handle_counts(int64_t *pages, int64_t *request_bufs);

#endif

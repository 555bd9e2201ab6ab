/* exec_starpu_data.h: the StarPU executor's data handles (internal to
 * exec_starpu*.c). Every buffer a node touches is StarPU data over its true
 * memory and size, so StarPU can move it between memory nodes and
 * StarPU-MPI can send it:
 *
 *   request      per request, registered at its first graph and kept until
 *                rt_request_free: each KV source's page list (one handle
 *                over all the pages its sequence holds, however many:
 *                exec_starpu_pages.c), each layer's SWA ring (slots, positions),
 *                each ratio > 1 source's compressor tail, the token
 *                history, the kept encoder outputs (rows, positions);
 *   activations  per graph: residual streams, mHC pre, Engram rows,
 *   and buses    logits, Top-K and candidate pools, allocated at submission
 *                and freed after the graph.
 *
 * A task's buffers are these handles, in the order of the node's data
 * accesses (struct sp_task_map says where each access's handles start);
 * a KV access is its source's page list, which covers the pages its entry
 * ranges bind (graph_use e_read, e_w0..e_w1), in R mode even where appended
 * to (add_pages says why: the graph orders appends against readers;
 * StarPU's exclusion would serialize them and its 1.3 leaks on that path).
 * Weights are not task buffers: they are read-only, bound through the
 * model on the CPU and uploaded once to a CUDA home (rt_dev_weights_get).
 * rt_starpu_shutdown releases every handle still registered.
 */
#ifndef CEDAR_RUNTIME_EXEC_STARPU_DATA_H
#define CEDAR_RUNTIME_EXEC_STARPU_DATA_H

#include <starpu.h>

#include "runtime/exec/exec.h"

/* Where node k's handles are in its task: for use u, buffers
 * [first[u], first[u] + count[u]). */
struct sp_task_map {
  int *first, *count;
  int n_buffers;
  int kv_pages_first, kv_pages_count; /* a device state's pages of the KV source it reads (-1 none) */
  int kv_list;                        /* the page list of the KV source it reads on the host (-1 none) */
};

/* Handles of request r (registered on first use). */
struct sp_req_handles;

/* Fill task t's handles and modes for node nd of graph g on request r,
 * given the per-graph activation handles act (n_data; NULL for state).
 * tw: the request's twin when nd's home is a device (runtime/device/devbind.h):
 * its state handles are then the device state's, on the CUDA memory node
 * (rt_dev_node_regions, in that order; token ids and encoder outputs stay
 * the host's and are not task buffers), else NULL.
 * Returns the map (arrays owned by the caller: sp__task_map_free). */
struct rt_dev_twin;
void sp__task_buffers(struct starpu_task *t, const struct graph *g, const struct graph_node *nd, struct rt_request *r,
                      starpu_data_handle_t *act, const struct rt_dev_twin *tw, struct sp_task_map *map);
void sp__task_map_free(struct sp_task_map *map);

/* The host-memory stand-in of a device state (runtime/device/devbind.h): its
 * pages, rings, positions and tails registered on main RAM, once, if not
 * yet. */
struct rt_dev_ctx;
void sp__dev_register(struct rt_dev_ctx *d);

/* The page list of seq (exec_starpu_pages.c): one handle in main RAM over
 * every page seq holds, now and after later appends; and the sequence
 * behind a task's interface of one. */
struct rt_kv_seq;
starpu_data_handle_t sp__pages_register(const struct rt_kv_seq *seq);
const struct rt_kv_seq *sp__pages_seq(void *data_interface);

/* Release every handle still registered (rt_starpu_shutdown). */
void sp__release_all(void);

#endif

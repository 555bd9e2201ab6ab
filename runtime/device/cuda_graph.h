/* cuda_graph.h: CUDA graphs for a decode step's layer segments (issue 15).
 *
 * A segment is the kernels of one run of layers for one step shape,
 * enqueued by a callback on a stream. Its per-step values (positions,
 * page-table entries, ring slots: struct rt_dev_params) are not kernel
 * arguments: kernels read them from a device-side parameter block, so a
 * graph captured once per (segment, shape) stays valid for every later
 * step and is never re-instantiated.
 *
 *   eager   copy the step's parameters into the block on the task's stream,
 *           then call the callback on that stream;
 *   graph   the same copy, then cudaGraphLaunch of the segment's
 *           executable graph on the task's stream. The first time a key is
 *           seen the callback is captured on a stream of this cache's own
 *           (cudaStreamBeginCapture, relaxed mode: other threads may make
 *           unsafe calls such as cudaMalloc while it captures), instantiated
 *           once, and kept.
 *
 * Both modes run the same kernels with the same arguments on the same data,
 * so they give the same bits (tests/gpu/test_gpu_graph.cu checks it, and
 * the time ratio). In a StarPU CUDA codelet the task's stream is
 * starpu_cuda_get_local_stream() and the codelet is STARPU_CUDA_ASYNC: the
 * launch returns at once and StarPU waits on the stream.
 *
 * What a capture bakes in: the kernels, their launch shapes, and every
 * address the callback passes (its arg, the buffers, the key's parameter
 * block). So a key's buffers must stay where they are for the cache's life
 * (the device state's slabs are allocated once: runtime/device/devstate.h), and
 * anything else that changes per step goes through the parameter block.
 *
 * One cache per stream that replays (one per StarPU CUDA worker): the block
 * of a key is rewritten by each replay in stream order, so two streams
 * replaying one key at once would race on it.
 *
 * CPU-only builds: rt_cugraph_cache_open refuses ("built without CUDA").
 */
#ifndef CEDAR_RUNTIME_CUDA_GRAPH_H
#define CEDAR_RUNTIME_CUDA_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What identifies one captured graph: the segment (e.g. first layer of the
 * run) and the step's shape (positions, top-k width, ... whatever changes
 * launch dimensions). Values that change per step at a fixed shape go to
 * the parameter block instead. */
struct rt_cugraph_key {
  int32_t segment;
  int32_t shape[11];
};

/* Enqueue the segment's kernels on stream (a cudaStream_t), reading
 * per-step values from params (device memory, param_bytes long). Returns 0
 * or a cedar_status; it must not synchronize (capture forbids it). */
typedef int (*rt_segment_fn)(void *stream, const void *params, void *arg);

struct rt_cugraph_cache;

/* The per-step values a captured graph reads instead of baking them in
 * (below). Fixed size, so one layout serves every plan. */
#define RT_DEV_PARAM_MAX_PAGES 1024
struct rt_dev_params {
  int64_t pos;                   /* first position of the step */
  int32_t n;                     /* positions in the step */
  int32_t request;               /* request slot */
  int32_t ring_slot[8];          /* SWA slot of each position (pos + i) mod window, i < 8 */
  int32_t n_pages;               /* valid entries of page[] */
  int32_t page[RT_DEV_PARAM_MAX_PAGES]; /* page-table entries of the KV source the segment reads */
  /* The segment's KV node before the step (runtime/device/devbind.h,
   * rt_dev_params_fill): its compressor tail's pending rows and the
   * position of the first, the entries committed in the source it appends
   * to (where the next one goes), and the entries it may read. */
  int32_t tail_count;
  int64_t tail_pos0;
  int64_t w_entries;
  int64_t r_entries;
  int64_t r0;                    /* the SWA ring's first valid position for the step (max of the ring's and the node's) */
};

struct rt_cugraph_stats {
  int64_t captures, replays, eager_runs;
};

/* A cache on CUDA device dev whose parameter blocks hold param_bytes.
 * Returns 0 or CEDAR_EUNSUPPORTED (no CUDA build, no device; err says why). */
int rt_cugraph_cache_open(struct rt_cugraph_cache **out, int dev, size_t param_bytes, char *err, size_t err_len);
void rt_cugraph_cache_close(struct rt_cugraph_cache *c);

/* Run segment k on stream with host parameters hp (param_bytes), as a graph
 * (captured on first use) or eagerly. Asynchronous: returns once enqueued.
 * hp may be reused as soon as this returns. Returns 0 or a cedar_status
 * with err filled (a CUDA error names the call). */
int rt_cugraph_run(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k, rt_segment_fn fn, void *arg,
                 const void *hp, void *stream, bool graph, char *err, size_t err_len);

/* The device parameter block of key k (allocated on first use); NULL on
 * failure. Eager runs of k use the same block. */
void *rt_cugraph_params(struct rt_cugraph_cache *c, const struct rt_cugraph_key *k);

struct rt_cugraph_stats rt_cugraph_cache_stats(const struct rt_cugraph_cache *c);

#ifdef __cplusplus
}
#endif

#endif

/* devseg.h: a decode step's layer segments for CUDA graphs (issue 15), host
 * logic in every build: which nodes of a graph form a segment, the key a
 * segment is captured under, and the host metadata a replayed segment's
 * nodes leave (a replay runs no host code, so the executor applies it).
 *
 *   segments  a maximal run of consecutive nodes of one layer whose op
 *             groups are the layer's own (ENGRAM, ATTN, MOE, DEC_KV) in a
 *             decode graph, with at most one node that uses a KV source
 *             (the block holds one node's tail and counts), at most 8
 *             positions, and no ring reset (its floor comes from the node);
 *             EMBED and the Engram row gather (they index the token ids by
 *             position), HEAD, TRANSFER, KEEP_XE and REPLAY_IN run eagerly,
 *             one at a time.
 *   key       (struct rt_cugraph_key) segment = the first node's layer;
 *             shape = positions, the KV pages the segment's parameter
 *             block lists (the CUDA attention sizes its reads by them:
 *             rt_dev_listed_pages), the segment's node count, the graph's
 *             node count and activation bytes (so the activation slab's
 *             offsets it bakes in are the same), the first op, the request
 *             slot (its ring, tail and page-table addresses), the ring's
 *             floor r0 and the nodes' flags. Everything else that changes
 *             per step is in the block (rt_dev_params_fill): the position,
 *             ring slots, page ids, the tail's count and first position,
 *             the entries committed and readable. The CUDA entries read
 *             them there inside a segment (node_cuda_attn.cu: positions,
 *             the compressor's step with a device-side emit, the indexer
 *             clamped by the device count), so a segment is captured once
 *             per key and replayed for every later step of that key, which
 *             is every step until its source's pages grow (every
 *             page_entries x ratio positions).
 *   advance   the metadata a node leaves, computed from the graph alone:
 *             n_entries of the source it appends to = the graph's e_w1;
 *             its tail's pos0 and count from the node's last position (a
 *             tail's groups start at multiples of its ratio); a ring reset's
 *             r0. tests/test_devbind.c holds it to what each node did.
 *
 * Test: tests/test_devbind.c.
 */
#ifndef CEDAR_RUNTIME_DEVSEG_H
#define CEDAR_RUNTIME_DEVSEG_H

#include "runtime/device/cuda_graph.h"
#include "runtime/device/devbind.h"

/* For each node k of g: seg_end[k] > k when a segment [k, seg_end[k])
 * starts at k, 0 otherwise (inside a segment, or run eagerly). Returns the
 * number of segments (0 for a graph that is not a decode step). */
int rt_dev_segments(const struct graph *g, int *seg_end /* (g->n_node) */);

/* The node of segment [k0, k1) whose step fills the parameter block: its
 * first node with a KV source, else k0. */
int rt_dev_segment_lead(const struct graph *g, int k0, int k1);

/* The key of segment [k0, k1) with its parameter block P (rt_dev_params_fill
 * of the lead node). */
struct rt_cugraph_key rt_dev_segment_key(const struct graph *g, int k0, int k1, const struct rt_dev_params *P);

/* The metadata node nd leaves on the host request and the twin (t may be
 * NULL): see the header. */
void rt_dev_node_advance(struct rt_dev_twin *t, struct rt_request *r, const struct graph *g,
                         const struct graph_node *nd);

struct rt_exec_out;
struct rt_arena;

/* One segment [k0, k1) of g to run for request r through its twin tw in
 * dv, on buffers buf (the activation slab's addresses, which a capture
 * bakes in), with the scratch arena ar and CUDA worker cw (NULL on the
 * stand-in). failed: the first failing node + 1, with its status rc. */
struct rt_dev_seg {
  const struct graph *g;
  const struct rt_model *M;
  struct rt_request *r;
  const struct rt_dev_ctx *dv;
  struct rt_dev_twin *tw;
  void *const *buf;
  struct rt_exec_out *out;
  struct rt_arena *ar;
  struct rt_cuda_worker *cw;
  int k0, k1;
  int failed, rc;
};

/* Run segment S on stream (a cudaStream_t; NULL: CUDA's default stream):
 * its parameter block from the lead node's step (rt_dev_params_fill), then
 * through cache (captured once per key and replayed when graph, else the
 * same kernels eagerly), or, on the stand-in (no device model, no cache),
 * the nodes in place with the block on the host. A step the block cannot
 * hold, or a CUDA home without a cache for this stream, runs the nodes one
 * by one without a block (their entries take host arguments). Then the
 * metadata every node leaves (rt_dev_node_advance), since a replay runs no
 * host code. Returns 0, or the failing node's status with err naming it
 * (rt_node_error), or a graph cache error. The direct executor (exec_dev.c)
 * and the StarPU executor's segment task (exec_starpu.c) both run this. */
int rt_dev_seg_run(struct rt_dev_seg *S, struct rt_cugraph_cache *cache, bool graph, void *stream, char *err,
                   size_t err_len);

#endif

/* devseg.h: a decode step's layer segments for CUDA graphs (issue 15), host
 * logic in every build: which nodes of a graph form a segment, the key a
 * segment is captured under, and the host metadata a replayed segment's
 * nodes leave (a replay runs no host code, so the executor applies it).
 *
 *   segments  a maximal run of consecutive nodes of one layer whose op
 *             groups are ENGRAM or MOE in a decode graph: the layer's own
 *             groups whose CUDA entries read nothing that changes from one
 *             step to the next (their kernels' arguments are weights,
 *             activation-slab addresses and shapes). Everything else runs
 *             eagerly, one node at a time: EMBED and the Engram row gather
 *             (they index the token ids by position), HEAD, TRANSFER,
 *             KEEP_XE, REPLAY_IN, and ATTN and DEC_KV. Those two take the
 *             step's values as host arguments today: the positions, the
 *             compressor tail's count and first position, the entries
 *             committed in the source they read and append to (grid sizes
 *             and offsets of their kernels); a graph captured at one step
 *             would replay that step's values. They join segments when
 *             their kernels read those values from the parameter block
 *             (docs/cuda.md, "What is left").
 *   key       (struct rt_graph_key) segment = the first node's layer;
 *             shape = positions, the KV pages the segment's parameter
 *             block lists, the segment's node count, the graph's node
 *             count and activation bytes (so the activation slab's offsets
 *             it bakes in are the same). Everything else that changes per
 *             step (position, ring slots, page ids) is in the block
 *             (rt_dev_params_fill): a segment is captured once per key and
 *             replayed for every later step of that key, which is every
 *             step until its source's pages grow (every page_tokens
 *             positions).
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

#include "runtime/cuda_graph.h"
#include "runtime/devbind.h"

/* For each node k of g: seg_end[k] > k when a segment [k, seg_end[k])
 * starts at k, 0 otherwise (inside a segment, or run eagerly). Returns the
 * number of segments (0 for a graph that is not a decode step). */
int rt_dev_segments(const struct graph *g, int *seg_end /* (g->n_node) */);

/* The node of segment [k0, k1) whose step fills the parameter block: its
 * first node with a KV source, else k0. */
int rt_dev_segment_lead(const struct graph *g, int k0, int k1);

/* The key of segment [k0, k1) with its parameter block P (rt_dev_params_fill
 * of the lead node). */
struct rt_graph_key rt_dev_segment_key(const struct graph *g, int k0, int k1, const struct rt_dev_params *P);

/* The metadata node nd leaves on the host request and the twin (t may be
 * NULL): see the header. */
void rt_dev_node_advance(struct rt_dev_twin *t, struct rt_request *r, const struct graph *g,
                         const struct graph_node *nd);

#endif

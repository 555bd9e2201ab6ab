/* expert_par.h: expert parallelism: the routed experts of a layer on
 * several ranks (serving.placement.experts; docs/placement.md).
 *
 * Sharding: with experts: {ranks: [r_0, ..., r_{R-1}]} and E routed
 * experts (R divides E, plan_place.c checks), shard s holds the contiguous
 * block of experts [s*E/R, (s+1)*E/R) and lives on rank r_s
 * (plan_expert_rank). The router, the selection and the shared expert run
 * on the rank that owns the layer's MoE node (its stage's rank; rank 0 of
 * a plan without stages): that rank holds the token rows, so routing there
 * ships each row only to the shards its selection names, and the shared
 * expert's output is the first term of the sum it combines. Every rank
 * loads the whole model today (router and shared expert replicated; the
 * other shards' experts too, unused).
 *
 * One MoE node of such a layer (runtime/model.c: rt_moe):
 *   1. the owner routes (op_moe_scores, op_moe_select) and computes the
 *      shared expert (op_moe_shared), exactly as op_moe_forward;
 *   2. dispatch: for each shard, a packet of the rows that selected at
 *      least one of its experts (each row once) and the (expert, row,
 *      weight) pairs, expert-major, rows ascending: the grouping
 *      op_moe_forward uses;
 *   3. each shard runs its experts over its pairs (op_moe_ffn, one batch
 *      per expert) and returns one output row per pair (combine);
 *   4. the owner adds the outputs to the shared expert's in ascending
 *      expert id, rows ascending: op_moe_forward's order. op_linear is
 *      row-invariant (ops/basic.h), so each output row is the bits the
 *      single-process op computes, and so is the sum.
 *
 * Transport: one process (no mpirun): every shard runs here, from the same
 * packet (the same code path, the same bits). Under mpirun (runtime/
 * pipeline.c drives the request): the MoE node of an expert-parallel layer
 * runs on its owner and on every shard rank (rt_ep_serves); the owner
 * posts a header and the packet to each remote shard and a receive for its
 * outputs, all through StarPU-MPI (pd_mpi.c), then runs its own shard; a
 * shard rank receives, computes and sends back. Every wait has the
 * deadline CEDAR_PD_DEADLINE_S: a dead or stuck peer fails the request
 * (the job then ends, pipeline.c), never a hang. The ranks meet the
 * exchanges in graph order, which the direct executor keeps; the StarPU
 * executor is refused under mpirun (a worker blocked in one exchange could
 * wait for a task the other rank has not reached). NCCL is not used here.
 *
 * Figures (rt_ep_last_stats, gathered on rank 0): rows and expert-rows
 * each rank computed, its expert seconds, dispatch bytes (token rows, and
 * the routing metadata apart) and combine bytes; the same in one process
 * (counted as if remote), so both runs can be compared.
 * Test: tests/test_ep.c (one process), tests/cli/ep_mpi.sh (mpirun).
 */
#ifndef CEDAR_RUNTIME_EXPERT_PAR_H
#define CEDAR_RUNTIME_EXPERT_PAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/arena.h"
#include "runtime/generate.h"
#include "runtime/model.h"
#include "scheduler/graph.h"

#define RT_EP_MAX_RANKS 64

struct rt_ep_rank {
  int64_t rows;          /* token rows its experts computed (a row once per node, however many of its experts) */
  int64_t expert_rows;   /* (token, expert) pairs it computed */
  double expert_s;       /* seconds in its experts' FFNs */
  int64_t dispatch_bytes;      /* token rows it sent to other ranks' shards (owner) */
  int64_t dispatch_meta_bytes; /* headers and (expert, row, weight) pairs with them */
  int64_t combine_bytes;       /* expert output rows it sent back (shard) */
  int64_t messages;
};

struct rt_ep_stats {
  bool mpi;              /* through StarPU-MPI (else one process) */
  int shards, layers;    /* expert shards; expert-parallel layers */
  int64_t passes;        /* token rows through expert-parallel MoE nodes (positions x layers, replay included) */
  struct rt_ep_rank rank[RT_EP_MAX_RANKS];
};

/* Layer l's routed experts are split (serving.placement.experts). */
bool rt_ep_layer(const struct plan *p, int l);

/* Before a request (rt_pipe_generate): checks what cannot run (the StarPU
 * executor across ranks), resets the figures, and turns the messages on
 * when mpi (this request runs on ranks). 0 or CEDAR_EUNSUPPORTED + err. */
int rt_ep_begin(const struct plan *p, const struct rt_gen_opts *o, bool mpi, char *err, size_t err_len);
/* Rank 0 gathers every rank's figures (after a request that succeeded). */
int rt_ep_gather(char *err, size_t err_len);
/* After StarPU-MPI let go of the messages (pd_mpi_stop): free them. */
void rt_ep_end(void);

/* Node nd runs on rank `rank` as a shard of another rank's MoE node. */
bool rt_ep_serves(const struct graph *g, const struct graph_node *nd, int rank);

/* The MoE sublayer's FFN for the owner: y, sel, wt as op_moe_forward
 * gives them, with the routed experts on their shards. 0 or CEDAR_EIO
 * (a peer failed; logged). */
int rt_ep_forward(const struct rt_model *M, const struct graph_node *nd, float *y, int32_t *sel, float *wt,
                  const float *x, struct rt_arena *ar);
/* This rank is a shard (not the owner) of MoE node nd. */
bool rt_ep_helper(const struct rt_model *M, const struct graph_node *nd);
/* On a shard rank: receive nd's packet, compute, send the outputs back. */
int rt_ep_serve(const struct rt_model *M, const struct graph_node *nd, struct rt_arena *ar);

const struct rt_ep_stats *rt_ep_last_stats(void);

#endif

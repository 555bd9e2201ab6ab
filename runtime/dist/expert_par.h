/* expert_par.h: expert parallelism: the routed experts of a layer on
 * several ranks (serving.placement.experts; docs/placement.md).
 *
 * Sharding: with experts: {ranks: [r_0, ..., r_{R-1}]} and E routed
 * experts (R divides E, plan_place.c checks), shard s holds the contiguous
 * block of experts [s*E/R, (s+1)*E/R) and lives on rank r_s
 * (plan_expert_rank). The router, the selection and the shared expert run
 * on the rank that owns the layer (its stage's rank; the flow's rank
 * without stages): that rank holds the token rows, so routing there ships
 * each row only to the shards its selection names, and the shared
 * expert's output is the first term of the sum it combines.
 *
 * The graph (scheduler/graph_ep.c) splits each MoE node of such a layer:
 *   1. L.moe (MOE, GRAPH_F_EP, the owner: rt_ep_route): the mHC mix and
 *      norm, routing and the shared expert (op_moe_scores, op_moe_select,
 *      op_moe_shared: op_moe_forward's steps) into the owner's state, and a
 *      dispatch packet per shard: the rows that selected at least one of
 *      its experts (each row once) and the (expert, row, weight) pairs,
 *      expert-major, rows ascending (op_moe_forward's grouping);
 *   2. dispatch: a TRANSFER node (GRAPH_F_EP) per shard on another rank,
 *      owner -> shard (rt_ep_transfer_node);
 *   3. L.moe_shardS (MOE_SHARD, shard S's rank: rt_ep_shard): its experts
 *      over its pairs (op_moe_ffn, one batch per expert), one output row
 *      per pair;
 *   4. combine: a TRANSFER node back, shard -> owner;
 *   5. L.moe_sum (MOE_SUM, the owner: rt_ep_sum): the outputs added to
 *      the shared expert's in ascending expert id, rows ascending
 *      (op_moe_forward's order), then the mHC update. op_linear is
 *      row-invariant (ops/basic.h), so each output row is the bits the
 *      single-process op computes, and so is the sum.
 * So the all-to-all is in the DAG (`cedar graph show`, `cedar view`), and
 * its transfers are nodes with edges like the pipeline's.
 *
 * Transport: one process (no mpirun): every node runs here and a transfer
 * copies the used part of its packet (the same code path, the same bits).
 * Under mpirun (runtime/dist/pipeline.c drives the request): each rank runs the
 * nodes placed on it and both ends of its transfers: the sender posts the
 * packet's header, then its used bytes, through StarPU-MPI (runtime/comm/comm_mpi.c),
 * detached; the receiver waits for the header (it sizes the body), then
 * the body. Tags count the transfers with each peer in graph order. Every
 * wait has the deadline CEDAR_PD_DEADLINE_S: a dead or stuck peer fails
 * the request (the job then ends, pipeline.c), never a hang.
 *
 * Executors: one process runs the split graph on either executor. Under
 * mpirun the direct executor runs it (graph order on every rank); the
 * StarPU executor is refused there: a receiving TRANSFER is a task that
 * waits for its message (as the pipeline's are), and dispatch and combine
 * go both ways between two ranks, so with one worker a rank can wait in a
 * receive whose sender is held behind a receive on the other rank. Running
 * it there needs the receives as StarPU-MPI detached receives into the
 * activations' handles (the consumers ordered by the handle, no worker
 * waiting), with sizes known before the message (a packet's bound, or a
 * size message first). Not built.
 *
 * NCCL (runtime/dist/ep_nccl.c): a dispatch or combine whose two homes are
 * CUDA memory on two devices of one rank would be an NCCL send/receive
 * pair (runtime/comm/nccl.h), shipping the packet's bound. Compiled in the CUDA
 * build and its refusals tested; never run (no GPU here) and called by no
 * executor yet: no placement puts expert homes on two GPUs of one rank
 * (shards are ranks; CUDA stages are refused).
 *
 * Figures (into the caller's struct rt_ep_stats from rt_ep_begin to
 * rt_ep_end, gathered on rank 0): rows and expert-rows
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

#include "runtime/model/arena.h"
#include "runtime/node/backend.h"
#include "runtime/gen/generate.h"
#include "runtime/model/model.h"
#include "runtime/load/weights.h"
#include "scheduler/graph.h"

#define RT_EP_MAX_RANKS 64

struct rt_ep_rank {
  int64_t rows;          /* token rows its experts computed (a row once per node, however many of its experts) */
  int64_t expert_rows;   /* (token, expert) pairs it computed */
  double expert_s;       /* seconds in its experts' FFNs */
  int64_t dispatch_bytes;      /* token rows it sent to other ranks' shards (owner) */
  int64_t dispatch_meta_bytes; /* headers (GRAPH_EP_HDR_BYTES) and (expert, row, weight) pairs with them */
  int64_t combine_bytes;       /* expert output rows it sent back (shard; not their headers) */
  int64_t messages;            /* StarPU-MPI messages it sent: a header and a body per packet (the body when
                                  not empty; a dispatch always has its pairs) */
  int64_t held_expert_bytes;   /* routed-expert weights the rank holds, stored formats (rt_place_held_experts;
                                  under mpirun only) */
};

struct rt_ep_stats {
  bool mpi;              /* through StarPU-MPI (else one process) */
  int shards, layers;    /* expert shards; expert-parallel layers */
  int64_t passes;        /* token rows through expert-parallel MoE nodes (positions x layers, replay included) */
  struct rt_ep_rank rank[RT_EP_MAX_RANKS];
};


/* Before a request (rt_pipe_open): checks what cannot run (the StarPU
 * executor across ranks), resets the figures *fig (the caller's: the node
 * entries count into it until rt_ep_end; a plan without routed experts on
 * ranks counts nothing) and turns the messages on when mpi (this request
 * runs on ranks). 0 or CEDAR_EUNSUPPORTED + err. */
int rt_ep_begin(const struct plan *p, const struct rt_gen_opts *o, bool mpi, struct rt_ep_stats *fig, char *err,
                size_t err_len);
/* Rank 0 gathers every rank's figures (after a request that succeeded). */
int rt_ep_gather(char *err, size_t err_len);
/* After StarPU-MPI let go of the messages (comm_stop): free them; the
 * figures are the caller's alone from here. */
void rt_ep_end(void);


/* The op groups of the split (exec_node.c's CPU backend): the owner's
 * route (MOE with GRAPH_F_EP), a shard (MOE_SHARD), the owner's sum
 * (MOE_SUM), and a dispatch or combine (TRANSFER with GRAPH_F_EP). 0, or
 * CEDAR_EIO (a peer failed, or a packet is not this node's; logged). */
int rt_ep_route(const struct rt_node_ctx *c);
int rt_ep_shard(const struct rt_node_ctx *c);
int rt_ep_sum(const struct rt_node_ctx *c);
int rt_ep_transfer_node(const struct rt_node_ctx *c);


/* NCCL for a dispatch or combine between two GPUs of one rank
 * (runtime/dist/ep_nccl.c; compiled, never run). wanted: nd is an expert
 * TRANSFER whose source and copy are CUDA memory of two devices of one
 * rank. open: the NCCL pair for its two devices (CEDAR_EINVAL when not
 * wanted, CEDAR_EUNSUPPORTED with why: no CUDA, no NCCL, a device
 * missing). submit: the send and receive tasks on the StarPU handles of
 * the packet and its copy, the packet's bound in bytes. */
struct comm_nccl_pair;
bool rt_ep_nccl_wanted(const struct graph *g, const struct graph_node *nd);
int rt_ep_nccl_open(struct comm_nccl_pair **pair, const struct graph *g, const struct graph_node *nd, char *err,
                    size_t err_len);
int rt_ep_nccl_submit(struct comm_nccl_pair *pair, const struct graph *g, const struct graph_node *nd,
                      void *src_handle, void *dst_handle, char *err, size_t err_len);

/* The weights rank `rank` holds (runtime/load/weights.h: weights_part): of an
 * expert-parallel layer's routed-expert stacks only its shard's experts
 * (none on a rank without a shard); with stages, another layer's routed
 * experts only on its stage's rank; every other tensor whole (the
 * accounting puts a layer's other tensors on its stage alone: not yet). Returns
 * &e->part, or NULL when the plan splits no experts. The engine loads a
 * rank's weights through it under mpirun. */
struct rt_ep_part {
  struct weights_part part;
  const struct plan *p;
  int rank;
};
const struct weights_part *rt_ep_part_init(struct rt_ep_part *e, const struct plan *p, int rank);
/* After the engine loaded this process's weights: notes the routed-expert
 * bytes they hold, the held_expert_bytes of this rank's figures. */
void rt_ep_note_weights(const struct plan *p, const struct weights *w);

/* Register expert parallel's node entries (runtime/node/backend.h): the
 * owner's route (MOE with GRAPH_F_EP), dispatch and combine (TRANSFER with
 * GRAPH_F_EP), each shard's experts (MOE_SHARD) and the sum (MOE_SUM).
 * Idempotent; rt_ep_begin calls it. */
void rt_ep_register(void);

#endif

/* graph.h: the graph IR cedar executes, and the compiler that builds it from
 * a plan (DESIGN.md: plan -> graph -> executors).
 *
 * A graph is a list of nodes in a valid execution order (the order the
 * compiler emitted them: a sequential program), explicit dependency edges
 * between them, and the data objects they touch:
 *
 *   node   one op group on one tile: (request, layer, position range).
 *          Kinds (enum graph_op): embed, Engram row gather, Engram
 *          injection, attention sublayer, MoE sublayer, decoder-global
 *          projection (CED), keeping the encoder outputs (CED: the
 *          request's ring of the last replay.decoder positions, which a
 *          snapshot saves for the next prompt's decoder replay), replay
 *          input, head (logits).
 *   data   weights (per layer and model-wide), request state (a layer's SWA
 *          ring, a source's compressor tail, a source's global KV pool,
 *          token history), buses (a chunk's Top-K and candidate pool) and
 *          activations (a chunk's residual streams, mHC pre, Engram rows,
 *          logits). Each has a kind, a name and a size.
 *   access every node lists the data it reads, writes, reads and writes, or
 *          appends to (GRAPH_APPEND: the global KV pools are append-only, so
 *          an append waits for the previous append only, never for earlier
 *          readers: the entries they read never change).
 *   edges  derived once by the compiler from the accesses in program order
 *          (read after write, write after read, write after write; appends
 *          as above) and then stored: executors submit exactly these edges
 *          and never infer their own.
 *
 * The compiler reads the plan, never hard-coded layer numbers. Flows
 * (docs/model.md s6): cold prefill with CED (encoder layers chunk by chunk,
 * decoder KV sources projected from the encoder output chunk by chunk,
 * then the decoder's bounded replay of the last min(N, replay) positions),
 * dense prefill (every chunk through every layer), and one decode step.
 * Prefill and decode on different homes (SPEC 7): the prefill streams each
 * KV source's new entries after every tile and hands the state over at
 * the end; with serving.placement.replay: decode it stops before the
 * decoder replay, which D runs (graph_opts.at_decode).
 *
 * Not here: executing nodes (runtime/exec/exec.h), state (runtime/model/state.h).
 * Test: tests/test_graph.c (ctest -R graph).
 */
#ifndef CEDAR_SCHEDULER_GRAPH_H
#define CEDAR_SCHEDULER_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "scheduler/plan.h"

/* Op groups, in one list: the enum and the names traces and `cedar graph
 * show` print come from it. */
#define GRAPH_OPS(X)             \
  X(EMBED, "embed")              \
  X(ENGRAM_GATHER, "engram_rows") \
  X(ENGRAM, "engram")            \
  X(ATTN, "attn")                \
  X(MOE, "moe")                  \
  X(DEC_KV, "dec_kv")            \
  X(KEEP_XE, "keep_xe")          \
  X(REPLAY_IN, "replay_in")      \
  X(HEAD, "head")                \
  X(TRANSFER, "transfer")        \
  X(MOE_SHARD, "moe_shard")      \
  X(MOE_SUM, "moe_sum")

enum graph_op {
#define X(e, s) GRAPH_##e,
  GRAPH_OPS(X)
#undef X
  GRAPH_OP_COUNT
};

enum graph_data_kind { GRAPH_WEIGHTS = 0, GRAPH_STATE, GRAPH_BUS, GRAPH_ACT };

/* Where a node runs and where a data object lives: a rank (an MPI process;
 * 0 when one process runs) and a device on it. A data object's home is a
 * memory node: host memory for cpu, the device's memory for cuda:N. The
 * compiler sets both from serving.placement (graph_place_of); executors
 * refuse what they cannot run (runtime/node/backend.h: rt_placement_check). */
enum graph_device { GRAPH_DEV_CPU = 0, GRAPH_DEV_CUDA };
struct graph_place {
  int rank;
  enum graph_device dev;
  int dev_id;          /* cuda:N; 0 for cpu */
};
enum graph_access { GRAPH_R = 1, GRAPH_W = 2, GRAPH_RW = 3, GRAPH_APPEND = 4 };
enum graph_flow { GRAPH_PREFILL_CED = 0, GRAPH_PREFILL_DENSE, GRAPH_DECODE };

/* What a state data object is (for executors binding it to a request). */
enum graph_state_kind {
  GRAPH_ST_NONE = 0,
  GRAPH_ST_RING,
  GRAPH_ST_TAIL,
  GRAPH_ST_KV,
  GRAPH_ST_TOKENS,
  GRAPH_ST_XE, /* the request's ring of encoder outputs (rt_request.xe) */
};

struct graph_data {
  enum graph_data_kind kind;
  enum graph_state_kind state; /* GRAPH_STATE only */
  int layer;                   /* -1 when model-wide or per chunk */
  int chunk;                   /* -1 when not per chunk */
  int64_t bytes;               /* activations and buses: the buffer size; state/weights: 0 (owned elsewhere) */
  int64_t a0;                  /* activations per tile: the tile's first position */
  bool pre;                    /* activations: a tile's mHC pre (hc floats a position), not its streams */
  int last_use;                /* the last node touching it (executors free activations there) */
  struct graph_place home;     /* the memory node it lives on */
  unsigned char ep;            /* expert parallel (graph_ep.c): enum graph_ep_role, 0 when none */
  short ep_shard;              /* GRAPH_EP_DISPATCH / GRAPH_EP_OUT: the shard */
  char name[32];
};

/* Expert-parallel activations (graph_ep.c; runtime/dist/expert_par.h lays them
 * out): the owner's routing state between route and sum, a shard's
 * dispatch packet, a shard's outputs. A packet or an output begins with a
 * GRAPH_EP_HDR_BYTES header saying how many of its bytes are used; its
 * size (graph_data.bytes) is the most a tile can need. */
enum graph_ep_role { GRAPH_EP_NONE = 0, GRAPH_EP_STATE, GRAPH_EP_DISPATCH, GRAPH_EP_OUT };
#define GRAPH_EP_HDR_BYTES 64

/* One data access of a node. For a source's global KV (GRAPH_ST_KV) the
 * compiler also says which entries: the node may read entries [0, e_read)
 * (0: it reads none) and appends [e_w0, e_w1) (empty unless APPEND). These
 * are the entries committed before it in program order, so an executor
 * binds exactly the pages they live on and a reader never sees an entry
 * appended after it (docs/runtime.md, "Data a node binds"). */
struct graph_use {
  int data;
  enum graph_access mode;
  int64_t e_read, e_w0, e_w1;
};

/* The buses an ATTN node touches (graph_node.bus). */
enum graph_bus_slot { GRAPH_TOPK_OUT = 0, GRAPH_POOL_OUT, GRAPH_TOPK_IN, GRAPH_POOL_IN };

/* Node flags. */
#define GRAPH_F_WRITE_KV 1u    /* ATTN of a KV source: append this tile's entries from its own input */
#define GRAPH_F_RESTART 2u     /* sublayer mixes with its own mHC pre from its own input (pairing: v4) */
#define GRAPH_F_PRE_NEXT 4u    /* sublayer carries its own pre to the next one (pairing: v41) */
#define GRAPH_F_BUILD_POOL 8u  /* ATTN of a pool-building layer */
#define GRAPH_F_REPLAY 16u     /* tile of a decoder bounded replay */
#define GRAPH_F_STAGE 64u      /* TRANSFER between layer stages (graph_place.c; runtime/dist/pipeline.h), not P->D */
#define GRAPH_F_EP 128u        /* MOE: the owner's route of an expert-parallel layer (graph_ep.c); TRANSFER: a
                                  dispatch packet or shard output (runtime/dist/expert_par.h) */
#define GRAPH_F_RING_RESET 32u /* first replay tile: the layer's ring starts empty at r0 (SPEC 5.2: decoder
                                  SWA is rebuilt by every prefill's replay, never carried over) */

struct graph_node {
  enum graph_op op;
  int layer;         /* -1 for embed / head / replay_in */
  int chunk;         /* tile index inside its phase */
  int64_t a;         /* first absolute position */
  int n;             /* positions */
  int64_t r0;        /* SWA replay start the tile's attention uses */
  unsigned flags;
  int x;             /* the residual-stream activation the node works on (-1 none) */
  int aux;           /* ATTN/MOE: the tile's mHC pre; ENGRAM_GATHER/ENGRAM: the rows e; HEAD: the logits */
  int bus[4];        /* ATTN: enum graph_bus_slot -> data id, -1 when unused */
  int pre;           /* HEAD, DEC_KV, KEEP_XE: the tile's carried mHC pre (-1 none) */
  struct graph_place place; /* where it runs; TRANSFER: the sending side (xfer_dst's home is the receiver) */
  int slot0, n_slots;       /* the request slots it works on: [slot0, slot0 + n_slots); one request today */
  int xfer_src, xfer_dst;   /* TRANSFER: the data object moved, and its copy at the destination home */
  /* ATTN of an index layer under model.indexer.key_slot: vendor (docs/model.md
   * s3.2): the KV source whose Indexer-K its rows score, -1 = its own KV
   * source's. [0]: rows at a position p with p + 1 odd, [1]: p + 1 even (the
   * plan allows ratios 1 and 2 there, so a source publishes at a decode
   * position by its parity); a prefill tile's rows all read one. The node
   * reads (graph_use) each source named here; entries past its own source's
   * are never scored: the rows see min(both counts). */
  int key_src[2];
  struct graph_use *use;
  int n_use;
  int *dep;          /* nodes this one waits for (all earlier in order) */
  int n_dep;
  double flops;      /* estimate, for traces */
  char name[40];     /* "L3.attn c2", "embed c0", ... */
};

struct graph {
  const struct plan *plan;
  enum graph_flow flow;
  struct graph_place place;   /* where the flow runs: serving.placement.prefill or .decode */
  struct graph_place peer;    /* prefill: where decode runs (transfers go there); decode: = place */
  int n_transfer;             /* TRANSFER nodes (prefill with peer != place) */
  int n_act_transfer;         /* TRANSFER nodes of activations between layer stages (graph_place.c) */
  int n_kv_transfer;          /* TRANSFER nodes of a KV source's entries to a reader stage (graph_place.c) */
  int n_ep_transfer;          /* TRANSFER nodes of expert dispatch and combine (graph_ep.c), in n_act_transfer too */
  int64_t n_prompt;  /* prefill: prompt length; decode: the position run */
  int chunk;         /* positions per tile */
  int64_t replay;    /* CED: decoder replay length R */
  int64_t hit;       /* prefix hit (0 = cold) */
  int64_t encoder_start; /* first position the encoder (every layer when dense) runs: hit, or its replay start */
  struct graph_node *node;
  int n_node, cap_node;
  struct graph_data *data;
  int n_data, cap_data;
  int64_t token_layers; /* sum over ATTN nodes of their positions */
  int64_t out_rows;     /* logits rows the HEAD nodes produce, in node order */
};

/* Compile options (zero-initialise, then set): chunk <= 0 takes
 * serving.prefill_chunk; replay < 0 takes serving.replay.decoder (which
 * defaults to the window). */
struct graph_opts {
  int chunk;
  int64_t replay;
  bool all_logits;   /* logits of every position that runs through every layer, not only the last */
  int64_t hit;       /* prefix hit: positions [0, hit) have their global entries cached (0 = cold);
                        a multiple of every source's ratio */
  bool swa_hit;      /* the encoder's SWA rings and tails at `hit` are restored from a snapshot;
                        otherwise the encoder replays [hit - replay_encoder, hit) with global writes off */
  bool has_replay_encoder;  /* else serving.replay.encoder (the window by default) */
  int64_t replay_encoder;
  bool at_decode;    /* build the flow at serving.placement.decode, with no transfers: D's decoder replay
                        after a P/D handoff (serving.placement.replay: decode; with hit = n, swa_hit) */
};

/* Build the graph of one flow for one request: prefill of n tokens (CED or
 * dense by the plan's serving.ced), or one decode step at opts->start.
 * Returns 0, or CEDAR_EINVAL with a message (n < 1, a bad chunk). */
int graph_build_prefill(struct graph *g, const struct plan *p, int64_t n, const struct graph_opts *o, char *err,
                        size_t err_len);
int graph_build_decode(struct graph *g, const struct plan *p, int64_t pos, char *err, size_t err_len);
/* A verify step (speculative decoding, docs/speculative.md): the decode flow on
 * the n consecutive positions [pos, pos + n) in one tile, every layer, the
 * logits of all n rows. n = 1 is graph_build_decode. 1 <= n <= window. */
int graph_build_verify(struct graph *g, const struct plan *p, int64_t pos, int n, char *err, size_t err_len);
/* The most rows a verify step at pos may take: the window, and under
 * model.indexer.key_slot: vendor with a ratio-2 source at most pos + 1 (a
 * row at p scores floor((p + 1) / 2) of the previous step's slot keys, of
 * which the steps before pos have committed pos; docs/model.md s3.2). */
int graph_verify_rows_max(const struct plan *p, int64_t pos);
void graph_free(struct graph *g);

const char *graph_op_name(enum graph_op op);
const char *graph_flow_name(enum graph_flow f);
const char *graph_access_name(enum graph_access a);

/* Human-readable listing (`cedar graph show`), and Graphviz DOT. */
void graph_print(const struct graph *g, FILE *f, bool verbose);
void graph_dot(const struct graph *g, FILE *f);

/* The placement of a flow from serving.placement. */
struct graph_place graph_place_of(const struct plan *p, enum graph_flow f);
bool graph_place_eq(struct graph_place a, struct graph_place b);
/* "rank 0 cpu", "rank 1 cuda:0" into buf. */
const char *graph_place_str(struct graph_place pl, char *buf, size_t len);

/* Layer stages (serving.placement.stages, graph_place.c): nodes placed by
 * their layer's stage, activation TRANSFER nodes at the boundaries; run by
 * the compiler before the edges are derived. Nothing without stages. */
void graph__place_stages(struct graph *g);
/* key_slot: vendor: the KV sources other than its own whose Indexer-K index
 * layer l scores on decode steps, src[0] at p with p + 1 odd, src[1] even
 * (-1: its own; both -1 under own_source). graph_place.c keeps their
 * entries on the ranks of the stages that read them. */
void graph__key_sources(const struct plan *p, int l, int src[2]);
/* The edges from the accesses in program order, and each data's last use
 * (graph_edges.c); the compiler's last pass. */
void graph__finish(struct graph *g);
/* Whether node nd reads KV source `layer` only for the Indexer-K the
 * vendor's slot holds (key_src), not as its own KV source. */
static inline bool graph_reads_keys_of(const struct graph_node *nd, int layer) {
  return layer >= 0 && (nd->key_src[0] == layer || nd->key_src[1] == layer);
}
/* Expert parallel (serving.placement.experts, graph_ep.c): each MoE node of
 * an expert-parallel layer becomes the owner's route (MOE, GRAPH_F_EP), a
 * MOE_SHARD node per shard on its rank and the owner's MOE_SUM; the stage
 * pass then ships packets and outputs between ranks as TRANSFER nodes.
 * Called by graph__place_stages first. */
void graph__split_experts(struct graph *g);
/* Node nd has work on `rank`: it runs there, or it is a stage transfer
 * whose copy lands there (the receiving side; a P->D transfer's receiver
 * takes its message outside the graph: runtime/dist/pd.h). */
bool graph_runs_on(const struct graph *g, const struct graph_node *nd, int rank);

/* What runs a request of the plan g was compiled from, read off g's nodes:
 * one home (GRAPH_RUN_ONE); prefill and decode on two homes, with the
 * state package's TRANSFER nodes (GRAPH_RUN_PD, possibly with stages or
 * expert shards inside each role); or one graph shared by ranks, with
 * stage-boundary or expert TRANSFER nodes or expert shards (GRAPH_RUN_RANKS).
 * The engine chooses its driver by it (runtime/engine/engine.c). */
enum graph_run { GRAPH_RUN_ONE = 0, GRAPH_RUN_PD, GRAPH_RUN_RANKS };
enum graph_run graph_run_kind(const struct graph *g);

/* Counts for tests and reports. */
int graph_count_op(const struct graph *g, enum graph_op op, int layer /* -1 any */);

#endif

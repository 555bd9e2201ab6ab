/* pipeline.h: one request across layer stages on several ranks
 * (serving.placement.stages; docs/placement.md).
 *
 * The compiler places every node on its stage's rank and puts activation
 * TRANSFER nodes at the stage boundaries (scheduler/graph_place.c). Every
 * rank compiles the same graphs and runs them with its usual executor;
 * rt_pipe_bind makes the request's options run only this rank's nodes
 * (rt_gen_opts.one_rank: its own nodes and the transfers that touch it):
 *
 *   - one process (no mpirun): every node runs here, a transfer is a copy
 *     of the buffer (the same graph as under mpirun, the same bits);
 *   - under mpirun: the sending rank posts the activation through
 *     StarPU-MPI (runtime/comm/comm_mpi.c) and goes on with the next chunk (the wavefront:
 *     stage 0 runs chunk c+1 while stage 1 runs chunk c); the receiving
 *     rank waits for it, failing the request when nothing arrives for
 *     CEDAR_PD_DEADLINE_S seconds (a dead or stuck peer), never hanging.
 *     After each graph the rank of the head sends the logits to every
 *     other rank, so each samples the same next token from the same seed.
 *
 * Rank 0 prints the report; the figures (busy time over rank time per
 * rank, bytes sent) are gathered there.
 * Expert parallelism (serving.placement.experts) rides on the same driver:
 * a plan with experts on ranks runs here even without stages, and the MoE
 * nodes of its layers also run on the shard ranks (runtime/dist/expert_par.h).
 * Test: tests/test_place.c (one process), tests/cli/pp_mpi.sh (mpirun).
 */
#ifndef CEDAR_RUNTIME_PIPELINE_H
#define CEDAR_RUNTIME_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/node/backend.h"
#include "runtime/exec/exec.h"
#include "runtime/dist/expert_par.h"
#include "runtime/gen/generate.h"

#define RT_PIPE_MAX_RANKS 64

struct rt_pipe_rank {
  double prefill_busy_s, prefill_wall_s; /* the node time of its own non-transfer nodes; the graph's wall time */
  double prefill_t0, prefill_t1;         /* its prefill graph's start and end (CLOCK_MONOTONIC: one host's clock) */
  double decode_busy_s, decode_wall_s;   /* summed over the decode steps */
  int64_t bytes_sent, messages;
  int64_t act_prefill, act_decode, kv_prefill, kv_decode; /* of which activations / KV entries, prefill / decode */
  int64_t kv_entries, kv_entry_bytes, kv_page_bytes; /* the global entries its layers hold after the request */
};

struct rt_pipe_stats {
  bool mpi;                       /* the ranks were processes under mpirun (else one process) */
  int ranks, stages, chunks;      /* prefill chunks of the request */
  struct rt_pipe_rank rank[RT_PIPE_MAX_RANKS];
  int64_t act_bytes_prefill;      /* activation bytes the prefill's transfers moved (all ranks' on rank 0) */
  int64_t act_bytes_decode;       /* summed over the decode steps */
  int64_t kv_bytes_prefill;       /* a KV source's entries shipped to reader stages, prefill */
  int64_t kv_bytes_decode;        /* the same, summed over the decode steps */
};

/* Where one request's figures go: its caller's (rt_dist_report's parts,
 * the engine's), written while the request runs and complete when it
 * returns (rank 0 has every rank's); nothing of them stays in this module.
 * pipe and ep are required (rt_pipe_open). */
struct rt_pd_trace; /* pd.h */
struct rt_pipe_figs {
  struct rt_pipe_stats *pipe;
  struct rt_ep_stats *ep;
  struct rt_pd_trace *pd_trace; /* P/D's trace of P's part (rt_pd_generate), or NULL: not kept */
};

/* This process runs the stages of plan p as ranks of an MPI job. */
bool rt_pipe_multi(const struct plan *p);

/* One request through the stages (rt_generate's flow), its figures into
 * figs. Returns 0 on the reporting rank (0), 1 on the others, or a
 * negative status with err. */
int rt_pipe_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                     int64_t n, const struct rt_gen_opts *o, const struct rt_pipe_figs *figs, struct rt_gen_result *res,
                     char *err, size_t err_len);

/* For a driver that runs its own graphs across the ranks (runtime/
 * pd_stage.c: P/D with stages or experts): rt_pipe_open makes the ranks
 * meet and starts StarPU-MPI under mpirun (nothing in one process), the
 * routed experts of ep_plan's placement on (rt_ep_begin), the request's
 * figures counted into figs until rt_pipe_close; every graph run
 * until rt_pipe_close runs with the options rt_pipe_bind sets (this rank's
 * nodes, then rt_pipe_after_graph), in the same order on every rank. rt_pipe_close gathers the figures (r's
 * global entries counted by p's stages), meets every rank within the
 * deadline and stops StarPU-MPI; it returns rc, or 0 on rank 0 and 1 on
 * the others. rt_pipe_xchg sends / receives n bytes with rank peer, tag
 * below 0xffff0 (its own space per graph), within the deadline. */
int rt_pipe_open(const struct plan *p, const struct plan *ep_plan, const struct rt_gen_opts *o, int64_t n,
                 const struct rt_pipe_figs *figs, char *err, size_t err_len);
int rt_pipe_close(const struct plan *p, const struct rt_request *r, int rc, char *err, size_t err_len);
int rt_pipe_xchg(void *buf, size_t n, int peer, int tag, bool send);
/* rt_pipe_xchg within dl seconds instead of the deadline. */
int rt_pipe_xchg_dl(void *buf, size_t n, int peer, int tag, bool send, double dl);
/* The rank a wait of this request gave up on first (it named that rank in
 * its failure), or -1. */
int rt_pipe_suspect(void);
/* Name rank as the suspect when none is yet (a verdict from rank 0). */
void rt_pipe_set_suspect(int rank);
/* Rank 0: n bytes from every other rank r into bufs + r * n, the receives
 * posted at once, until each has arrived or is named dead (suspect: this
 * rank's rt_pipe_suspect; suspect_of: the rank an arrived message names,
 * -1 for a success, -2 for a failure naming none), or dl seconds passed
 * with no failure (failed: this rank's own), or 2 dl seconds; got[r] says
 * which arrived. Returns how many did not (their receives stay posted:
 * rt_pipe_close ends the job). */
int rt_pipe_gather(void *bufs, size_t n, int tag, double dl, bool *got, int suspect, bool failed,
                   int (*suspect_of)(const void *msg));

/* After rt_pipe_open: o runs this rank's nodes and meets the other ranks
 * after every graph (rt_gen_opts.one_rank, .after_graph); nothing in one
 * process. */
void rt_pipe_bind(struct rt_gen_opts *o);
/* The TRANSFER entry of a stage boundary (registered by rt_dist_register). */
int rt_pipe_transfer_node(const struct rt_node_ctx *c);
/* After graph g ran (rc its result): every rank gets the logits; the
 * transfer's own message replaces err when one failed. times: the nodes'
 * times on this rank (StarPU executor with a trace asked for), or NULL. */
int rt_pipe_after_graph(const struct graph *g, struct rt_exec_out *out, const struct rt_exec_stats *st,
                        const struct rt_task_time *times, int rc, char *err, size_t err_len);

/* A trace of layer stages under mpirun (--trace, StarPU executor): after
 * each graph every rank sends its nodes' times to rank 0, where the graph
 * that just ran (g, until the next one) has rec[(r * n_node + k) * 4 + i]:
 * i = 0 the worker rank r ran node k on (-1: not r's node), 1 and 2 its
 * start and end, 3 when a transfer's message arrived on its receiving rank
 * r (0 otherwise); times in microseconds on this process's struct
 * rt_task_time clock (one host: one CLOCK_MONOTONIC). NULL elsewhere. */
struct rt_pipe_trace {
  const struct graph *g;
  int ranks, n_node;
  const double *rec;
};
const struct rt_pipe_trace *rt_pipe_graph_trace(const struct graph *g);

/* Register the stage boundary's TRANSFER entry (GRAPH_F_STAGE nodes that
 * are not expert packets;
 * runtime/node/backend.h). Idempotent; rt_pipe_open calls it. */
void rt_pipe_register(void);

#endif

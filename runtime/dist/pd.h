/* pd.h: prefill and decode on different homes (SPEC 7.1-7.4): the P->D
 * state package, its transfer, the ready barrier, and one request driven
 * across the two roles.
 *
 * A plan whose serving.placement puts prefill (P) and decode (D) on
 * different homes compiles a prefill graph with TRANSFER nodes
 * (scheduler/graph.h): after each tile that appended global entries, one
 * per KV source ships the entries committed since the previous one (Main
 * KV and Indexer K together); at the end, every SWA ring, every compressor
 * tail, the token history and the kept encoder outputs. Each TRANSFER node
 * runs through the CPU backend's `transfer` entry (rt_pd_transfer_node),
 * which packs its data into one message (a header with the node, the
 * class, the entry range and XXH3 checksums, then the bytes) and either
 *
 *   - applies it to the D request in this process (no mpirun: both roles
 *     run here, the same graph, the transfer a local copy), or
 *   - sends it to the decode rank through StarPU-MPI (runtime/comm/comm_mpi.c), while
 *     the next chunk computes (the send is detached).
 *
 * After the graph, P samples y1 and sends the metadata (lengths, positions,
 * per-source entry counts, ring boundaries, tail boundaries, formats, the
 * state version, the last Engram ids, y1 and who consumes it at which
 * position) and the prefill's logits. D receives every message, checks each
 * checksum, applies them in graph order, and runs the ready barrier
 * (rt_pd_ready: SPEC 7.3's five conditions) before its first decode step.
 *
 * Bytes moved are counted per state class and compared with what the plan
 * alone says the package holds (rt_pd_expected_bytes, from plan_cost).
 *
 * With stages or experts per role (plan_place_pd), each P stage ships its
 * layers to its decode home and every decode home checks its senders'
 * records: pd_stage.c drives that request under mpirun.
 * Not here: the graph's transfer nodes (scheduler/graph.c), MPI itself
 * (runtime/comm/comm_mpi.c), printing (cli/run_pd.c).
 * Test: tests/test_pd.c (one process), tests/cli/pd_mpi.sh (mpirun -np 2).
 */
#ifndef CEDAR_RUNTIME_PD_H
#define CEDAR_RUNTIME_PD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/node/backend.h"
#include "runtime/gen/generate.h"
#include "runtime/model/state.h"

/* The state version a package carries; D refuses another. */
#define RT_PD_STATE_VERSION 1u

/* What this process does with a plan. */
enum rt_pd_role {
  RT_PD_NONE = 0, /* prefill and decode on one home: no transfer */
  RT_PD_LOCAL,    /* both roles in this process (no mpirun): transfers are local copies */
  RT_PD_PREFILL,  /* this rank runs P and sends */
  RT_PD_DECODE,   /* this rank receives and runs D (and prints the report) */
  RT_PD_IDLE,     /* a rank with no role in this placement */
};

/* State classes of the package (SPEC 7.2). */
enum rt_pd_class {
  RT_PD_KV = 0,   /* global KV entries, Main KV + Indexer K, all sources */
  RT_PD_SWA_ENC,  /* encoder rings' entries */
  RT_PD_SWA_DEC,  /* decoder rings' entries (replay on P) */
  RT_PD_TAIL,     /* compressor tails (ratio > 1 sources) */
  RT_PD_XE,       /* kept encoder outputs */
  RT_PD_META,     /* metadata: token history, ring positions, tail boundaries, headers, the package record */
  RT_PD_CLASS_COUNT
};
const char *rt_pd_class_name(enum rt_pd_class c);

struct rt_pd_stats {
  bool mpi;                         /* moved through StarPU-MPI (else local copies) */
  bool replay_on_d;                 /* D replayed the decoder and sampled y1 (SPEC 7.6) */
  int64_t bytes[RT_PD_CLASS_COUNT]; /* payload bytes by class */
  int64_t expected[RT_PD_CLASS_COUNT]; /* what the plan says (rt_pd_expected_bytes); -1 for META */
  int64_t messages;
  int64_t kv_bytes_before_end;      /* KV bytes whose transfer finished before the prefill graph ended */
  double overlap;                   /* kv_bytes_before_end / KV bytes */
  double prefill_s;                 /* P's prefill graph */
  double transfer_s;                /* P's first send to the last message's arrival on D */
  double handoff_s;                 /* P's prefill end to D ready (what the prefill did not hide; D's replay included) */
  double ready_s;                   /* the barrier check */
};

/* Prefill and decode on different homes. */
bool rt_pd_split(const struct plan *p);
enum rt_pd_role rt_pd_role_of(const struct plan *p);
/* Ranks the placement needs (max rank + 1); with P/D stages or experts
 * every rank the placement names under mpirun, 1 without (one process
 * plays them all). */
int rt_pd_ranks_needed(const struct plan *p);

/* The payload bytes per class a cold prefill of n positions ships, from
 * the plan alone (plan_cost): KV = every source's entries x entry bytes,
 * SWA = the rings x window x entry bytes, tails, kept encoder outputs. */
void rt_pd_expected_bytes(const struct plan *p, int64_t n, int64_t replay, int64_t out[RT_PD_CLASS_COUNT]);

/* The CPU backend's TRANSFER entry (exec_node.c's table). */
int rt_pd_transfer_node(const struct rt_node_ctx *c);

/* The package's record, sent after the prefill graph. */
struct rt_pd_meta {
  uint32_t magic, version;
  uint64_t plan_fp;                  /* XXH3 of the layer table and widths */
  int64_t n_prompt, n_pos, n_tokens;
  int32_t y1;                        /* sampled by P, not consumed; -1 none */
  int32_t y1_sampler, y1_consumer;   /* 0 = P, 1 = D */
  int64_t y1_pos;                    /* where D consumes it */
  uint64_t rng;                      /* the sampler's state after y1 */
  int64_t n_entries[PLAN_MAX_LAYERS];/* committed entries per source (-1: not a source) */
  int64_t ring_end[PLAN_MAX_LAYERS]; /* the last position each ring holds (-1 empty) */
  int32_t tail_count[PLAN_MAX_LAYERS];
  int64_t tail_pos0[PLAN_MAX_LAYERS];
  int64_t entry_bytes[PLAN_MAX_LAYERS];
  int64_t swa_entry_bytes;
  int32_t last_ids[4];               /* the last Engram ids (up to max_order - 1) */
  int64_t n_messages;                /* transfer messages before this one */
  uint64_t chain;                    /* XXH3 over every message's payload checksum, in order */
  int64_t out_rows;                  /* prefill logits rows that follow */
  double ttft_s, prefill_s, t_end;   /* P's clock: prefill graph end */
  double t_first_send;               /* P's clock: the first transfer posted (one host: one CLOCK_MONOTONIC) */
  double t_start;                    /* P's clock: the request began (TTFT when D delivers y1) */
  struct rt_exec_stats prefill;
  int32_t prefill_nodes, prefill_edges;
  int64_t replay;
  uint64_t self_check;               /* XXH3 of the record up to here */
};

/* What D received and applied. */
struct rt_pd_rx {
  int64_t expected, arrived, applied; /* messages */
  int64_t bad_checksum;
  uint64_t chain;
  char first_missing[48];
};

/* SPEC 7.3: 0 when D may decode r (its state after the package was
 * applied); else CEDAR_EINVAL with the condition named:
 *   1 global pages (lengths, entry counts, visibility),
 *   2 SWA boundary,
 *   3 compressor-tail boundary,
 *   4 the sampled-but-unconsumed token,
 *   5 transfers complete (and the state version). */
int rt_pd_ready(const struct plan *p, const struct rt_pd_meta *m, const struct rt_request *r,
                const struct rt_pd_rx *rx, char *err, size_t err_len);

/* One request across the two roles of plan M->p: the prefill on P, the
 * package to D, the barrier, the decode on D. pools: this process's
 * pools (D's in LOCAL mode: P takes pools of its own). r is D's request
 * (initialised here; on RT_PD_PREFILL left zeroed). Returns 0, 1 when
 * this rank has no report to print (P under mpirun), or a negative
 * cedar_status with err. st: the transfer figures; figs: where a plan
 * with stages or experts puts theirs (pipeline.h; NULL: not kept). Under mpirun a transfer
 * fails when no message completes for CEDAR_PD_DEADLINE_S seconds (default
 * 60); messages still posted then end the job (runtime/comm/comm_mpi.c). */
struct rt_pipe_figs; /* pipeline.h */
int rt_pd_generate(const struct rt_model *M, struct rt_kv_pool *pools, struct rt_request *r, const int32_t *prompt,
                   int64_t n, const struct rt_gen_opts *o, struct rt_gen_result *res, struct rt_pd_stats *st,
                   const struct rt_pipe_figs *figs, char *err, size_t err_len);

/* CEDAR_PD_DEADLINE_S, the deadline of every wait between ranks (P/D,
 * stages, experts): seconds in (0, 86400], default 60 when unset. A value
 * that is not such a number (abc, -1, nan, 0, 5x) is refused by
 * rt_pd_deadline_check (cli/main.c, before any command runs: it used to
 * mean 60 s without a word); rt_pd_deadline_s then still answers 60.
 * The parsing is comm_deadline_s's (runtime/comm/comm.h). */
double rt_pd_deadline_s(void);
/* 0, or -1 with "CEDAR_PD_DEADLINE_S=<value>: why" in err. */
int rt_pd_deadline_check(char *err, size_t err_len);

/* What the decode rank knows of the prefill rank's part of a request
 * under mpirun with a trace asked for (rt_gen_opts.on_graph on the StarPU
 * executor): P's prefill graph, when each of its nodes ran on P, and when
 * each transfer message arrived on D, all on D's clock of struct
 * rt_task_time (P converts its times to CLOCK_MONOTONIC, D back: one clock
 * on one host). rt_pd_generate writes it where rt_pipe_figs.pd_trace says
 * (the request's report, runtime/dist/dist.h), g NULL when there is none;
 * it owns what it points to (rt_pd_trace_free). cli/run_pd.c makes it one
 * trace. */
struct rt_pd_trace {
  const struct graph *g;
  const struct rt_task_time *p_times; /* (g->n_node) worker: P's */
  const double *arrive_us;            /* (g->n_node) transfers: arrival on D; others 0 */
  const int64_t *msg_bytes;           /* (g->n_node) transfers: the message's bytes; others 0 */
  int p_rank, d_rank, p_workers;
};
void rt_pd_trace_free(struct rt_pd_trace *t);

/* Test hooks: what a P/D run does to the package before D's barrier
 * (negative tests of SPEC 8.9.45). */
enum rt_pd_fault {
  RT_PD_FAULT_NONE = 0,
  RT_PD_FAULT_DROP_TAIL,      /* a tail message never applied */
  RT_PD_FAULT_SWA_SHIFT,      /* one encoder ring one position behind */
  RT_PD_FAULT_INFLIGHT,       /* the last KV page message not yet arrived */
  RT_PD_FAULT_VERSION,        /* the record carries another state version */
  RT_PD_FAULT_Y1,             /* y1 both pending and already consumed */
  RT_PD_FAULT_CORRUPT,        /* one KV message's bytes flipped after its checksum */
  RT_PD_FAULT_TRUNCATE,       /* under mpirun: P sends the first KV message cut to half its bytes */
  RT_PD_FAULT_P_DIES,         /* under mpirun: P kills itself (SIGKILL) as it posts its K-th message */
  RT_PD_FAULT_D_DIES,         /* under mpirun: D kills itself once K messages arrived */
};
void rt_pd_set_fault(enum rt_pd_fault f);
/* CEDAR_PD_TEST_FAULT's value (tests/cli/pd_faults.sh): hold-kv, corrupt,
 * truncate, p-dies:K, d-dies:K. Returns 0, or CEDAR_EINVAL naming the
 * values when s is none of them. */
int rt_pd_fault_parse(const char *s, char *err, size_t err_len);

/* Register P/D's TRANSFER entry (the state package: a TRANSFER without a
 * stage or expert flag; runtime/node/backend.h). Idempotent;
 * rt_pd_generate calls it. */
void rt_pd_register(void);

#endif

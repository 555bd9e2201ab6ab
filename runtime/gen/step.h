/* step.h: the one forward step of every decode driver: the live rows of a
 * step (one request's pending token for `cedar run`, P/D and stages; many
 * requests' for continuous batching; the pending token and its drafts for
 * a speculative verify) run through every layer and come back as logits,
 * one row per position. The drivers are loops around it and pass the
 * logits to the one sampler path (sampler.h: rt_sample_next) or to
 * speculative acceptance (runtime/engine/speculate.c):
 *
 *   rt_gen_decode (generate.c)        1 row, 1 position: run, P/D, stages
 *   rt_batch_run_step (engine/batch.c) B rows, 1 position each
 *   rt_generate_spec (engine/speculate.c) 1 row, 1 + drafts positions
 *
 * How a step runs: a row alone builds graph_build_verify(pos, n) (n = 1 is
 * graph_build_decode) and runs it on o's executor through rt_gen_run_graph,
 * as every driver runs a graph (this rank's nodes, after_graph, on_graph).
 * With an arena (the batch's), the one-position rows on the direct executor
 * run in lockstep, node by node, where the row-wise op groups (embed,
 * Engram injection, the attention's projections, MoE, head) run once over
 * the B rows and the stateful parts run on each request's own state
 * (rt_attn_rows, runtime/model/model.h); with row-invariant ops each row's
 * logits are bitwise those it gets alone. Other rows (more positions,
 * .alone, or another executor) run alone, one after another, before them.
 *
 * Not here: pushing the ids (the caller pushes each row's ids for
 * [r->n_pos, r->n_pos + n) before the step), sampling and acceptance.
 * Test: tests/test_batch.c (batched = alone, bitwise), tests/test_speculate.c,
 * tests/test_model_*.c, every --dump of tests/cli/.
 */
#ifndef CEDAR_RUNTIME_GEN_STEP_H
#define CEDAR_RUNTIME_GEN_STEP_H

#include "runtime/gen/generate.h"
#include "runtime/model/arena.h"

/* One live row of a step. */
struct rt_step_row {
  struct rt_request *r; /* ids of [r->n_pos, r->n_pos + n) pushed; n_pos advances by n when the row ran */
  int n;                /* positions: 1 (decode) or 1 + drafts (verify), at most the window */
  bool alone;           /* run on its own graph even with one position (a verify row: its tail log, capture) */
  float *logits;        /* (n, vocab): the step writes them */
  int rc;               /* out: 0, or a negative cedar_status with err; a failed row's state is unusable */
  int nodes;            /* out: nodes of its graph */
  char err[400];
};

/* Run the n_rows rows (header comment), each row's result in its rc, err
 * and logits. ar: the batched op groups' scratch (lockstep rows only; NULL
 * runs every row alone: the single-request drivers). st: a row run alone adds its executor's figures
 * there (lockstep rows add none: the caller times the step). Returns the
 * rows that failed. */
int rt_gen_step(const struct rt_model *M, struct rt_step_row *rows, int n_rows, const struct rt_gen_opts *o,
                struct rt_arena *ar, struct rt_exec_stats *st);

#endif

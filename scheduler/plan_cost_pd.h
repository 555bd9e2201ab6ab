/* plan_cost_pd.h: the P->D state package a plan's placement ships after a
 * cold prefill of n positions (SPEC 7.2, 7.6), from the plan alone: what
 * `cedar plan cost` prints for a P/D plan and what runtime/dist/pd.c holds the
 * bytes it moved to.
 *
 *   global KV        every source's entries after n positions x entry bytes
 *                    (Main KV + Indexer K), streamed chunk by chunk
 *   encoder SWA      every encoder ring (window x entry bytes, scales in)
 *   decoder SWA      every decoder ring when the replay runs on P; 0 on D
 *   tails            every ratio > 1 source's tail
 *   encoder outputs  the kept encoder outputs (replay.decoder rows of
 *                    hc x hidden fp32): D's replay input when it runs on D,
 *                    and a continuation's on D either way
 * The metadata (token history, ring positions, headers, the record) is the
 * runtime's framing and not counted here.
 * Test: tests/test_pd.c (equal to the bytes moved), tests/cli/pd_mpi.sh.
 */
#ifndef CEDAR_SCHEDULER_PLAN_COST_PD_H
#define CEDAR_SCHEDULER_PLAN_COST_PD_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/plan.h"

struct plan_pd_package {
  bool split;            /* prefill and decode on different homes */
  bool replay_on_decode; /* serving.placement.replay: decode */
  int64_t kv, swa_enc, swa_dec, tails, xe;
  int64_t total;
};

/* Returns 0, or CEDAR_EINVAL when the plan's cost cannot be computed. */
int plan_cost_pd_package(const struct plan *p, int64_t n, struct plan_pd_package *out);

#endif

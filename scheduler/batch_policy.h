/* batch_policy.h: which requests join a continuous-batching step
 * (docs/serving.md), as a pure function of the queue: the loop that runs
 * the step is runtime/engine/batch.c.
 *
 * One step serves, in this order and within serving.batch's limits:
 *   1. every running request that is decoding: one token each;
 *   2. running requests still in their prefill: the next segment of their
 *      prefill graph each (at most serving.batch.chunk positions), oldest
 *      first, while the step's token budget holds it (a segment that does
 *      not fit waits for a later step; it is never split);
 *   3. waiting requests in arrival order while fewer than max_requests run
 *      and the budget holds their first segment (first come, first served:
 *      the first that does not fit stops admission for this step).
 * serving.batch guarantees step_tokens >= max_requests and chunk <=
 * step_tokens (scheduler/plan_check.c), so every decode row fits and a
 * prefill alone always advances.
 *
 * Not here: running anything (runtime/engine/batch.c). Test: tests/test_batch.c
 * (admission under the token budget).
 */
#ifndef CEDAR_SCHEDULER_BATCH_POLICY_H
#define CEDAR_SCHEDULER_BATCH_POLICY_H

#include <stdbool.h>

enum bp_phase { BP_WAITING = 0, BP_PREFILL, BP_DECODE };

/* One request of the queue, in arrival order. */
struct bp_req {
  enum bp_phase phase;
  int next;  /* WAITING, PREFILL: positions of its next prefill segment; DECODE: unused (one token) */
};

struct bp_limits {
  int max_requests;  /* running at once (PREFILL + DECODE) */
  int step_tokens;   /* tokens one step runs */
};

/* What one step runs: out[i] for request i of the queue, 0 when it sits
 * this step out, else the tokens it runs (1 for a decode row, its segment
 * for a prefill). Returns the step's tokens; *admitted counts the waiting
 * requests this step admits (they become PREFILL in the caller). */
int bp_plan_step(const struct bp_req *q, int n, const struct bp_limits *lim, int *out, int *admitted);

#endif

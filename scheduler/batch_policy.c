/* batch_policy.c: the admission and budget rule of batch_policy.h. */
#include "scheduler/batch_policy.h"

int bp_plan_step(const struct bp_req *q, int n, const struct bp_limits *lim, int *out, int *admitted) {
  int used = 0, running = 0;
  *admitted = 0;
  for (int i = 0; i < n; i++) {
    out[i] = 0;
    running += q[i].phase != BP_WAITING;
  }
  for (int i = 0; i < n && used < lim->step_tokens; i++)
    if (q[i].phase == BP_DECODE) out[i] = 1, used++;
  for (int i = 0; i < n; i++)
    if (q[i].phase == BP_PREFILL && q[i].next > 0 && used + q[i].next <= lim->step_tokens)
      out[i] = q[i].next, used += q[i].next;
  for (int i = 0; i < n && running < lim->max_requests; i++) {
    if (q[i].phase != BP_WAITING) continue;
    if (q[i].next <= 0 || used + q[i].next > lim->step_tokens) break;
    out[i] = q[i].next, used += q[i].next;
    running++, (*admitted)++;
  }
  return used;
}

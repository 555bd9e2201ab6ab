/* run_spec.h: `cedar run --speculate`: speculative decoding of the run's
 * request (runtime/engine/speculate.h) beside plain decoding of the same request,
 * in one process: the tokens compared (greedy: bit for bit), the acceptance
 * figures as vLLM names them, decode tokens/s of each and their ratio.
 *
 * Drafters: `forced:R[,R...]` drafts the plain greedy continuation, each
 * draft agreeing with probability R (1: all, 0.5: half; docs/speculative.md),
 * one speculative run per R; `mtp` drafts with the model's own DSpark
 * drafter (its mtp blocks, runtime/model/mtp.h), one speculative run.
 * Test: tests/cli/speculate.sh.
 */
#ifndef CEDAR_CLI_RUN_SPEC_H
#define CEDAR_CLI_RUN_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine/engine.h"
#include "runtime/gen/generate.h"

#define RUN_SPEC_MAX_RATES 8

struct run_spec_opts {
  int n_rates;
  float rate[RUN_SPEC_MAX_RATES];
  int draft_len;       /* <= 0: the plan's dspark.draft, else 5 */
  int verify_len;      /* < 0: chosen each round from the measured profile (SPEC 3.16); else fixed */
  bool json;
  bool mtp;            /* the model's own DSpark drafter (runtime/model/mtp.h) instead of forced rates */
};

/* Parse --speculate's value into o (draft_len and verify_len untouched).
 * false with a message in err. */
bool run_spec_parse(const char *arg, struct run_spec_opts *o, char *err, size_t err_len);

/* Plain, then one speculative run per rate, of prompt under go (greedy or
 * sampled); prints the report on stdout. Returns 0, 1 on an error, 2 when a
 * greedy speculative run's tokens differ from plain greedy. */
int run_spec(struct rt_engine *e, const int32_t *prompt, int64_t n, const struct rt_gen_opts *go,
             const struct run_spec_opts *so);

#endif

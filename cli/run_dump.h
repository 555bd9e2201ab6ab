/* run_dump.h: `cedar run --dump FILE`: what a run computed, as safetensors,
 * under the names the NumPy oracle writes (tests/oracle/oracle.py dump()), so
 * tests/oracle/compare.py can compare the two files:
 *   prefill.logits (rows, vocab) F32, prefill.positions (rows) I64,
 *   decode.logits (steps, vocab) F32 (when steps > 0), tokens (consumed) I64,
 *   L{l}.main_kv / L{l}.indexer_k (entries, bytes) U8 and L{l}.tail_pos I64
 *   per KV source, L{l}.swa (slots, bytes) U8 and L{l}.swa_pos I64 per layer
 *   (the ring's entries in position order).
 * Metadata: cedar.plan, cedar.token_layers.
 */
#ifndef CEDAR_RUNTIME_RUN_DUMP_H
#define CEDAR_RUNTIME_RUN_DUMP_H

#include <stddef.h>

#include "runtime/gen/generate.h"
#include "runtime/model/model.h"

int run_dump_write(const char *path, const struct rt_model *M, const struct rt_request *r,
                  const struct rt_gen_result *res, char *err, size_t err_len);

/* `cedar run --dump-roundings FILE` (runtime/model/round_trace.h, tests/oracle/
 * follow.py): run_round_begin checks FILE can be written and starts
 * recording (before anything runs the model); run_round_write, right after
 * the run, stops and writes it. Each returns 0, or 1 after printing why. */
int run_round_begin(const char *path);
int run_round_write(const char *path);

#endif

/* run_opts.h: `cedar run`'s options, parsed from its command line
 * (cli/run_opts.c); cli/cmd_run.c runs the request they describe. */
#ifndef CEDAR_CLI_RUN_OPTS_H
#define CEDAR_CLI_RUN_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/run_spec.h"
#include "runtime/engine/engine.h"

struct text_out;

/* The built-in prompt when none is given (tokenized byte by byte). */
extern const char run_default_prompt[];

struct ropts {
  const char *plan, *weights, *prompt, *tokens, *dump, *sched, *trace, *dot, *model, *dump_round;
  const char *device; /* --device: NULL, "cpu" or "cuda" */
  int cuda_graphs;    /* --cuda-graphs: 0 not given, 1 on, 2 off (struct rt_engine_opts.cuda_graphs) */
  int64_t cuda_scratch; /* --cuda-scratch MiB, in bytes; 0 not given (struct rt_engine_opts.dev_scratch) */
  const char *system, *stops[16]; /* text: --system, --stop */
  int n_stops, top_k;
  float rep_penalty;
  bool raw, ids, sample_seed_given;
  const struct text_out *out; /* text: the output (NULL: the output is ids) */
  const int32_t *prompt_ids;
  uint64_t sample_seed;
  const char *tokenizer, *engram_map; /* --tokenizer; where the Engram token map came from (for the report) */
  enum rt_executor executor;
  int workers;
  int64_t prompt_len;
  int max_new, chunk;
  int64_t replay;
  uint64_t seed;
  bool weights_f32;          /* --weights-format f32 */
  float temperature, top_p;
  bool exact, json;
  bool speculate;            /* --speculate (cli/run_spec.h) */
  struct run_spec_opts spec;
};

/* Fills o from argv: -1 to go on, or the exit status (0 after --help, 2
 * for a usage error, with the message printed). */
int run_parse(int argc, char **argv, struct ropts *o);

#endif

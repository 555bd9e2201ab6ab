/* cli.h: the `cedar` subcommands. Each lives in cli/cmd_<name>.c, takes
 * argc/argv starting at its own name (so getopt_long sees argv[0] = name) and
 * returns the process exit status: 0 success, 1 a failed check or bad input,
 * 2 a usage error. */
#ifndef CEDAR_CLI_H
#define CEDAR_CLI_H

#include <stdio.h>

int cmd_version(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_op(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_model(int argc, char **argv);
int cmd_bench_pd(int argc, char **argv);
int cmd_bench_pp(int argc, char **argv);
int cmd_bench_engram(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv);
int cmd_weights(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_graph(int argc, char **argv);
int cmd_serve_sim(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_view(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_explore(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_bench_tokenizer(int argc, char **argv);

/* The tokenizer at path (NULL: the npm cache the build found), or NULL
 * with the reason printed as "cedar <cmd>: ..." (cli/cmd_tokenize.c). */
struct tokenizer;
struct tokenizer *cli_open_tokenizer(const char *cmd, const char *path);
/* A whole file ("-": stdin), NUL-terminated, *len bytes; NULL with a message. */
#include <stddef.h>
char *cli_read_all(const char *cmd, const char *path, size_t *len);

/* Plan subcommands (cli/cmd_plan.c dispatches). */
int cmd_plan_check(int argc, char **argv);
int cmd_plan_show(int argc, char **argv);
int cmd_plan_cost(int argc, char **argv);
int cmd_plan_diff(int argc, char **argv);
int cmd_plan_dot(int argc, char **argv);
int cmd_plan_import(int argc, char **argv);
int cmd_plan_config(int argc, char **argv);

/* The plan `cedar` uses when none is given. */
#define CEDAR_DEFAULT_PLAN "plans/v41-mini.yaml"
const char *cli_default_plan(void);

/* A command with subcommands (`cedar plan`, `cedar weights`): a table and one
 * dispatcher that prints the usage, handles --help and unknown names. */
struct cli_sub {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
};
/* `cmd` names the command ("plan"), `args` what follows the subcommand in the
 * usage line, `footer` a closing line. Returns the subcommand's status, or 2. */
int cli_dispatch(const char *cmd, const char *args, const char *footer, const struct cli_sub *subs, size_t n,
                 int argc, char **argv);

/* Print a JSON document on stdout and delete it. */
struct cJSON;
void cli_print_json(struct cJSON *root);

/* Load a plan (NULL: the default plan); on failure print its diagnostics and
 * "cedar <cmd>: <path>: the plan did not load" on stderr and return 1. */
struct plan;
int cli_load_plan(const char *cmd, const char *path, struct plan *p);

/* Whether JSON text holds a \u0000 escape: cJSON decodes it into a NUL
 * that silently ends the string there (issue 28, low row), so request
 * and trace lines are refused with it. */
#include <stdbool.h>
bool cli_json_has_nul(const char *text);

/* A whole decimal integer in [lo, hi] (no trailing characters). */
#include <stdbool.h>
#include <stdint.h>
bool cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* "A" or "A:B" (lo <= A <= B <= hi) into a and b (b = a for "A"). */
bool cli_parse_range(const char *s, int64_t lo, int64_t hi, int64_t *a, int64_t *b);
/* --weights-format: "stored" (false: each tensor in its stored format, the
 * default) or "f32" (true: the same values held as F32); false when s is
 * neither. */
bool cli_parse_weights_format(const char *s, bool *f32);
/* The help line of --weights-format, shared by the commands that take it. */
#define CLI_WEIGHTS_FORMAT_HELP                                                                              \
  "  --weights-format stored|f32  synthetic and --model weights held in their stored formats (FP8, FP4,\n"  \
  "               BF16: the default) or as F32 of the same values (bitwise the same results; docs/weights.md)\n"

/* An output file a flag names, checked before any work (issue 18 rows 2
 * and 9): refused, with "cedar <cmd>: <flag> <path>: why" on stderr, when
 * it exists and is not a regular file (a device such as /dev/full, a
 * directory, a pipe: cedar writes by rename or truncation and would replace
 * or block on it), or when its directory is missing or not writable.
 * Returns 0, or 1 after the message. */
int cli_check_out(const char *cmd, const char *flag, const char *path);

/* A byte count, the one size syntax of every flag that takes one: a whole
 * decimal number with an optional binary suffix K, M, G or T (powers of
 * 1024; "KiB", "KB" spellings too): "8G", "500M", "1000". */
bool cli_parse_size(const char *s, uint64_t *out);

/* `cedar run --help` (cli/run_usage.c): a printf format taking the default
 * plan (%s) and the built-in prompt's length (%zu). */
extern const char run_usage[];

/* Print "cedar <cmd>: <msg>" to stderr and return 2 (usage error). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

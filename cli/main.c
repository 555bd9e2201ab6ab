/* main.c: the `cedar` binary. A short dispatch to the subcommands of
 * cli/cmd_*.c; only subcommands that work are listed. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli.h"
#include "ops/basic.h"
#include "runtime/dist/pd.h"

struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
};

static const struct command commands[] = {
    {"run", cmd_run, "run a prompt through the model a plan describes and generate tokens (the main job)"},
    {"eval", cmd_eval, "teacher-forced quality over a text: bits per byte, perplexity, next-token accuracy"},
    {"serve", cmd_serve, "serve the model over an OpenAI-compatible HTTP API (docs/serving.md)"},
    {"serve-sim", cmd_serve_sim, "replay a JSON-lines workload through one runtime with the prefix cache"},
    {"graph", cmd_graph, "show the task graph a plan compiles to (text or Graphviz DOT)"},
    {"plan", cmd_plan, "check, show, cost, diff and draw execution plans"},
    {"op", cmd_op, "run one operator on tensors from a safetensors file (--list for all)"},
    {"weights", cmd_weights, "make, check and list a plan's weights (safetensors, docs/weights.md)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text (DeepSeek-V3 tokenizer, docs/tokenizer.md)"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"bench", cmd_bench, "time the ops against this machine's peaks (ops), or the whole model side by side (model)"},
    {"view", cmd_view, "write a trace (with its graph and plan) as one self-contained HTML page"},
    {"report", cmd_report, "plans side by side: memory by state class, prefix hits, time, drift (PNG + HTML)"},
    {"explore", cmd_explore, "sweep plan parameters; cost (and run) each variant; the Pareto front"},
    {"env", cmd_env, "show library versions, CPU topology, StarPU workers and CUDA devices"},
    {"version", cmd_version, "print the cedar version"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar <command> [options]\n"
          "\n"
          "cedar runs DeepSeek-V4.1-Flash-style models from declarative YAML execution plans.\n"
          "\n"
          "commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "\n"
          "Run 'cedar <command> --help' for a command's options.\n"
          "The default plan is %s.\n"
          "Environment: CEDAR_LOG=error|warn|info|debug sets the log level (default warn);\n"
          "CEDAR_ISA=default|avx2|avx512 picks the vector ISA of cedar's CPU kernels (default: the\n"
          "best this CPU has; every level gives the same bits).\n",
          CEDAR_DEFAULT_PLAN);
}

int main(int argc, char **argv) {
  char err[512];
  if (op_blas_reserve(1, err, sizeof err)) {
    /* _exit: OpenBLAS's own threads may be retrying their buffers, and the
     * exit handlers would wait for them forever */
    fprintf(stderr, "cedar: %s\n", err);
    fflush(NULL);
    _exit(1);
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) return cmd_version(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      if (rt_pd_deadline_check(err, sizeof err)) { /* an environment knob, checked before any work */
        fprintf(stderr, "cedar: %s\n", err);
        return 2;
      }
      cedar_ignore_sigxfsz(); /* a write past `ulimit -f` fails with EFBIG and is reported (base/file.h) */
      int rc = commands[i].fn(argc - 1, argv + 1);
      /* stdout on a full disk or /dev/full: no exit 0 after a failed write */
      return cedar_stdout_close(argv[1]) && rc == 0 ? 1 : rc;
    }
  fprintf(stderr, "cedar: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}

/* cmd_graph.c: `cedar graph show|dot`, the graph a plan compiles to
 * (scheduler/graph.h) for a prefill of N tokens or one decode step.
 *
 *   cedar graph show [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R] [--verbose]
 *   cedar graph dot  [same options] [--out FILE]
 *
 * Tested by tests/cli/run.sh.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "scheduler/graph.h"

struct gopts {
  const char *plan, *out;
  int64_t prompt_len, decode_pos, replay, hit;
  int chunk;
  bool decode, verbose, swa_hit;
};

static const char show_usage[] =
    "usage: cedar graph show [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R]\n"
    "                        [--hit C [--swa-hit]] [--verbose]\n"
    "List the graph plan P (default %s) compiles to: the cold prefill of N tokens (default 1024;\n"
    "CED or dense by serving.ced) or one decode step at position POS. Each node with its tile,\n"
    "flags and the nodes it waits for; --verbose adds every data access.\n"
    "  --hit C      a prefix hit: the global entries of [0, C) are cached (C a multiple of every\n"
    "               source's ratio); the encoder replays [C - replay.encoder, C) with global\n"
    "               writes off (SPEC 6.5 path b)\n"
    "  --swa-hit    with --hit: the encoder snapshot at C is restored instead (path a)\n";
static const char dot_usage[] =
    "usage: cedar graph dot [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R]\n"
    "                       [--hit C [--swa-hit]] [--out FILE]\n"
    "The same graph as Graphviz DOT (stdout, or FILE): one box per node, one arrow per edge.\n";

static int parse(int argc, char **argv, const char *cmd, const char *usage, struct gopts *o) {
  static const struct option opts[] = {{"plan", required_argument, NULL, 'p'},
                                       {"prompt-len", required_argument, NULL, 'n'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"chunk", required_argument, NULL, 'c'},
                                       {"replay", required_argument, NULL, 'r'},
                                       {"verbose", no_argument, NULL, 'v'},
                                       {"hit", required_argument, NULL, 'H'},
                                       {"swa-hit", no_argument, NULL, 'S'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"help", no_argument, NULL, 'h'},
                                       {0, 0, 0, 0}};
  memset(o, 0, sizeof(*o));
  o->prompt_len = 1024;
  o->replay = -1;
  int c;
  int64_t v;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'p': o->plan = optarg; break;
    case 'n':
      if (!cli_parse_int(optarg, 1, INT32_MAX, &o->prompt_len)) return cli_usage_error(cmd, "--prompt-len takes N >= 1");
      break;
    case 'd':
      if (!cli_parse_int(optarg, 0, INT32_MAX, &o->decode_pos)) return cli_usage_error(cmd, "--decode takes a position >= 0");
      o->decode = true;
      break;
    case 'c':
      if (!cli_parse_int(optarg, 1, INT32_MAX, &v)) return cli_usage_error(cmd, "--chunk takes C >= 1");
      o->chunk = (int)v;
      break;
    case 'r':
      if (!cli_parse_int(optarg, 0, INT32_MAX, &o->replay)) return cli_usage_error(cmd, "--replay takes R >= 0");
      break;
    case 'v': o->verbose = true; break;
    case 'H':
      if (!cli_parse_int(optarg, 0, INT32_MAX, &o->hit)) return cli_usage_error(cmd, "--hit takes C >= 0");
      break;
    case 'S': o->swa_hit = true; break;
    case 'o':
      if (!strcmp(cmd, "graph show")) return cli_usage_error(cmd, "--out is for `cedar graph dot`");
      o->out = optarg;
      break;
    case 'h': printf(usage, CEDAR_DEFAULT_PLAN); return 0;
    default: return cli_usage_error(cmd, "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  if (o->swa_hit && !o->hit) return cli_usage_error(cmd, "--swa-hit needs --hit C");
  if (o->decode && o->hit) return cli_usage_error(cmd, "--hit is for a prefill, not --decode");
  return -1;
}

static int build(const struct gopts *o, const char *cmd, struct plan *p, struct graph *g) {
  if (cli_load_plan("graph", o->plan, p)) return 1;
  char err[256];
  struct graph_opts go = {.chunk = o->chunk, .replay = o->replay, .hit = o->hit, .swa_hit = o->swa_hit};
  int rc = o->decode ? graph_build_decode(g, p, o->decode_pos, err, sizeof err)
                     : graph_build_prefill(g, p, o->prompt_len, &go, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar %s: %s\n", cmd, err);
    plan_free(p);
    return 1;
  }
  return 0;
}

static int graph_show(int argc, char **argv) {
  struct gopts o;
  int rc = parse(argc, argv, "graph show", show_usage, &o);
  if (rc >= 0) return rc;
  struct plan p;
  struct graph g;
  if (build(&o, "graph show", &p, &g)) return 1;
  graph_print(&g, stdout, o.verbose);
  graph_free(&g);
  plan_free(&p);
  return 0;
}

static int graph_dot_cmd(int argc, char **argv) {
  struct gopts o;
  int rc = parse(argc, argv, "graph dot", dot_usage, &o);
  if (rc >= 0) return rc;
  struct plan p;
  struct graph g;
  if (build(&o, "graph dot", &p, &g)) return 1;
  FILE *f = o.out ? fopen(o.out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "cedar graph dot: cannot write %s: %s\n", o.out, strerror(errno));
    rc = 1;
  } else {
    graph_dot(&g, f);
    rc = 0;
    if (o.out && fclose(f)) {
      fprintf(stderr, "cedar graph dot: writing %s failed: %s\n", o.out, strerror(errno));
      rc = 1;
    }
  }
  graph_free(&g);
  plan_free(&p);
  return rc;
}

int cmd_graph(int argc, char **argv) {
  static const struct cli_sub subs[] = {
      {"show", graph_show, "list the nodes and edges of a prefill or decode graph"},
      {"dot", graph_dot_cmd, "write the graph as Graphviz DOT"},
  };
  return cli_dispatch("graph", "[options]", "Run `cedar graph SUBCOMMAND --help` for its options.", subs,
                      sizeof(subs) / sizeof(subs[0]), argc, argv);
}

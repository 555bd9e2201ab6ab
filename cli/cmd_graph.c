/* cmd_graph.c: `cedar graph show|dot`, the graph a plan compiles to
 * (scheduler/graph.h) for a prefill of N tokens or one decode step.
 *
 *   cedar graph show [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R] [--verbose] [--json]
 *   cedar graph dot  [same options] [-o|--out FILE] [--json]
 *
 * --json: show prints the graph as one object (nodes with their waits);
 * dot wraps the DOT text in {"plan", "dot"}.
 * Tested by tests/cli/run.sh and tests/cli/bad_input.sh.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "base/check.h"
#include "base/file.h"
#include "cli/cli.h"
#include "scheduler/graph.h"

struct gopts {
  const char *plan, *out;
  int64_t prompt_len, decode_pos, replay, hit;
  int chunk;
  bool decode, verbose, swa_hit, swa_miss, json;
};

static const char show_usage[] =
    "usage: cedar graph show [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R]\n"
    "                        [--hit C [--swa-miss | --swa-hit]] [--verbose] [--json]\n"
    "List the graph plan P (default %s) compiles to: the cold prefill of N tokens (default 1024;\n"
    "CED or dense by serving.ced) or one decode step at position POS. Each node with its tile,\n"
    "flags and the nodes it waits for; --verbose adds every data access.\n"
    "  --hit C      a prefix hit: the global entries of [0, C) are cached; by default (or\n"
    "               --swa-miss) the encoder replays [C - replay.encoder, C) with global writes\n"
    "               off (SPEC 6.5 path b), and C must be a multiple of every source's ratio\n"
    "  --swa-hit    with --hit: the encoder snapshot at C is restored instead (path a; any C)\n"
    "               (`cedar plan cost --hit C` takes the same flags and the same rule)\n"
    "  --json       the graph as one JSON object: nodes (name, op, layer, tile, first\n"
    "               position, positions, the nodes each waits for), edges, token-layers\n"
    "N + the tokens a run generates may not pass the plan's positions (model.rope.csa).\n";
static const char dot_usage[] =
    "usage: cedar graph dot [--plan P] [--prompt-len N | --decode POS] [--chunk C] [--replay R]\n"
    "                       [--hit C [--swa-miss | --swa-hit]] [-o|--out FILE] [--json]\n"
    "The same graph as Graphviz DOT (stdout, or FILE): one box per node, one arrow per edge.\n"
    "  --json       {\"plan\": name, \"dot\": the DOT text} instead of the bare text\n";

static int parse(int argc, char **argv, const char *cmd, const char *usage, struct gopts *o) {
  static const struct option opts[] = {{"plan", required_argument, NULL, 'p'},
                                       {"prompt-len", required_argument, NULL, 'n'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"chunk", required_argument, NULL, 'c'},
                                       {"replay", required_argument, NULL, 'r'},
                                       {"verbose", no_argument, NULL, 'v'},
                                       {"hit", required_argument, NULL, 'H'},
                                       {"swa-hit", no_argument, NULL, 'S'},
                                       {"swa-miss", no_argument, NULL, 'M'},
                                       {"json", no_argument, NULL, 'j'},
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
  while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
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
    case 'M': o->swa_miss = true; break;
    case 'j': o->json = true; break;
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
  if (o->swa_miss && !o->hit) return cli_usage_error(cmd, "--swa-miss needs --hit C");
  if (o->swa_miss && o->swa_hit) return cli_usage_error(cmd, "give one of --swa-miss (the default) and --swa-hit");
  if (o->out && cli_check_out(cmd, "--out", o->out)) return 1;
  if (o->decode && o->hit) return cli_usage_error(cmd, "--hit is for a prefill, not --decode");
  return -1;
}

static int build(const struct gopts *o, const char *cmd, struct plan *p, struct graph *g) {
  if (cli_load_plan("graph", o->plan, p)) return 1;
  char err[512];
  int64_t last = o->decode ? o->decode_pos + 1 : o->prompt_len;
  if (last > plan_max_positions(p)) {
    fprintf(stderr, "cedar %s: %s %lld: plan %s holds at most %lld positions (model.rope.csa)\n", cmd,
            o->decode ? "--decode" : "--prompt-len", (long long)(o->decode ? o->decode_pos : o->prompt_len), p->name,
            (long long)plan_max_positions(p));
    plan_free(p);
    return 1;
  }
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

/* The graph as JSON (`graph show --json`). */
static cJSON *graph_json(const struct graph *g) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "plan", g->plan->name);
  cJSON_AddNumberToObject(j, "prompt", (double)g->n_prompt);
  cJSON_AddNumberToObject(j, "chunk", g->chunk);
  cJSON_AddNumberToObject(j, "decoder_replay", (double)g->replay);
  cJSON_AddNumberToObject(j, "hit", (double)g->hit);
  cJSON_AddNumberToObject(j, "encoder_start", (double)g->encoder_start);
  cJSON_AddNumberToObject(j, "token_layers", (double)g->token_layers);
  cJSON_AddNumberToObject(j, "transfer_nodes", g->n_transfer);
  int64_t edges = 0;
  cJSON *nodes = cJSON_AddArrayToObject(j, "nodes");
  for (int k = 0; k < g->n_node; k++) {
    const struct graph_node *nd = &g->node[k];
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "name", nd->name);
    cJSON_AddStringToObject(n, "op", graph_op_name(nd->op));
    cJSON_AddNumberToObject(n, "layer", nd->layer);
    cJSON_AddNumberToObject(n, "tile", nd->chunk);
    cJSON_AddNumberToObject(n, "first", (double)nd->a);
    cJSON_AddNumberToObject(n, "positions", nd->n);
    cJSON *d = cJSON_AddArrayToObject(n, "waits_for");
    for (int e = 0; e < nd->n_dep; e++) cJSON_AddItemToArray(d, cJSON_CreateNumber(nd->dep[e]));
    edges += nd->n_dep;
    cJSON_AddItemToArray(nodes, n);
  }
  cJSON_AddNumberToObject(j, "edges", (double)edges);
  return j;
}

static int graph_show(int argc, char **argv) {
  struct gopts o;
  int rc = parse(argc, argv, "graph show", show_usage, &o);
  if (rc >= 0) return rc;
  struct plan p;
  struct graph g;
  if (build(&o, "graph show", &p, &g)) return 1;
  if (o.json)
    cli_print_json(graph_json(&g));
  else
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
  char *text = NULL;
  size_t text_len = 0;
  FILE *f = open_memstream(&text, &text_len);
  CEDAR_ASSERT(f);
  graph_dot(&g, f);
  fclose(f);
  if (o.json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "plan", p.name);
    cJSON_AddStringToObject(j, "dot", text);
    free(text);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    text_len = strlen(s) + 1;
    text = cedar_xmalloc(text_len + 1);
    snprintf(text, text_len + 1, "%s\n", s);
    cJSON_free(s);
  }
  rc = 0;
  char err[1024]; /* base/file.h: a temporary renamed into place only when whole */
  if (!o.out) fwrite(text, 1, text_len, stdout);
  else if (cedar_write_file(o.out, text, text_len, err, sizeof err)) {
    fprintf(stderr, "cedar graph dot: %s\n", err);
    rc = 1;
  }
  free(text);
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

/* cmd_view.c: `cedar view TRACE.json [--graph G] [--plan P] -o out.html`:
 * one self-contained HTML page showing a trace (viz/view.h reads it and
 * writes the page; viz/view.js draws it). Tested by tests/cli/view.sh and
 * tests/cli/view_browser.sh; docs/viz.md.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"
#include "cli/cli.h"
#include "scheduler/plan.h"
#include "viz/view.h"

static const char usage[] =
    "usage: cedar view TRACE.json [--graph G.dot] [--plan P.yaml] -o OUT.html [--json]\n"
    "Write one self-contained HTML page (no server, no network) showing a Chrome Trace Event\n"
    "file, as `cedar run --trace` writes it: a timeline lane per worker grouped by rank, the\n"
    "prefill chunks, tasks coloured by their layer's mode (full, reindex, reuse, swa_only; other\n"
    "op groups by op), dependency and transfer arrows between lanes; on hover a task's layer,\n"
    "chunk, positions, bytes and time.\n"
    "  --graph G   the prefill graph as DOT (`cedar run --dot G`, `cedar graph dot`): drawn\n"
    "              by level with the critical path marked (node weights: the task times of\n"
    "              the trace's first prefill)\n"
    "  --plan P    the plan that ran: its layer table and buses, and graph colours by mode\n"
    "  -o OUT      the page to write (required)\n"
    "  --json      print what was written as JSON (out, tasks, lanes, cross_lane_edges, graph)\n"
    "Open OUT in any browser; docs/viz.md describes the page.\n";

/* --json: what was written, as the summary line says it. */
static void print_json(const struct viz_view *v, const char *trace, const char *out) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "out", out);
  cJSON_AddStringToObject(j, "trace", trace);
  cJSON_AddNumberToObject(j, "tasks", v->n_ev);
  cJSON_AddNumberToObject(j, "lanes", v->n_lane);
  cJSON_AddNumberToObject(j, "cross_lane_edges", v->n_flow);
  if (v->has_graph) {
    cJSON *g = cJSON_AddObjectToObject(j, "graph");
    cJSON_AddNumberToObject(g, "nodes", v->g.n_node);
    cJSON_AddNumberToObject(g, "critical_path_nodes", v->g.n_crit);
    cJSON_AddNumberToObject(g, "critical_path_weight", v->g.crit_w);
    cJSON_AddStringToObject(g, "weight_unit", v->g.measured ? "us" : "nodes");
  } else {
    cJSON_AddNullToObject(j, "graph");
  }
  cli_print_json(j);
}

int cmd_view(int argc, char **argv) {
  static const struct option opts[] = {{"graph", required_argument, NULL, 'g'},
                                       {"plan", required_argument, NULL, 'p'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  const char *graph = NULL, *plan_path = NULL, *out = NULL;
  bool json = false;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "g:p:o:h", opts, NULL)) != -1) {
    switch (c) {
    case 'g': graph = optarg; break;
    case 'p': plan_path = optarg; break;
    case 'o': out = optarg; break;
    case 'j': json = true; break;
    case 'h': fputs(usage, stdout); return 0;
    default:
      fputs(usage, stderr);
      return cli_usage_error("view", "unknown option or missing value: %s", argv[optind - 1]);
    }
  }
  if (optind != argc - 1) {
    fputs(usage, stderr);
    return cli_usage_error("view", optind >= argc ? "give one trace file" : "give one trace file, not %d",
                           argc - optind);
  }
  if (!out) {
    fputs(usage, stderr);
    return cli_usage_error("view", "give the page to write: -o OUT.html");
  }
  const char *trace = argv[optind];
  char err[512];
  struct viz_view v;
  if (viz_view_read_trace(&v, trace, err, sizeof err)) {
    fprintf(stderr, "cedar view: %s\n", err);
    return 1;
  }
  struct plan p;
  bool have_plan = false;
  int rc = 0;
  if (graph && viz_view_read_graph(&v, graph, err, sizeof err)) {
    fprintf(stderr, "cedar view: %s\n", err);
    rc = 1;
  }
  if (!rc && plan_path) {
    if (cli_load_plan("view", plan_path, &p)) rc = 1;
    else have_plan = true;
  }
  if (!rc && viz_view_write_html(&v, have_plan ? &p : NULL, trace, out, err, sizeof err)) {
    fprintf(stderr, "cedar view: %s\n", err);
    rc = 1;
  }
  if (!rc && json) {
    print_json(&v, trace, out);
  } else if (!rc) {
    printf("cedar view: %s: %d tasks on %d lanes, %d cross-lane edges", out, v.n_ev, v.n_lane, v.n_flow);
    if (v.has_graph)
      printf("; graph %d nodes, critical path %d nodes (%s %.1f)", v.g.n_node, v.g.n_crit,
             v.g.measured ? "us" : "nodes", v.g.crit_w);
    printf("\n");
  }
  if (have_plan) plan_free(&p);
  viz_view_free(&v);
  return rc;
}

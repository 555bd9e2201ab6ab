/* cmd_plan.c: `cedar plan check|show|dot` and the `cedar plan` dispatch
 * (cost and diff live in cmd_plan_cost.c). Every subcommand takes --json.
 * Tested by tests/cli/plan_tools.sh. */
#include <cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dist/dist.h"
#include "base/check.h"
#include "base/file.h"
#include "runtime/node/backend.h"
#include "cli/cli.h"
#include "scheduler/plan.h"
#include "scheduler/plan_bus.h"
#include "viz/plan_dot.h"

static const struct cli_sub plan_cmds[] = {
    {"check", cmd_plan_check, "validate plans; exit 0 when all are valid"},
    {"show", cmd_plan_show, "the resolved layer table, buses and totals"},
    {"cost", cmd_plan_cost, "memory and work accounting from the plan alone"},
    {"diff", cmd_plan_diff, "the accounting of two plans side by side"},
    {"dot", cmd_plan_dot, "the layer and bus ownership graph as Graphviz DOT"},
    {"import", cmd_plan_import, "the plan a released checkpoint's config.json implies"},
    {"config", cmd_plan_config, "the config.json a plan implies (the inverse of import)"},
};

int cmd_plan(int argc, char **argv) {
  return cli_dispatch("plan", "[options] [FILE...]",
                      "FILE defaults to the default plan (" CEDAR_DEFAULT_PLAN "). Plans are documented in docs/plans.md.",
                      plan_cmds, sizeof plan_cmds / sizeof plan_cmds[0], argc, argv);
}

/* Parse --json/--help (and -o for dot); returns -1 to continue, else an exit status. */
static int parse_common(int argc, char **argv, const char *cmd, const char *usage, bool *json, const char **out) {
  static const struct option opts[] = {
      {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {"output", required_argument, NULL, 'o'},
      {"out", required_argument, NULL, 'o'}, {0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, out ? "ho:" : "h", opts, NULL)) != -1) {
    switch (c) {
      case 'j': *json = true; break;
      case 'h': fputs(usage, stdout); return 0;
      case 'o':
        if (!out) return cli_usage_error(cmd, "--output is not an option of this command");
        *out = optarg;
        break;
      default: return cli_usage_error(cmd, "bad option");
    }
  }
  return -1;
}

static cJSON *diags_json(const struct plan_diags *d, bool warnings) {
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 0; i < d->n; i++) {
    if (d->d[i].warning != warnings) continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "file", d->d[i].mark.file ? d->d[i].mark.file : "");
    cJSON_AddNumberToObject(e, "line", d->d[i].mark.line);
    cJSON_AddNumberToObject(e, "column", d->d[i].mark.col);
    cJSON_AddStringToObject(e, "message", d->d[i].msg);
    if (d->d[i].hint) cJSON_AddStringToObject(e, "hint", d->d[i].hint);
    cJSON_AddItemToArray(arr, e);
  }
  return arr;
}

/* Where the plan's Engram tables live (serving.engram, docs/runtime.md). */
static const char *engram_where(const struct plan *p, char *buf, size_t len) {
  if (p->serving.engram_tier != PLAN_ENGRAM_TIER_MMAP)
    snprintf(buf, len, "memory (with the other weights; resident)");
  else
    snprintf(buf, len, "mmap (%s%s; paged in by the prefetch, not counted resident)",
             p->serving.engram_file ? "file " : "the weights file or the checkpoint's shards, or for synthetic weights the derived file",
             p->serving.engram_file ? p->serving.engram_file : "");
  return buf;
}

int cmd_plan_check(int argc, char **argv) {
  static const char usage[] =
      "usage: cedar plan check [--json] FILE...\n"
      "Validate each plan (syntax, keys and types, then the schedule rules).\n"
      "Prints every problem as file:line:col with a hint; exit 0 when all plans are valid, 1 otherwise.\n";
  bool json = false;
  int rc = parse_common(argc, argv, "plan check", usage, &json, NULL);
  if (rc >= 0) return rc;
  if (optind == argc) return cli_usage_error("plan check", "name at least one plan file");
  cJSON *arr = json ? cJSON_CreateArray() : NULL;
  int bad = 0;
  for (int i = optind; i < argc; i++) {
    struct plan p;
    struct plan_diags d = {0};
    int lrc = plan_load(argv[i], &p, &d);
    /* A plan the language accepts may still place a phase where this build
     * cannot run it (runtime/node/backend.h): that is refused here too. */
    char perr[512] = "";
    struct plan_mark at = {0};
    int prc = lrc ? 0 : rt_placement_check(&p, &at, perr, sizeof perr);
    bad += lrc != 0 || prc != 0;
    if (json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "file", argv[i]);
      cJSON_AddBoolToObject(o, "valid", lrc == 0 && prc == 0);
      cJSON *errs = diags_json(&d, false);
      cJSON_AddItemToObject(o, "warnings", diags_json(&d, true));
      if (prc) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", at.file ? at.file : argv[i]);
        cJSON_AddNumberToObject(e, "line", at.line);
        cJSON_AddNumberToObject(e, "column", at.col);
        cJSON_AddStringToObject(e, "message", perr);
        cJSON_AddItemToArray(errs, e);
      }
      cJSON_AddItemToObject(o, "errors", errs);
      if (!lrc) cJSON_AddStringToObject(o, "engram_tier", engram_where(&p, perr, sizeof perr));
      cJSON_AddItemToArray(arr, o);
    } else if (lrc) {
      plan_diags_print(&d, stderr);
    } else if (prc) {
      fprintf(stderr, "%s%s%s\n", at.file ? "" : argv[i], at.file ? "" : ": ", perr);
    } else {
      plan_diags_print(&d, stderr); /* warnings */
      printf("%s: ok (%s, %d layers)\n", argv[i], p.name, p.n_layers);
      struct plan_totals t;
      plan_totals(&p, &t);
      if (t.engram) printf("  Engram tables: %s\n", engram_where(&p, perr, sizeof perr));
    }
    if (!lrc) plan_free(&p);
    plan_diags_free(&d);
  }
  if (json) cli_print_json(arr);
  else if (bad) fprintf(stderr, "%d of %d plan(s) invalid\n", bad, argc - optind);
  return bad ? 1 : 0;
}

/* Load FILE (or the default plan) for show/dot; prints diagnostics. */
static int load_one(int argc, char **argv, const char *cmd, struct plan *p) {
  if (argc - optind > 1) return cli_usage_error(cmd, "takes one plan file");
  return cli_load_plan(cmd, optind < argc ? argv[optind] : NULL, p) ? 1 : -1;
}

static void fmt_src(int src, int self, char *buf, size_t n) {
  if (src < 0) snprintf(buf, n, "-");
  else if (src == self) snprintf(buf, n, "L%d (own)", src);
  else snprintf(buf, n, "L%d", src);
}

static void show_text(const struct plan *p, const struct plan_bus *bus, int n_bus, const struct plan_totals *t) {
  printf("plan %s (%s)%s%s\n", p->name, p->path, p->description ? ": " : "", p->description ? p->description : "");
  printf("model: %d layers, hidden %d, %d heads x %d (rope %d), q rank %d, indexer %d x %d, top-k %d, window %d\n",
         p->n_layers, p->model.hidden, p->model.heads, p->model.head_dim, p->model.rope_dim, p->model.q_rank,
         p->model.idx_heads, p->model.idx_head_dim, p->model.topk, p->model.window);
  printf("indexer keys: %s\n", p->model.idx_key_slot == PLAN_KEY_SLOT_VENDOR
                                    ? "key_slot vendor (one shared slot, republished by a KV source on a tile that "
                                      "completes a group; docs/model.md s3.2)"
                                    : "key_slot own_source (each index layer scores its KV source's own keys)");
  printf("serving: CED %s, replay encoder %d / decoder %d, prefill chunk %d, page %d tokens\n\n",
         p->serving.ced ? "on" : "off (dense baseline)", p->serving.replay_encoder, p->serving.replay_decoder,
         p->serving.prefill_chunk, p->serving.page_tokens);
  printf("%-6s %-8s %-9s %-5s %-10s %-10s %-9s %-12s %s\n", "layer", "region", "mode", "ratio", "KV source",
         "Top-K src", "SWA owner", "candidates", "engram");
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    char kv[24], tk[24], ratio[8], cand[24];
    fmt_src(l->kv_src, i, kv, sizeof kv);
    fmt_src(l->topk_src, i, tk, sizeof tk);
    snprintf(ratio, sizeof ratio, l->ratio ? "%d" : "-", l->ratio);
    if (l->cand == PLAN_CAND_READ) snprintf(cand, sizeof cand, "read L%d", l->pool_src);
    else snprintf(cand, sizeof cand, "%s", l->cand == PLAN_CAND_BUILD ? "build" : "-");
    printf("L%-5d %-8s %-9s %-5s %-10s %-10s L%-8d %-12s %s\n", i, plan_region_name(l->region),
           plan_mode_name(l->mode), ratio, kv, tk, i, cand, l->engram ? "yes" : "");
  }
  printf("\n%-15s %-7s %s\n", "bus", "writer", "readers");
  char set[4096];
  for (int b = 0; b < n_bus; b++)
    printf("%-15s L%-6d %s\n", plan_bus_name(bus[b].kind), bus[b].writer,
           plan_layer_set_str(bus[b].readers, bus[b].n_readers, set, sizeof set));
  printf("\ntotals: %d KV sources, %d index sources (%d reindex), %d reuse layers, %d SWA-only layers, "
         "%d CSA2 layers; %d encoder + %d decoder layers; %d Engram\n",
         t->kv_sources, t->index_sources, t->reindex, t->reuse, t->swa_only, t->csa, t->encoder_layers,
         t->decoder_layers, t->engram);
}

static cJSON *int_array(const int *v, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
  return a;
}

static void show_json(const struct plan *p, const struct plan_bus *bus, int n_bus, const struct plan_totals *t) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", p->name);
  cJSON_AddStringToObject(o, "path", p->path);
  cJSON_AddBoolToObject(o, "ced", p->serving.ced);
  cJSON_AddStringToObject(o, "key_slot", p->model.idx_key_slot == PLAN_KEY_SLOT_VENDOR ? "vendor" : "own_source");
  cJSON *layers = cJSON_AddArrayToObject(o, "layers");
  for (int i = 0; i < p->n_layers; i++) {
    const struct plan_layer *l = &p->layer[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "layer", i);
    cJSON_AddStringToObject(e, "region", plan_region_name(l->region));
    cJSON_AddStringToObject(e, "mode", plan_mode_name(l->mode));
    cJSON_AddNumberToObject(e, "ratio", l->ratio);
    cJSON_AddNumberToObject(e, "kv_source", l->kv_src);
    cJSON_AddNumberToObject(e, "topk_source", l->topk_src);
    cJSON_AddNumberToObject(e, "swa_owner", i);
    cJSON_AddStringToObject(e, "candidates", plan_cand_name(l->cand));
    cJSON_AddNumberToObject(e, "pool_source", l->pool_src);
    cJSON_AddBoolToObject(e, "engram", l->engram);
    cJSON_AddItemToArray(layers, e);
  }
  cJSON *buses = cJSON_AddArrayToObject(o, "buses");
  for (int b = 0; b < n_bus; b++) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "bus", plan_bus_name(bus[b].kind));
    cJSON_AddNumberToObject(e, "writer", bus[b].writer);
    cJSON_AddItemToObject(e, "readers", int_array(bus[b].readers, bus[b].n_readers));
    cJSON_AddItemToArray(buses, e);
  }
  cJSON *tot = cJSON_AddObjectToObject(o, "totals");
  cJSON_AddNumberToObject(tot, "kv_sources", t->kv_sources);
  cJSON_AddNumberToObject(tot, "index_sources", t->index_sources);
  cJSON_AddNumberToObject(tot, "reindex_layers", t->reindex);
  cJSON_AddNumberToObject(tot, "reuse_layers", t->reuse);
  cJSON_AddNumberToObject(tot, "swa_only_layers", t->swa_only);
  cJSON_AddNumberToObject(tot, "csa_layers", t->csa);
  cJSON_AddNumberToObject(tot, "encoder_layers", t->encoder_layers);
  cJSON_AddNumberToObject(tot, "decoder_layers", t->decoder_layers);
  cJSON_AddNumberToObject(tot, "engram_layers", t->engram);
  cli_print_json(o);
}

int cmd_plan_show(int argc, char **argv) {
  static const char usage[] =
      "usage: cedar plan show [--json] [FILE]\n"
      "Print the resolved layer table (region, mode, ratio, KV source, Top-K source, SWA owner,\n"
      "candidate pool, Engram), the bus table (writer -> readers) and totals.\n";
  bool json = false;
  int rc = parse_common(argc, argv, "plan show", usage, &json, NULL);
  if (rc >= 0) return rc;
  struct plan p;
  if ((rc = load_one(argc, argv, "plan show", &p)) >= 0) return rc;
  struct plan_bus *bus = cedar_xcalloc(4 * (size_t)p.n_layers + 1, sizeof *bus);
  int n = plan_buses(&p, bus, 4 * p.n_layers + 1);
  struct plan_totals t;
  plan_totals(&p, &t);
  if (json) show_json(&p, bus, n, &t);
  else show_text(&p, bus, n, &t);
  free(bus);
  plan_free(&p);
  return 0;
}

int cmd_plan_dot(int argc, char **argv) {
  static const char usage[] =
      "usage: cedar plan dot [-o|--out OUT.dot] [--json] [FILE]\n"
      "Write the layer and bus ownership graph as Graphviz DOT (to stdout, or OUT.dot);\n"
      "render it with `dot -Tsvg`. With --json, print {\"dot\": \"...\"} instead.\n";
  bool json = false;
  const char *out = NULL;
  int rc = parse_common(argc, argv, "plan dot", usage, &json, &out);
  if (rc >= 0) return rc;
  struct plan p;
  if (out && cli_check_out("plan dot", "--out", out)) return 1;
  if ((rc = load_one(argc, argv, "plan dot", &p)) >= 0) return rc;
  char *buf = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&buf, &len);
  CEDAR_ASSERT(mem);
  viz_plan_dot_write(&p, mem);
  fclose(mem);
  plan_free(&p);
  rc = 0;
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "dot", buf);
    cli_print_json(o);
  } else if (out) {
    char err[1024]; /* base/file.h: a temporary renamed into place only when whole */
    if (cedar_write_file(out, buf, len, err, sizeof err)) {
      fprintf(stderr, "cedar plan dot: %s\n", err);
      rc = 1;
    }
  } else {
    fwrite(buf, 1, len, stdout);
  }
  free(buf);
  return rc;
}

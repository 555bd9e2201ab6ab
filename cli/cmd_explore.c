/* cmd_explore.c: `cedar explore BASE.yaml --vary KEY=V1,V2,... [--vary ...]
 * [--measure time,drift,quality --text T] [--json] [--out DIR]`: the schedule study. Every
 * combination of the values is one variant plan, written as a YAML file
 * that `extends` BASE (so a variant is an ordinary plan: `cedar plan check`,
 * `cedar run --plan` take it) and loaded with the plan loader; a variant the
 * loader refuses is reported with its error. Each valid variant is costed
 * from the plan alone (scheduler/plan_cost.c: memory per request at N
 * tokens, cold-prefill token-layers of n tokens, decode indexer key-dots);
 * --measure runs it (cli/study.c: `cedar run --exact-replay` on the direct
 * executor) for prefill and decode time and the drift of bounded replay;
 * --measure quality scores a text through it (cli/study.c: `cedar eval
 * --dense-ref`: held-out bits per byte, agreement with the dense forward).
 * The Pareto front of memory against work (and drift, and bits per byte,
 * when measured) is printed and, with --out, plotted (gnuplot).
 *
 * Keys: a plan path (model.swa.window, serving.replay.decoder,
 * model.indexer.topk, serving.prefill_chunk, ...), a layer field
 * (layers.24.mode, layers.20-23.candidates), or a schedule:
 * schedule.reindex_period=P (decoder layers after the first decoder KV
 * source: reindex every P layers, reuse between; 0: none) and
 * schedule.decoder_source=L (a second decoder KV source at layer L building
 * its own candidate pool, as plans/alt-two-dec-sources.yaml; none: as BASE).
 * Tested by tests/cli/explore.sh; docs/viz.md.
 */
#define _GNU_SOURCE /* open_memstream, mkdtemp, realpath */
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "base/quote.h"
#include "cli/cli.h"
#include "cli/study.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"

#define MAX_KEYS 8
#define MAX_VALUES 32
#define MAX_VARIANTS 512

static const char usage[] =
    "usage: cedar explore BASE.yaml --vary KEY=V1,V2,... [--vary ...] [--tokens N] [--prompt n]\n"
    "                     [--measure time,drift,quality] [--measure-prompt M] [--decode S] [--max-weights B]\n"
    "                     [--text FILE [--context N] [--stride S] [--model DIR | --weights W]] [--json] [--out DIR]\n"
    "Every combination of the values is a variant of BASE (a plan file that extends it). Each is\n"
    "loaded (a variant the plan loader refuses is listed with its error) and costed from the plan:\n"
    "memory per request at N tokens (default 65536: global KV, SWA, tails), work = token-layers of\n"
    "a cold prefill of n tokens (default 4096), and decode indexer key-dots at N. The Pareto front\n"
    "of memory against work (and drift and bits per byte, when measured) is marked with *.\n"
    "KEY is one of:\n"
    "  a plan path            model.swa.window, serving.replay.decoder, model.indexer.topk, ...\n"
    "  layers.AT.FIELD        a layer override: layers.24.mode=reindex,reuse; AT may be a range 20-23\n"
    "  schedule.reindex_period=P  decoder layers after the first decoder KV source: reindex every P\n"
    "                         layers, reuse between (0: no reindex layers)\n"
    "  schedule.decoder_source=L  a second decoder KV source at layer L with its own candidate pool\n"
    "                         (as plans/alt-two-dec-sources.yaml); none: as BASE\n"
    "  --measure time,drift   also run each valid variant: `cedar run --prompt-len M --max-new S\n"
    "                         --executor direct` (M default 256, S default 4; synthetic weights),\n"
    "                         drift with --exact-replay; plans whose weights exceed --max-weights\n"
    "                         (default 2e9 bytes) are not run\n"
    "  --measure quality      also score --text FILE with each valid variant: `cedar eval --dense-ref`\n"
    "                         (--context N ids per window, default 256, --stride S, default N/2):\n"
    "                         held-out bits per byte, next-token accuracy, and top-1 agreement and\n"
    "                         KL against the same variant with serving.ced false (the dense forward);\n"
    "                         the weights: --model DIR (a released checkpoint: variants whose layer\n"
    "                         table differs from its config are refused by eval), --weights W, or\n"
    "                         synthetic (seed 0: quality then means nothing)\n"
    "  --json                 print one JSON object instead of the table\n"
    "  --out DIR              keep the variant plans (DIR/variants/), write DIR/explore.json and plot\n"
    "                         the front: DIR/pareto.png (gnuplot)\n";

struct key {
  char name[96];
  char *val[MAX_VALUES];
  int n_val;
};

struct variant {
  int id;
  int pick[MAX_KEYS];
  char file[PATH_MAX];
  bool valid;
  char *error;
  struct study_mem mem;
  int64_t work, dense_work, key_dots;
  struct study_run run;
  struct study_quality q;
  bool measured, q_measured, pareto;
};

struct xopts {
  const char *base, *out;
  struct key key[MAX_KEYS];
  int n_key;
  int64_t tokens, prompt;
  bool time, drift, quality, json;
  struct study_run_opts ro;
  struct study_quality_opts qo;
};

/* ---- options ------------------------------------------------------------- */

static bool word_ok(const char *s, const char *extra) {
  if (!*s) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && !strchr(extra, *s)) return false;
  return true;
}

static int add_vary(struct xopts *o, char *arg) {
  char *eq = strchr(arg, '=');
  if (o->n_key == MAX_KEYS) return cli_usage_error("explore", "at most %d --vary keys", MAX_KEYS);
  if (!eq || eq == arg || !eq[1]) return cli_usage_error("explore", "--vary %s: write KEY=V1,V2,...", arg);
  *eq = 0;
  struct key *k = &o->key[o->n_key];
  if (strlen(arg) >= sizeof k->name || !word_ok(arg, "._-") || !strchr(arg, '.'))
    return cli_usage_error("explore", "--vary %s: a key is a dotted plan path such as model.swa.window", arg);
  for (int i = 0; i < o->n_key; i++)
    if (!strcmp(o->key[i].name, arg)) return cli_usage_error("explore", "--vary %s is given twice", arg);
  static const char *const top[] = {"model.", "serving.", "formats.", "layers.", "schedule."};
  bool ok = false;
  for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) ok |= !strncmp(arg, top[i], strlen(top[i]));
  if (!ok) return cli_usage_error("explore", "--vary %s: keys start with model., serving., formats., layers. or schedule.", arg);
  if (!strncmp(arg, "schedule.", 9) && strcmp(arg, "schedule.reindex_period") && strcmp(arg, "schedule.decoder_source"))
    return cli_usage_error("explore", "--vary %s: the schedules are schedule.reindex_period and schedule.decoder_source", arg);
  if (!strncmp(arg, "layers.", 7)) {
    char at[32], field[32];
    if (sscanf(arg, "layers.%31[0-9-].%31[a-z_]", at, field) != 2 || !isdigit((unsigned char)at[0]))
      return cli_usage_error("explore", "--vary %s: write layers.AT.FIELD (layers.24.mode, layers.20-23.candidates)", arg);
  }
  snprintf(k->name, sizeof k->name, "%s", arg);
  for (char *s = eq + 1;;) {
    char *c = strchr(s, ',');
    if (c) *c = 0;
    if (k->n_val == MAX_VALUES) return cli_usage_error("explore", "--vary %s: at most %d values", arg, MAX_VALUES);
    if (!word_ok(s, "._+-:")) return cli_usage_error("explore", "--vary %s: value '%s' is not a plain YAML scalar", arg, s);
    k->val[k->n_val++] = s;
    if (!c) break;
    s = c + 1;
  }
  o->n_key++;
  return 0;
}

static int parse(int argc, char **argv, struct xopts *o) {
  static const struct option opts[] = {{"vary", required_argument, NULL, 'v'},
                                       {"tokens", required_argument, NULL, 't'},
                                       {"prompt", required_argument, NULL, 'p'},
                                       {"measure", required_argument, NULL, 'm'},
                                       {"measure-prompt", required_argument, NULL, 'M'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"max-weights", required_argument, NULL, 'w'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"out", required_argument, NULL, 'o'},
                                       {"text", required_argument, NULL, 'T'},
                                       {"context", required_argument, NULL, 'c'},
                                       {"stride", required_argument, NULL, 's'},
                                       {"model", required_argument, NULL, 'D'},
                                       {"weights", required_argument, NULL, 'W'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  o->tokens = 65536;
  o->prompt = 4096;
  o->ro = (struct study_run_opts){.prompt = 256, .decode = 4, .max_weights = 2000000000};
  optind = 1;
  opterr = 0;
  int c, rc;
  int64_t v;
  while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
    switch (c) {
    case 'v':
      if ((rc = add_vary(o, optarg))) return rc;
      break;
    case 't':
      if (!cli_parse_int(optarg, 1, PLAN_COST_MAX_TOKENS, &o->tokens)) return cli_usage_error("explore", "--tokens %s", optarg);
      break;
    case 'p':
      if (!cli_parse_int(optarg, 1, PLAN_COST_MAX_TOKENS, &o->prompt)) return cli_usage_error("explore", "--prompt %s", optarg);
      break;
    case 'm':
      for (char *s = optarg;;) {
        size_t n = strcspn(s, ",");
        if (n == 4 && !strncmp(s, "time", 4)) o->time = true;
        else if (n == 5 && !strncmp(s, "drift", 5)) o->drift = true;
        else if (n == 7 && !strncmp(s, "quality", 7)) o->quality = true;
        else return cli_usage_error("explore", "--measure %s: give time, drift, quality or a list of them", optarg);
        if (!s[n]) break;
        s += n + 1;
      }
      break;
    case 'M':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->ro.prompt)) return cli_usage_error("explore", "--measure-prompt %s", optarg);
      break;
    case 'd':
      if (!cli_parse_int(optarg, 1, 4096, &v)) return cli_usage_error("explore", "--decode %s", optarg);
      o->ro.decode = (int)v;
      break;
    case 'w':
      if (!cli_parse_int(optarg, 1, INT64_MAX, &v)) return cli_usage_error("explore", "--max-weights %s", optarg);
      o->ro.max_weights = (uint64_t)v;
      break;
    case 'j': o->json = true; break;
    case 'o': o->out = optarg; break;
    case 'T': o->qo.text = optarg; break;
    case 'D': o->qo.model = optarg; break;
    case 'W': o->qo.weights = optarg; break;
    case 'c':
      if (!cli_parse_int(optarg, 2, 1 << 24, &o->qo.context)) return cli_usage_error("explore", "--context %s", optarg);
      break;
    case 's':
      if (!cli_parse_int(optarg, 1, 1 << 24, &o->qo.stride)) return cli_usage_error("explore", "--stride %s", optarg);
      break;
    case 'h': fputs(usage, stdout); return -1;
    default: fputs(usage, stderr); return cli_usage_error("explore", "unknown option or missing value: %s", argv[optind - 1]);
    }
  }
  if (optind != argc - 1) {
    fputs(usage, stderr);
    return cli_usage_error("explore", "give one BASE plan");
  }
  if (!o->n_key) return cli_usage_error("explore", "give at least one --vary KEY=V1,V2,...");
  o->base = argv[optind];
  o->ro.drift = o->drift;
  if (o->quality != (o->qo.text != NULL))
    return cli_usage_error("explore", o->quality ? "--measure quality scores a held-out text: give --text FILE"
                                                 : "--text goes with --measure quality");
  if ((o->qo.model || o->qo.weights || o->qo.context || o->qo.stride) && !o->quality)
    return cli_usage_error("explore", "--model, --weights, --context and --stride go with --measure quality");
  if (o->qo.model && o->qo.weights) return cli_usage_error("explore", "give --model DIR or --weights W, not both");
  o->qo.max_weights = o->ro.max_weights;
  if (!o->qo.context) o->qo.context = 256;
  return 0;
}

/* ---- variant files ------------------------------------------------------------ */

/* Split "a.b.c" into at most 8 components. */
static int split(const char *s, char comp[8][48]) {
  int n = 0;
  while (*s && n < 8) {
    size_t len = strcspn(s, ".");
    snprintf(comp[n++], sizeof comp[0], "%.*s", (int)len, s);
    s += len;
    if (*s == '.') s++;
  }
  return n;
}

/* The nested mappings of the plan-path keys (sorted by path, so siblings
 * share their parents' lines). */
static void write_paths(FILE *f, const struct xopts *o, const struct variant *v) {
  int idx[MAX_KEYS], n = 0;
  for (int k = 0; k < o->n_key; k++)
    if (strncmp(o->key[k].name, "layers.", 7) && strncmp(o->key[k].name, "schedule.", 9)) idx[n++] = k;
  for (int i = 1; i < n; i++) /* insertion sort by name: prefixes group */
    for (int j = i; j > 0 && strcmp(o->key[idx[j]].name, o->key[idx[j - 1]].name) < 0; j--) {
      int t = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = t;
    }
  char prev[8][48];
  int n_prev = 0;
  for (int i = 0; i < n; i++) {
    char comp[8][48];
    int nc = split(o->key[idx[i]].name, comp), same = 0;
    while (same < n_prev && same < nc - 1 && !strcmp(prev[same], comp[same])) same++;
    for (int c = same; c < nc; c++) {
      fprintf(f, "%*s%s:", 2 * c, "", comp[c]);
      if (c == nc - 1) fprintf(f, " %s", o->key[idx[i]].val[v->pick[idx[i]]]);
      fputc('\n', f);
    }
    memcpy(prev, comp, sizeof prev);
    n_prev = nc;
  }
}

/* layer_overrides: the schedules (from BASE's resolved layers), then layers.AT.FIELD. */
static void write_layers(FILE *f, const struct xopts *o, const struct variant *v, const struct plan *base) {
  bool any = false;
#define ENTRY(...) (any ? 0 : fputs("layer_overrides:\n", f), any = true, fprintf(f, __VA_ARGS__))
  int d0 = -1;
  for (int l = 0; l < base->n_layers && d0 < 0; l++)
    if (base->layer[l].region == PLAN_DECODER && base->layer[l].mode == PLAN_FULL) d0 = l;
  for (int k = 0; k < o->n_key; k++) {
    const char *val = o->key[k].val[v->pick[k]];
    if (!strcmp(o->key[k].name, "schedule.reindex_period") && d0 >= 0) {
      long P = strtol(val, NULL, 10);
      const char *cand = base->layer[d0].cand == PLAN_CAND_BUILD ? "read" : "none";
      for (int l = d0 + 1; l < base->n_layers; l++) {
        const struct plan_layer *L = &base->layer[l];
        if (L->region != PLAN_DECODER || L->mode == PLAN_FULL || L->mode == PLAN_SWA_ONLY) continue;
        if (P > 0 && (l - d0) % P == 0) ENTRY("  - {at: %d, mode: reindex, candidates: %s}\n", l, cand);
        else ENTRY("  - {at: %d, mode: reuse, candidates: none}\n", l);
      }
    }
  }
  for (int k = 0; k < o->n_key; k++) {
    const char *val = o->key[k].val[v->pick[k]];
    if (!strcmp(o->key[k].name, "schedule.decoder_source") && strcmp(val, "none"))
      ENTRY("  - {at: %s, mode: full, candidates: build}\n", val);
  }
  for (int k = 0; k < o->n_key; k++) {
    char at[32], field[32];
    if (strncmp(o->key[k].name, "layers.", 7) || sscanf(o->key[k].name, "layers.%31[0-9-].%31[a-z_]", at, field) != 2)
      continue;
    ENTRY("  - {at: %s, %s: %s}\n", at, field, o->key[k].val[v->pick[k]]);
  }
#undef ENTRY
}

static int write_variant(const char *dir, const char *base_abs, const struct plan *base, const struct xopts *o,
                         struct variant *v, char *err, size_t err_len) {
  if (snprintf(v->file, sizeof v->file, "%s/v%d.yaml", dir, v->id) >= (int)sizeof v->file) return 1;
  struct cedar_out out; /* base/file.h: a temporary renamed into place only when whole */
  if (cedar_out_open(&out, v->file, err, err_len)) return 1;
  FILE *f = out.f;
  /* The base's path and name may hold anything (`:`, quotes, newlines):
   * they are written as quoted scalars (base/quote.h). Keys and values
   * are plain words (add_vary). */
  fprintf(f, "# cedar explore: variant %d of ", v->id);
  cedar_quote_yaml(f, o->base);
  fputc(':', f);
  for (int k = 0; k < o->n_key; k++) fprintf(f, " %s=%s", o->key[k].name, o->key[k].val[v->pick[k]]);
  fputs("\nextends: ", f);
  cedar_quote_yaml(f, base_abs);
  char *name = NULL;
  if (asprintf(&name, "%s-v%d", base->name, v->id) < 0) name = NULL;
  CEDAR_ASSERT(name != NULL);
  fputs("\nname: ", f);
  cedar_quote_yaml(f, name);
  fputc('\n', f);
  free(name);
  write_paths(f, o, v);
  write_layers(f, o, v, base);
  return cedar_out_commit(&out, err, err_len) ? 1 : 0;
}

/* ---- costing, measuring, the front --------------------------------------------- */

static void evaluate(struct variant *v, const struct xopts *o) {
  struct plan p;
  struct plan_diags d = {0};
  if (plan_load(v->file, &p, &d)) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    plan_diags_print(&d, m);
    fclose(m);
    while (len && text[len - 1] == '\n') text[--len] = 0;
    v->error = text;
    plan_diags_free(&d);
    return;
  }
  plan_diags_free(&d);
  struct plan_cost *c = cedar_xmalloc(sizeof(*c));
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = o->tokens, q.prompt = o->prompt;
  if (plan_cost_compute(&p, &q, c)) {
    v->error = cedar_xstrdup(c->error);
  } else {
    v->valid = true;
    study_mem_of(c, &v->mem);
    v->work = c->cold.token_layers;
    v->dense_work = c->cold.dense_token_layers;
    v->key_dots = c->idx_key_dots;
  }
  free(c);
  if (v->valid && (o->time || o->drift)) {
    if (!o->json) fprintf(stderr, "cedar explore: running v%d ...\n", v->id);
    v->measured = true;
    if (study_run(v->file, &p, &o->ro, &v->run) && !o->json) fprintf(stderr, "cedar explore: v%d: %s\n", v->id, v->run.why);
  }
  if (v->valid && o->quality && !study_interrupted()) {
    if (!o->json) fprintf(stderr, "cedar explore: scoring %s with v%d ...\n", o->qo.text, v->id);
    v->q_measured = true;
    if (study_quality_run(v->file, &p, &o->qo, &v->q) && !o->json)
      fprintf(stderr, "cedar explore: v%d: %s\n", v->id, v->q.why);
  }
  plan_free(&p);
}

/* Whether a dominates b (no worse in every objective, better in one). The
 * objectives: memory, work (prefill token-layers and decode key-dots), and
 * drift and held-out bits per byte when measured. */
static bool dominates(const struct variant *a, const struct variant *b, const struct xopts *o) {
  double x[5] = {(double)a->mem.total, (double)a->work, (double)a->key_dots, o->drift ? a->run.drift_rel_rms : 0,
                 o->quality ? a->q.bits_per_byte : 0};
  double y[5] = {(double)b->mem.total, (double)b->work, (double)b->key_dots, o->drift ? b->run.drift_rel_rms : 0,
                 o->quality ? b->q.bits_per_byte : 0};
  bool better = false;
  for (int i = 0; i < 5; i++) {
    if (x[i] > y[i]) return false;
    if (x[i] < y[i]) better = true;
  }
  return better;
}

static bool eligible(const struct variant *v, const struct xopts *o) {
  return v->valid && (!o->drift || v->run.ok) && (!o->quality || v->q.ok);
}

static void pareto(struct variant *v, int n, const struct xopts *o) {
  for (int i = 0; i < n; i++) {
    v[i].pareto = eligible(&v[i], o);
    for (int j = 0; j < n && v[i].pareto; j++)
      if (j != i && eligible(&v[j], o) && dominates(&v[j], &v[i], o)) v[i].pareto = false;
  }
}

/* ---- output -------------------------------------------------------------------- */

static void mb(char *b, size_t n, int64_t v) { snprintf(b, n, "%.3f MB", v / 1e6); }

static void print_table(const struct variant *v, int n, const struct xopts *o) {
  printf("cedar explore %s: %d variants; memory per request at N = %" PRId64 " tokens; work = token-layers of a cold "
         "prefill of n = %" PRId64 "\n",
         o->base, n, o->tokens, o->prompt);
  if (o->time || o->drift)
    printf("measured: cedar run on a %" PRId64 "-token prompt, --max-new %d --executor direct%s (synthetic weights)\n",
           o->ro.prompt, o->ro.decode, o->drift ? " --exact-replay" : "");
  printf("%-5s %-7s", "id", "front");
  for (int k = 0; k < o->n_key; k++) printf(" %-*s", (int)(strlen(o->key[k].name) > 8 ? strlen(o->key[k].name) : 8), o->key[k].name);
  printf(" %12s %12s %14s", "memory", "work", "key-dots/tok");
  if (o->time) printf(" %10s %9s", "prefill s", "ITL ms");
  if (o->drift) printf(" %10s", "drift");
  if (o->quality) printf(" %9s %8s %10s", "bits/byte", "top1-agr", "KL/id");
  printf("\n");
  for (int i = 0; i < n; i++) {
    printf("v%-4d %-7s", v[i].id, v[i].pareto ? "*" : v[i].valid ? "" : "invalid");
    for (int k = 0; k < o->n_key; k++)
      printf(" %-*s", (int)(strlen(o->key[k].name) > 8 ? strlen(o->key[k].name) : 8), o->key[k].val[v[i].pick[k]]);
    if (!v[i].valid) {
      const char *e = v[i].error ? v[i].error : "";
      printf(" %.*s\n", (int)strcspn(e, "\n"), e);
      continue;
    }
    char b[32];
    mb(b, sizeof b, v[i].mem.total);
    printf(" %12s %12" PRId64 " %14" PRId64, b, v[i].work, v[i].key_dots);
    if (v[i].measured && !v[i].run.ok) {
      printf(" not run: %s\n", v[i].run.why);
      continue;
    }
    if (o->time) printf(" %10.3f %9.2f", v[i].run.prefill_s, 1e3 * v[i].run.itl_s);
    if (o->drift) printf(" %10.3g", v[i].run.drift_rel_rms);
    if (o->quality && v[i].q.ok) printf(" %9.4f %8.4f %10.3g", v[i].q.bits_per_byte, v[i].q.agreement, v[i].q.kl);
    if (o->quality && !v[i].q.ok) printf(" not scored: %s", v[i].q.why);
    printf("\n");
  }
  if (o->quality)
    printf("quality: cedar eval --text %s --dense-ref (bits per byte of the text; top-1 agreement and KL against the "
           "dense ced: false forward of the same variant)\n", o->qo.text);
  printf("Pareto front (memory, work: prefill token-layers and decode key-dots%s%s):", o->drift ? ", drift" : "",
         o->quality ? ", bits per byte" : "");
  for (int i = 0; i < n; i++)
    if (v[i].pareto) printf(" v%d", v[i].id);
  printf("\n");
}

static cJSON *to_json(const struct variant *v, int n, const struct xopts *o) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "base", o->base);
  cJSON_AddNumberToObject(j, "tokens", (double)o->tokens);
  cJSON_AddNumberToObject(j, "prompt", (double)o->prompt);
  cJSON *keys = cJSON_AddArrayToObject(j, "keys");
  for (int k = 0; k < o->n_key; k++) cJSON_AddItemToArray(keys, cJSON_CreateString(o->key[k].name));
  cJSON *objs = cJSON_AddArrayToObject(j, "objectives");
  cJSON_AddItemToArray(objs, cJSON_CreateString("memory"));
  cJSON_AddItemToArray(objs, cJSON_CreateString("work.token_layers"));
  cJSON_AddItemToArray(objs, cJSON_CreateString("work.decode_key_dots"));
  if (o->drift) cJSON_AddItemToArray(objs, cJSON_CreateString("drift"));
  if (o->quality) cJSON_AddItemToArray(objs, cJSON_CreateString("quality.bits_per_byte"));
  if (o->quality) cJSON_AddStringToObject(j, "text", o->qo.text);
  cJSON *arr = cJSON_AddArrayToObject(j, "variants"), *front = cJSON_AddArrayToObject(j, "pareto");
  for (int i = 0; i < n; i++) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, x);
    cJSON_AddNumberToObject(x, "id", v[i].id);
    cJSON *vals = cJSON_AddObjectToObject(x, "values");
    for (int k = 0; k < o->n_key; k++) cJSON_AddStringToObject(vals, o->key[k].name, o->key[k].val[v[i].pick[k]]);
    if (o->out) cJSON_AddStringToObject(x, "file", v[i].file);
    cJSON_AddBoolToObject(x, "valid", v[i].valid);
    cJSON_AddBoolToObject(x, "pareto", v[i].pareto);
    if (v[i].pareto) cJSON_AddItemToArray(front, cJSON_CreateNumber(v[i].id));
    if (!v[i].valid) {
      cJSON_AddStringToObject(x, "error", v[i].error ? v[i].error : "");
      continue;
    }
    cJSON *m = cJSON_AddObjectToObject(x, "memory");
    cJSON_AddNumberToObject(m, "main_kv", (double)v[i].mem.main_kv);
    cJSON_AddNumberToObject(m, "indexer_k", (double)v[i].mem.indexer_k);
    cJSON_AddNumberToObject(m, "swa", (double)v[i].mem.swa);
    cJSON_AddNumberToObject(m, "tails", (double)v[i].mem.tails);
    cJSON_AddNumberToObject(m, "total", (double)v[i].mem.total);
    cJSON *w = cJSON_AddObjectToObject(x, "work");
    cJSON_AddNumberToObject(w, "token_layers", (double)v[i].work);
    cJSON_AddNumberToObject(w, "dense_token_layers", (double)v[i].dense_work);
    cJSON_AddNumberToObject(w, "decode_key_dots", (double)v[i].key_dots);
    if (v[i].q_measured) {
      cJSON *q = cJSON_AddObjectToObject(x, "quality");
      if (!v[i].q.ok) {
        cJSON_AddStringToObject(q, "not_run", v[i].q.why);
      } else {
        cJSON_AddStringToObject(q, "command", v[i].q.cmd);
        cJSON_AddNumberToObject(q, "tokens", (double)v[i].q.tokens);
        cJSON_AddNumberToObject(q, "bytes", (double)v[i].q.bytes);
        cJSON_AddNumberToObject(q, "bits_per_byte", v[i].q.bits_per_byte);
        cJSON_AddNumberToObject(q, "accuracy", v[i].q.accuracy);
        cJSON_AddNumberToObject(q, "dense_top1_agreement", v[i].q.agreement);
        cJSON_AddNumberToObject(q, "dense_kl_nats_per_token", v[i].q.kl);
        cJSON_AddNumberToObject(q, "dense_bits_per_byte", v[i].q.dense_bits_per_byte);
        cJSON_AddNumberToObject(q, "tokens_per_s", v[i].q.tokens_per_s);
      }
    }
    if (!v[i].measured) continue;
    cJSON *r = cJSON_AddObjectToObject(x, "measured");
    if (!v[i].run.ok) {
      cJSON_AddStringToObject(r, "not_run", v[i].run.why);
      continue;
    }
    cJSON_AddStringToObject(r, "command", v[i].run.cmd);
    cJSON_AddNumberToObject(r, "prefill_s", v[i].run.prefill_s);
    cJSON_AddNumberToObject(r, "decode_itl_s", v[i].run.itl_s);
    cJSON_AddBoolToObject(r, "state_agrees_with_plan_cost", v[i].run.state_agrees);
    if (v[i].run.has_drift) {
      cJSON_AddNumberToObject(r, "drift_rel_rms", v[i].run.drift_rel_rms);
      cJSON_AddNumberToObject(r, "drift_max_abs", v[i].run.drift_max_abs);
      cJSON_AddBoolToObject(r, "same_top1", v[i].run.same_top1);
    }
  }
  return j;
}

static int plot(const struct variant *v, int n, const struct xopts *o, char *err, size_t len) {
  FILE *f = study_open(o->out, "pareto.dat", err, len);
  if (!f) return 1;
  bool colour = o->drift || o->quality; /* column 4: bits per byte with quality, else drift */
  fprintf(f, "# id memory_bytes prefill_token_layers %s front(1/0) decode_key_dots\n",
          o->quality ? "bits_per_byte" : "drift");
  for (int i = 0; i < n; i++)
    if (eligible(&v[i], o))
      fprintf(f, "v%d %" PRId64 " %" PRId64 " %.6g %d %" PRId64 "\n", v[i].id, v[i].mem.total, v[i].work,
              o->quality ? v[i].q.bits_per_byte : o->drift ? v[i].run.drift_rel_rms : 0.0, v[i].pareto ? 1 : 0,
              v[i].key_dots);
  if (study_close(f, err, len)) return 1;
  FILE *g = study_open(o->out, "pareto.gp", err, len);
  if (!g) return 1;
  char *title = NULL; /* names BASE, so it is written by cedar_quote_gnuplot: a file name is data */
  if (asprintf(&title, "cedar explore %s: memory at N = %" PRId64 " against work%s; red rings: the Pareto front",
               o->base, o->tokens, o->quality ? "; colour: bits per byte" : o->drift ? "; colour: drift (rel. RMS)" : "") < 0)
    title = NULL;
  CEDAR_ASSERT(title != NULL);
  fprintf(g, "# cedar explore: memory against work%s, the Pareto front in red\n"
             "set terminal pngcairo noenhanced size 1500,650 font 'sans,10'\nset output 'pareto.png'\n"
             "set multiplot layout 1,2 title ",
          o->quality ? " and bits per byte" : o->drift ? " and drift" : "");
  cedar_quote_gnuplot(g, title);
  free(title);
  fputs("\nset xlabel 'memory per request (bytes)'\nset format x '%.3s %cB'\n"
        "set grid\nset offsets graph 0.05, graph 0.1, graph 0.1, graph 0.05\nset key top right\n", g);
  if (colour)
    fprintf(g, "set palette rgb 33,13,10\nset cblabel '%s'\n", o->quality ? "held-out bits per byte" : "drift (relative RMS)");
  const char *ycol[2] = {"3", "6"};
  const char *ylab[2] = {"cold prefill token-layers", "decode indexer key-dots per token"};
  for (int pn = 0; pn < 2; pn++) {
    fprintf(g, "set ylabel '%s'\nset title '%s'\n", ylab[pn], pn ? "decode work" : "prefill work");
    if (colour)
      fprintf(g, "plot 'pareto.dat' using 2:%s:4 with points pt 7 ps 1.6 palette title 'variant', \\\n", ycol[pn]);
    else
      fprintf(g, "plot 'pareto.dat' using ($5 > 0 ? 1/0 : $2):%s with points pt 7 ps 1.4 lc rgb '#888888' "
                 "title 'dominated', \\\n", ycol[pn]);
    fprintf(g, "     'pareto.dat' using ($5 > 0 ? $2 : 1/0):%s with points pt 6 ps 2.6 lw 2 lc rgb '#e00000' "
               "title 'Pareto front', \\\n     'pareto.dat' using 2:%s:1 with labels offset 1.2,0.6 font 'sans,9' "
               "notitle\n", ycol[pn], ycol[pn]);
  }
  fputs("unset multiplot\n", g);
  if (study_close(g, err, len)) return 1;
  return study_gnuplot(o->out, "pareto.gp", err, len);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int cmd_explore(int argc, char **argv) {
  struct xopts o = {0};
  int rc = parse(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  char err[512], base_abs[PATH_MAX], dir[PATH_MAX];
  if (!realpath(o.base, base_abs)) {
    fprintf(stderr, "cedar explore: %s: cannot open: %s\n", o.base, strerror(errno));
    return 1;
  }
  struct plan base;
  if (cli_load_plan("explore", o.base, &base)) return 1;
  int n = 1;
  for (int k = 0; k < o.n_key; k++) n *= o.key[k].n_val;
  if (n > MAX_VARIANTS) {
    plan_free(&base);
    return cli_usage_error("explore", "%d variants; at most %d", n, MAX_VARIANTS);
  }
  if (o.out && !study_have_gnuplot()) {
    fprintf(stderr, "cedar explore: --out plots with gnuplot, which is not installed (apt-get install gnuplot-nox)\n");
    plan_free(&base);
    return 1;
  }
  bool tmpdir = !o.out;
  study_trap_signals(); /* SIGINT/SIGTERM: stop the child, remove the temporary directory, end by the signal */
  if (o.out) {
    snprintf(dir, sizeof dir, "%s/variants", o.out);
    rc = study_mkdir(o.out, err, sizeof err) || study_mkdir(dir, err, sizeof err);
  } else {
    const char *td = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/cedar-explore-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(dir)) {
      snprintf(err, sizeof err, "cannot make a temporary directory: %s", strerror(errno));
      rc = 1;
    }
  }
  struct variant *v = calloc((size_t)n, sizeof(*v));
  CEDAR_ASSERT(v != NULL);
  for (int i = 0; i < n && !rc; i++) {
    v[i].id = i + 1;
    for (int k = o.n_key - 1, r = i; k >= 0; k--) v[i].pick[k] = r % o.key[k].n_val, r /= o.key[k].n_val;
    if (write_variant(dir, base_abs, &base, &o, &v[i], err, sizeof err)) {
      rc = 1;
    }
  }
  if (rc) fprintf(stderr, "cedar explore: %s\n", err);
  for (int i = 0; i < n && !rc && !study_interrupted(); i++) evaluate(&v[i], &o);
  if (study_interrupted()) rc = 1;
  int n_valid = 0;
  for (int i = 0; i < n; i++) n_valid += v[i].valid;
  if (!rc) {
    pareto(v, n, &o);
    cJSON *j = to_json(v, n, &o);
    if (o.out) {
      char *s = cJSON_Print(j);
      FILE *f = study_open(o.out, "explore.json", err, sizeof err);
      if (!f) rc = 1;
      else fputs(s, f), fputc('\n', f), rc = study_close(f, err, sizeof err);
      cJSON_free(s);
      if (!rc && n_valid) rc = plot(v, n, &o, err, sizeof err);
      for (int k = 0; !n_valid && k < 3; k++) { /* none valid: nothing to plot (refused below), no stale front */
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/pareto.%s", o.out, (const char *[]){"png", "gp", "dat"}[k]);
        unlink(path);
      }
      if (rc) fprintf(stderr, "cedar explore: %s\n", err);
    }
    if (o.json) cli_print_json(j);
    else {
      cJSON_Delete(j);
      print_table(v, n, &o);
      if (o.out && !rc && n_valid) printf("wrote %s/explore.json, %s/pareto.png and the variant plans in %s/\n", o.out, o.out, dir);
      bool refused = false;
      for (int i = 0; i < n; i++) refused |= !v[i].valid;
      if (!o.out && refused) printf("(the variant files were temporary: --out DIR keeps them)\n");
    }
  }
  if (!rc && !n_valid) { /* nothing was costed: the study failed, whatever was printed */
    const char *e = v[0].error ? v[0].error : "";
    fprintf(stderr, "cedar explore: every one of the %d variants was refused; the first: %.*s\n", n, (int)strcspn(e, "\n"), e);
    rc = 1;
  }
  if (tmpdir) nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  if (study_interrupted()) {
    fprintf(stderr, "cedar explore: interrupted by signal %d: the running child was stopped%s\n", study_interrupted(),
            tmpdir ? " and the temporary variants removed" : "");
    study_reraise();
  }
  for (int i = 0; i < n; i++) free(v[i].error);
  free(v);
  plan_free(&base);
  return rc;
}

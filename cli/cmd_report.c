/* cmd_report.c: `cedar report PLAN... --out DIR`: several plans side by side
 * in one directory: memory by state class against context length (SPEC
 * 4.5's classes, from scheduler/plan_cost.c, the same figures `cedar plan
 * cost` prints), token-layers and bytes of the prefix-hit cases, measured
 * prefill and decode time and the drift of bounded replay against
 * `--exact-replay` (small runs: `cedar run` on the direct executor, the
 * command recorded), and with --text each plan's quality over that text
 * (`cedar eval --dense-ref`: held-out bits per byte, agreement with the
 * dense forward); PNG plots by gnuplot and one index.html embedding them,
 * with report.json holding every figure.
 * Tested by tests/cli/report.sh; docs/viz.md.
 */
#include <cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/quote.h"
#include "cli/cli.h"
#include "cli/study.h"
#include "viz/view.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"

#define MAX_PLANS 16
#define MAX_TOKENS 32
#define N_CASES 3

static const char usage[] =
    "usage: cedar report PLAN... --out DIR [--tokens N1,N2,...] [--prompt N] [--no-measure]\n"
    "                    [--measure-prompt N] [--decode S] [--max-weights BYTES] [--json]\n"
    "                    [--text FILE [--context N] [--stride S] [--model DIR | --weights W]]\n"
    "Write DIR/index.html (open it in a browser), its PNG plots (gnuplot) and DIR/report.json:\n"
    "  memory.png     bytes per request by state class (global Main-KV, Indexer-K, SWA, tails and\n"
    "                 their total, beside the per-layer baseline) against context length N, the\n"
    "                 plans side by side (`cedar plan cost --tokens N` for each N)\n"
    "  prefix_hit.png token-layers and new global bytes of a cold prefill of n = --prompt tokens\n"
    "                 (default 4096) and of a prefix hit of n/2 tokens with and without an SWA\n"
    "                 snapshot (`cedar plan cost --prompt n --hit n/2 --swa-hit|--swa-miss`)\n"
    "  time.png       measured prefill (TTFT) and steady decode step time\n"
    "  drift.png      the drift of the bounded decoder replay against --exact-replay (relative\n"
    "                 RMS of the last prompt position's logits)\n"
    "Measuring runs `cedar run --plan P --prompt-len M --max-new S --executor direct --json\n"
    "--exact-replay` once per plan with synthetic weights (M = --measure-prompt, default 512;\n"
    "S = --decode, default 8); a plan whose weights exceed --max-weights (default 2e9 bytes)\n"
    "is not run and the report says so. --no-measure skips the runs.\n"
    "  --text FILE    also score FILE with each plan (`cedar eval --plan P --text FILE --dense-ref\n"
    "                 --json`, --context N ids per window, default 256, --stride S, default N/2): held-out\n"
    "                 bits per byte, next-token accuracy, top-1 agreement and KL against the plan's dense\n"
    "                 (serving.ced false) forward; weights from --model DIR (a released checkpoint), --weights\n"
    "                 W, or synthetic (seed 0, where quality means nothing); runs with --no-measure too\n"
    "  --tokens LIST  context lengths for memory.png (default 1024,4096,16384,65536,262144,1048576)\n"
    "  --json         print report.json's object, with \"out\" and the \"files\" written, instead of\n"
    "                 the summary line\n";

struct case_def {
  const char *name;
  int hit_num, hit_den; /* c = n * num / den */
  bool swa_miss;
};
static const struct case_def cases[N_CASES] = {
    {"cold", 0, 1, false}, {"hit n/2, SWA snapshot", 1, 2, false}, {"hit n/2, SWA miss", 1, 2, true}};

struct entry {
  const char *path;
  struct plan plan;
  struct study_mem mem[MAX_TOKENS];
  struct plan_cost_prefill pre[N_CASES];
  struct study_run run;
  bool measured;
  struct study_quality q;
};

struct ropts {
  const char *out;
  int64_t tokens[MAX_TOKENS];
  int n_tokens;
  int64_t prompt;
  bool measure, json;
  struct study_run_opts ro;
  struct study_quality_opts qo;
};

static int parse(int argc, char **argv, struct ropts *o) {
  static const struct option opts[] = {{"out", required_argument, NULL, 'o'},
                                       {"tokens", required_argument, NULL, 't'},
                                       {"prompt", required_argument, NULL, 'p'},
                                       {"no-measure", no_argument, NULL, 'n'},
                                       {"measure-prompt", required_argument, NULL, 'm'},
                                       {"decode", required_argument, NULL, 'd'},
                                       {"max-weights", required_argument, NULL, 'w'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"text", required_argument, NULL, 'T'},
                                       {"context", required_argument, NULL, 'c'},
                                       {"stride", required_argument, NULL, 's'},
                                       {"model", required_argument, NULL, 'D'},
                                       {"weights", required_argument, NULL, 'W'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  static const int64_t dflt[] = {1024, 4096, 16384, 65536, 262144, 1048576};
  memcpy(o->tokens, dflt, sizeof dflt);
  o->n_tokens = 6;
  o->prompt = 4096;
  o->measure = true;
  o->ro = (struct study_run_opts){.prompt = 512, .decode = 8, .drift = true, .max_weights = 2000000000};
  optind = 1;
  opterr = 0;
  int c;
  int64_t v;
  while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
    switch (c) {
    case 'o': o->out = optarg; break;
    case 't':
      o->n_tokens = study_parse_list(optarg, o->tokens, MAX_TOKENS);
      for (int t = 0; t < o->n_tokens; t++)
        if (o->tokens[t] > PLAN_COST_MAX_TOKENS) o->n_tokens = -1;
      if (o->n_tokens < 1)
        return cli_usage_error("report", "--tokens %s: give up to %d positive counts, comma-separated", optarg,
                               MAX_TOKENS);
      break;
    case 'p':
      if (!cli_parse_int(optarg, 2, PLAN_COST_MAX_TOKENS, &o->prompt))
        return cli_usage_error("report", "--prompt %s: give a count from 2", optarg);
      break;
    case 'n': o->measure = false; break;
    case 'j': o->json = true; break;
    case 'm':
      if (!cli_parse_int(optarg, 1, 1 << 20, &o->ro.prompt))
        return cli_usage_error("report", "--measure-prompt %s: give a count from 1 to 1048576", optarg);
      break;
    case 'd':
      if (!cli_parse_int(optarg, 1, 4096, &v)) return cli_usage_error("report", "--decode %s: give 1 to 4096", optarg);
      o->ro.decode = (int)v;
      break;
    case 'w':
      if (!cli_parse_int(optarg, 1, INT64_MAX, &v)) return cli_usage_error("report", "--max-weights %s", optarg);
      o->ro.max_weights = (uint64_t)v;
      break;
    case 'T': o->qo.text = optarg; break;
    case 'D': o->qo.model = optarg; break;
    case 'W': o->qo.weights = optarg; break;
    case 'c':
      if (!cli_parse_int(optarg, 2, 1 << 24, &o->qo.context)) return cli_usage_error("report", "--context %s", optarg);
      break;
    case 's':
      if (!cli_parse_int(optarg, 1, 1 << 24, &o->qo.stride)) return cli_usage_error("report", "--stride %s", optarg);
      break;
    case 'h': fputs(usage, stdout); return -1;
    default: fputs(usage, stderr); return cli_usage_error("report", "unknown option or missing value: %s", argv[optind - 1]);
    }
  }
  if (!o->out) {
    fputs(usage, stderr);
    return cli_usage_error("report", "give the output directory: --out DIR");
  }
  if (optind >= argc) return cli_usage_error("report", "give one or more plans");
  if (argc - optind > MAX_PLANS) return cli_usage_error("report", "at most %d plans", MAX_PLANS);
  if ((o->qo.model || o->qo.weights || o->qo.context || o->qo.stride) && !o->qo.text)
    return cli_usage_error("report", "--model, --weights, --context and --stride score a text: give --text FILE");
  if (o->qo.model && o->qo.weights) return cli_usage_error("report", "give --model DIR or --weights W, not both");
  o->qo.max_weights = o->ro.max_weights;
  if (!o->qo.context) o->qo.context = 256;
  return 0;
}

/* ---- figures --------------------------------------------------------------- */

static int cost(const struct entry *e, int64_t tokens, int64_t prompt, int64_t hit, bool has_hit, bool miss,
                struct plan_cost *c) {
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = tokens, q.prompt = prompt, q.has_hit = has_hit, q.hit = hit, q.swa_miss = miss;
  if (plan_cost_compute(&e->plan, &q, c)) {
    fprintf(stderr, "cedar report: %s: %s\n", e->path, c->error);
    return 1;
  }
  return 0;
}

static int figures(struct entry *e, const struct ropts *o) {
  struct plan_cost *c = cedar_xmalloc(sizeof(*c));
  int rc = 0;
  for (int t = 0; !rc && t < o->n_tokens; t++) {
    rc = cost(e, o->tokens[t], o->prompt, 0, false, false, c);
    if (!rc) study_mem_of(c, &e->mem[t]);
  }
  for (int k = 0; !rc && k < N_CASES; k++) {
    int64_t hit = o->prompt * cases[k].hit_num / cases[k].hit_den;
    rc = cost(e, o->prompt, o->prompt, hit, k > 0, cases[k].swa_miss, c);
    if (!rc) e->pre[k] = k > 0 ? c->hit : c->cold;
  }
  free(c);
  return rc;
}

/* ---- outputs --------------------------------------------------------------- */

static const char *const mem_cols[] = {"main_kv", "indexer_k", "swa", "tails", "total", "baseline"};

static int64_t mem_col(const struct study_mem *m, int k) {
  const int64_t v[] = {m->main_kv, m->indexer_k, m->swa, m->tails, m->total, m->baseline};
  return v[k];
}

static cJSON *to_json(const struct entry *e, int n, const struct ropts *o) {
  cJSON *root = cJSON_CreateObject();
  cJSON *m = cJSON_AddObjectToObject(root, "measure");
  cJSON_AddBoolToObject(m, "run", o->measure);
  cJSON_AddNumberToObject(m, "prompt", (double)o->ro.prompt);
  cJSON_AddNumberToObject(m, "decode", o->ro.decode);
  cJSON_AddStringToObject(m, "executor", "direct");
  cJSON_AddNumberToObject(root, "prompt", (double)o->prompt);
  cJSON *plans = cJSON_AddArrayToObject(root, "plans");
  for (int i = 0; i < n; i++) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToArray(plans, p);
    cJSON_AddStringToObject(p, "path", e[i].path);
    cJSON_AddStringToObject(p, "name", e[i].plan.name);
    cJSON *mem = cJSON_AddArrayToObject(p, "memory");
    for (int t = 0; t < o->n_tokens; t++) {
      cJSON *r = cJSON_CreateObject();
      cJSON_AddNumberToObject(r, "tokens", (double)o->tokens[t]);
      for (int k = 0; k < 6; k++) cJSON_AddNumberToObject(r, mem_cols[k], (double)mem_col(&e[i].mem[t], k));
      cJSON_AddItemToArray(mem, r);
    }
    cJSON *ph = cJSON_AddArrayToObject(p, "prefix_hit");
    for (int k = 0; k < N_CASES; k++) {
      const struct plan_cost_prefill *q = &e[i].pre[k];
      cJSON *r = cJSON_CreateObject();
      cJSON_AddStringToObject(r, "case", cases[k].name);
      cJSON_AddNumberToObject(r, "prompt", (double)q->prompt);
      cJSON_AddNumberToObject(r, "hit", (double)q->hit);
      cJSON_AddBoolToObject(r, "swa_miss", cases[k].swa_miss);
      cJSON_AddNumberToObject(r, "token_layers", (double)q->token_layers);
      cJSON_AddNumberToObject(r, "dense_token_layers", (double)q->dense_token_layers);
      cJSON_AddNumberToObject(r, "encoder_positions", (double)q->encoder_positions);
      cJSON_AddNumberToObject(r, "decoder_positions", (double)q->decoder_positions);
      cJSON_AddNumberToObject(r, "new_bytes", (double)q->new_bytes);
      cJSON_AddItemToArray(ph, r);
    }
    if (o->qo.text) {
      cJSON *q = cJSON_AddObjectToObject(p, "quality");
      const struct study_quality *u = &e[i].q;
      if (!u->ok) {
        cJSON_AddStringToObject(q, "not_run", u->why);
      } else {
        cJSON_AddStringToObject(q, "command", u->cmd);
        cJSON_AddNumberToObject(q, "tokens", (double)u->tokens);
        cJSON_AddNumberToObject(q, "bytes", (double)u->bytes);
        cJSON_AddNumberToObject(q, "bits_per_byte", u->bits_per_byte);
        cJSON_AddNumberToObject(q, "accuracy", u->accuracy);
        cJSON_AddNumberToObject(q, "dense_top1_agreement", u->agreement);
        cJSON_AddNumberToObject(q, "dense_kl_nats_per_token", u->kl);
        cJSON_AddNumberToObject(q, "dense_bits_per_byte", u->dense_bits_per_byte);
        cJSON_AddNumberToObject(q, "tokens_per_s", u->tokens_per_s);
      }
    }
    cJSON *r = cJSON_AddObjectToObject(p, "measured");
    const struct study_run *u = &e[i].run;
    if (!e[i].measured || !u->ok) {
      cJSON_AddStringToObject(r, "not_run", o->measure ? u->why : "--no-measure");
      continue;
    }
    cJSON_AddStringToObject(r, "command", u->cmd);
    cJSON_AddNumberToObject(r, "prefill_s", u->prefill_s);
    cJSON_AddNumberToObject(r, "decode_itl_s", u->itl_s);
    cJSON_AddNumberToObject(r, "token_layers", (double)u->token_layers);
    cJSON_AddBoolToObject(r, "state_agrees_with_plan_cost", u->state_agrees);
    cJSON_AddNumberToObject(r, "drift_rel_rms", u->drift_rel_rms);
    cJSON_AddNumberToObject(r, "drift_max_abs", u->drift_max_abs);
    cJSON_AddBoolToObject(r, "same_top1", u->same_top1);
    cJSON_AddBoolToObject(r, "encoder_entries_equal", u->entries_equal);
  }
  return root;
}

#define OPEN(f, name)                                        \
  FILE *f = study_open(o->out, name, err, err_len);          \
  if (!f) return 1

/* The measured plans' names under their bars, as quoted literals in the
 * script (a data file's strings have no escapes). */
static void measured_xtics(FILE *g, const struct entry *e, int n) {
  fputs("set xtics (", g);
  for (int i = 0, bar = 0; i < n; i++)
    if (e[i].measured && e[i].run.ok) {
      fputs(bar ? ", " : "", g);
      cedar_quote_gnuplot(g, e[i].plan.name);
      fprintf(g, " %d", bar++);
    }
  fputs(")\n", g);
}

/* measured.dat, time.gp and drift.gp: the plans that ran. */
static int write_measured_plots(const struct entry *e, int n, const struct ropts *o, char *err, size_t err_len) {
  OPEN(f, "measured.dat");
  fprintf(f, "# bar prefill_s decode_itl_ms drift_rel_rms (the plans' names are the scripts' xtics)\n");
  for (int i = 0, bar = 0; i < n; i++)
    if (e[i].measured && e[i].run.ok)
      fprintf(f, "%d %.6f %.4f %.6g\n", bar++, e[i].run.prefill_s, 1e3 * e[i].run.itl_s, e[i].run.drift_rel_rms);
  if (study_close(f, err, err_len)) return 1;
  OPEN(g, "time.gp");
  fprintf(g, "# cedar report: measured time\nset terminal pngcairo noenhanced size 1200,500 font 'sans,10'\n"
             "set output 'time.png'\nset multiplot layout 1,2 title 'Measured: prompt %" PRId64
             " tokens, %d decode steps, direct executor, synthetic weights'\n"
             "set style data histograms\nset style fill solid 0.8 border -1\nset boxwidth 0.7\nset grid y\n"
             "set yrange [0:*]\nset key off\n",
          o->ro.prompt, o->ro.decode);
  measured_xtics(g, e, n);
  fputs("set title 'Prefill (TTFT), s'\nplot 'measured.dat' using 2 lc rgb '#1f77b4'\n"
        "set title 'Decode step (steady ITL), ms'\nplot 'measured.dat' using 3 lc rgb '#ff7f0e'\n"
        "unset multiplot\n", g);
  if (study_close(g, err, err_len)) return 1;
  OPEN(h, "drift.gp");
  fprintf(h, "# cedar report: drift against --exact-replay\nset terminal pngcairo noenhanced size 800,500 font 'sans,10'\n"
             "set output 'drift.png'\nset title 'Drift of bounded replay against --exact-replay\\n(relative RMS of "
             "the last position''s logits)'\nset style data histograms\nset style fill solid 0.8 border -1\n"
             "set boxwidth 0.7\nset grid y\nset yrange [0:*]\nset key off\n");
  measured_xtics(h, e, n);
  fputs("plot 'measured.dat' using 4 lc rgb '#d62728'\n", h);
  if (study_close(h, err, err_len)) return 1;
  return 0;
}

/* The data files and gnuplot scripts. Every name is written by
 * cedar_quote_gnuplot (base/quote.h): a plan's name is data, never script. */
static int write_plots(const struct entry *e, int n, const struct ropts *o, int n_measured, char *err, size_t err_len) {
  char name[64];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "memory_%d.dat", i);
    OPEN(f, name);
    fputs("# ", f);
    cedar_quote_gnuplot(f, e[i].plan.name); /* one line, whatever the name holds */
    fputs(" (", f);
    cedar_quote_gnuplot(f, e[i].path);
    fputs("): tokens main_kv indexer_k swa tails total baseline (bytes per request)\n", f);
    for (int t = 0; t < o->n_tokens; t++) {
      fprintf(f, "%" PRId64, o->tokens[t]);
      for (int k = 0; k < 6; k++) fprintf(f, " %" PRId64, mem_col(&e[i].mem[t], k));
      fputc('\n', f);
    }
    if (study_close(f, err, err_len)) return 1;
  }
  {
    OPEN(f, "memory.gp");
    fprintf(f, "# cedar report: memory by state class against context length\n"
               "set terminal pngcairo noenhanced size 1400,900 font 'sans,10'\nset output 'memory.png'\n"
               "set multiplot layout 2,2 title 'Bytes per request by state class (cedar plan cost)'\n"
               "set logscale xy\nset format y '%%.0s %%cB'\nset xlabel 'context length N (tokens)'\nset key left top\n"
               "set grid\nset autoscale xfix\n");
    const char *panels[][3] = {{"2", "Global Main-KV", ""}, {"3", "Global Indexer-K", ""},
                               {"4+$5", "SWA rings + compressor tails", ""}, {"6", "Total", "7"}};
    for (int pn = 0; pn < 4; pn++) {
      fprintf(f, "set title '%s%s'\nplot ", panels[pn][1], panels[pn][2][0] ? " (dashed: per-layer baseline global KV)" : "");
      for (int i = 0; i < n; i++) {
        const char *col = panels[pn][0];
        fprintf(f, "%s'memory_%d.dat' using 1:%s%s%s with linespoints lt %d lw 2 title ", i ? ", " : "", i,
                strchr(col, '+') ? "($" : "", col, strchr(col, '+') ? ")" : "", i + 1);
        cedar_quote_gnuplot(f, e[i].plan.name);
        if (panels[pn][2][0])
          fprintf(f, ", 'memory_%d.dat' using 1:%s with lines lt %d dt 2 notitle", i, panels[pn][2], i + 1);
      }
      fputc('\n', f);
    }
    fputs("unset multiplot\n", f);
    if (study_close(f, err, err_len)) return 1;
  }
  {
    OPEN(f, "prefix_hit.dat");
    fprintf(f, "# case, then per plan: token_layers new_bytes\n");
    for (int k = 0; k < N_CASES; k++) {
      fprintf(f, "\"%s\"", cases[k].name);
      for (int i = 0; i < n; i++) fprintf(f, " %" PRId64 " %" PRId64, e[i].pre[k].token_layers, e[i].pre[k].new_bytes);
      fputc('\n', f);
    }
    if (study_close(f, err, err_len)) return 1;
    OPEN(g, "prefix_hit.gp");
    fprintf(g, "# cedar report: the prefix-hit cases\nset terminal pngcairo noenhanced size 1400,600 font 'sans,10'\n"
               "set output 'prefix_hit.png'\nset multiplot layout 1,2 title 'Prefill of n = %" PRId64
               " tokens (cedar plan cost --prompt n --hit c)'\n"
               "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
               "set grid y\nset key top right\nset yrange [0:*]\n",
            o->prompt);
    for (int pn = 0; pn < 2; pn++) {
      fprintf(g, "set title '%s'\nset format y '%s'\nplot ", pn ? "New global bytes" : "Token-layers",
              pn ? "%.0s %cB" : "%.0s%c");
      for (int i = 0; i < n; i++) {
        fprintf(g, "%s'prefix_hit.dat' using %d%s title ", i ? ", " : "", 2 + 2 * i + pn, i ? "" : ":xtic(1)");
        cedar_quote_gnuplot(g, e[i].plan.name);
      }
      fputc('\n', g);
    }
    fputs("unset multiplot\n", g);
    if (study_close(g, err, err_len)) return 1;
  }
  if (!n_measured) { /* no stale plots of an earlier report in the same directory */
    const char *stale[] = {"measured.dat", "time.gp", "drift.gp", "time.png", "drift.png"};
    char path[4096];
    for (size_t k = 0; k < sizeof stale / sizeof stale[0]; k++) {
      snprintf(path, sizeof path, "%s/%s", o->out, stale[k]);
      unlink(path);
    }
    return 0;
  }
  return write_measured_plots(e, n, o, err, err_len);
}

static void fmt_bytes(char *b, size_t n, double v) {
  if (v >= 1e9) snprintf(b, n, "%.2f GB", v / 1e9);
  else if (v >= 1e6) snprintf(b, n, "%.2f MB", v / 1e6);
  else if (v >= 1e3) snprintf(b, n, "%.1f kB", v / 1e3);
  else snprintf(b, n, "%.0f B", v);
}

/* The quality table: each plan's `cedar eval --dense-ref` over --text. */
static void write_quality_html(FILE *f, const struct entry *e, int n, const struct ropts *o) {
  fputs("<h2>Quality over ", f);
  viz_html_text(f, o->qo.text);
  fputs("</h2>\n<p>Teacher-forced through each plan's own prefill graph and decode steps (<code>cedar eval</code>): "
        "bits per byte of the text, next-token accuracy, and top-1 agreement and KL (nats per id) against the same "
        "plan and weights with <code>serving.ced: false</code>, the dense forward.</p>\n"
        "<table><tr><th>plan</th><th>bits per byte</th><th>dense: bits per byte</th><th>accuracy</th>"
        "<th>top-1 agreement</th><th>KL</th><th>ids/s</th><th>command</th></tr>\n", f);
  for (int i = 0; i < n; i++) {
    const struct study_quality *u = &e[i].q;
    fputs("<tr><td>", f);
    viz_html_text(f, e[i].plan.name);
    if (!u->ok) {
      fputs("</td><td colspan=\"7\" style=\"text-align:left\">", f);
      viz_html_text(f, u->why);
    } else {
      fprintf(f, "</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.3g</td><td>%.1f</td>"
                 "<td style=\"text-align:left\"><code>", u->bits_per_byte, u->dense_bits_per_byte, u->accuracy,
              u->agreement, u->kl, u->tokens_per_s);
      viz_html_text(f, u->cmd);
      fputs("</code>", f);
    }
    fputs("</td></tr>\n", f);
  }
  fputs("</table>\n", f);
}

static int write_html(const struct entry *e, int n, const struct ropts *o, int n_measured, char *err, size_t err_len) {
  OPEN(f, "index.html");
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>cedar report</title>\n<style>"
        "body{font:13px/1.4 system-ui,sans-serif;margin:12px 20px;color:#222}table{border-collapse:collapse;"
        "margin:6px 0 14px}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f4f4f4}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #ddd}</style></head>"
        "<body>\n<h1>cedar report</h1>\n<p>Plans: ",
        f);
  for (int i = 0; i < n; i++) {
    fputs(i ? ", " : "", f);
    viz_html_text(f, e[i].plan.name);
    fputs(" (<code>", f);
    viz_html_text(f, e[i].path);
    fputs("</code>)", f);
  }
  fprintf(f, ". Every figure is in <a href=\"report.json\">report.json</a>.</p>\n");
  fputs("<h2>Memory by state class</h2>\n<p>Bytes per request after N positions, from the plan alone "
        "(<code>cedar plan cost --tokens N</code>): global Main-KV and Indexer-K entries of the KV sources, the "
        "SWA rings, the compressor tails; dashed: the global KV if every CSA2 layer owned its own.</p>\n"
        "<img src=\"memory.png\" alt=\"memory by state class against context length\">\n<table><tr><th>plan</th>",
        f);
  char b[32];
  int last = o->n_tokens - 1;
  fprintf(f, "<th>N</th><th>Main-KV</th><th>Indexer-K</th><th>SWA</th><th>tails</th><th>total</th><th>baseline</th></tr>\n");
  for (int i = 0; i < n; i++) {
    fputs("<tr><td>", f);
    viz_html_text(f, e[i].plan.name);
    fprintf(f, "</td><td>%" PRId64 "</td>", o->tokens[last]);
    for (int k = 0; k < 6; k++) {
      fmt_bytes(b, sizeof b, (double)mem_col(&e[i].mem[last], k));
      fprintf(f, "<td>%s</td>", b);
    }
    fputs("</tr>\n", f);
  }
  fprintf(f, "</table>\n<h2>Prefix-hit cases</h2>\n<p>A prompt of n = %" PRId64 " tokens: cold, and with the first "
             "n/2 cached, with and without an SWA snapshot at the hit (<code>cedar plan cost --prompt n --hit c "
             "[--swa-miss]</code>).</p>\n<img src=\"prefix_hit.png\" alt=\"token-layers and bytes of the prefix-hit "
             "cases\">\n<table><tr><th>plan</th><th>case</th><th>token-layers</th><th>dense equivalent</th>"
             "<th>new global bytes</th></tr>\n",
          o->prompt);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < N_CASES; k++) {
      fputs("<tr><td>", f);
      viz_html_text(f, e[i].plan.name);
      fmt_bytes(b, sizeof b, (double)e[i].pre[k].new_bytes);
      fprintf(f, "</td><td>%s</td><td>%" PRId64 "</td><td>%" PRId64 "</td><td>%s</td></tr>\n", cases[k].name,
              e[i].pre[k].token_layers, e[i].pre[k].dense_token_layers, b);
    }
  fputs("</table>\n<h2>Measured time and drift</h2>\n", f);
  if (!o->measure) fputs("<p>Not measured (<code>--no-measure</code>).</p>\n", f);
  else {
    fprintf(f, "<p>One run per plan with synthetic weights: a prompt of %" PRId64 " tokens, %d generated, on the "
               "direct executor (one thread), with <code>--exact-replay</code>. Compare ratios, not times: the "
               "machine may be shared.</p>\n",
            o->ro.prompt, o->ro.decode);
    if (n_measured) fputs("<img src=\"time.png\" alt=\"measured time\"> <img src=\"drift.png\" alt=\"drift\">\n", f);
    fputs("<table><tr><th>plan</th><th>prefill (TTFT) s</th><th>decode step ms</th><th>drift rel. RMS</th>"
          "<th>max |diff|</th><th>top-1</th><th>encoder entries</th><th>state = plan cost</th><th>command</th></tr>\n",
          f);
    for (int i = 0; i < n; i++) {
      const struct study_run *u = &e[i].run;
      fputs("<tr><td>", f);
      viz_html_text(f, e[i].plan.name);
      if (!u->ok) {
        fputs("</td><td colspan=\"8\" style=\"text-align:left\">", f);
        viz_html_text(f, u->why);
      } else {
        fprintf(f, "</td><td>%.3f</td><td>%.2f</td><td>%.3g</td><td>%.3g</td><td>%s</td><td>%s</td><td>%s</td><td "
                   "style=\"text-align:left\"><code>",
                u->prefill_s, 1e3 * u->itl_s, u->drift_rel_rms, u->drift_max_abs, u->same_top1 ? "same" : "differs",
                u->entries_equal ? "equal" : "DIFFER", u->state_agrees ? "yes" : "NO");
        viz_html_text(f, u->cmd);
        fputs("</code>", f);
      }
      fputs("</td></tr>\n", f);
    }
    fputs("</table>\n", f);
  }
  if (o->qo.text) write_quality_html(f, e, n, o);
  fputs("</body></html>\n", f);
  return study_close(f, err, err_len);
}

int cmd_report(int argc, char **argv) {
  struct ropts o = {0};
  int rc = parse(argc, argv, &o);
  if (rc) return rc < 0 ? 0 : rc;
  char err[512];
  if (!study_have_gnuplot()) {
    fprintf(stderr, "cedar report: gnuplot is not installed (apt-get install gnuplot-nox; make install-deps)\n");
    return 1;
  }
  if (study_mkdir(o.out, err, sizeof err)) {
    fprintf(stderr, "cedar report: %s\n", err);
    return 1;
  }
  int n = argc - optind;
  struct entry *e = calloc((size_t)n, sizeof(*e));
  CEDAR_ASSERT(e != NULL);
  int loaded = 0, n_measured = 0;
  rc = 0;
  for (int i = 0; i < n && !rc; i++, loaded++) {
    e[i].path = argv[optind + i];
    if (cli_load_plan("report", e[i].path, &e[i].plan)) {
      rc = 1;
      break;
    }
    rc = figures(&e[i], &o);
  }
  for (int i = 0; i < n && !rc && o.measure; i++) {
    fprintf(stderr, "cedar report: measuring %s ...\n", e[i].plan.name);
    e[i].measured = true;
    if (study_run(e[i].path, &e[i].plan, &o.ro, &e[i].run)) fprintf(stderr, "cedar report: %s\n", e[i].run.why);
    else n_measured++;
  }
  for (int i = 0; i < n && !rc && o.qo.text; i++) {
    fprintf(stderr, "cedar report: scoring %s with %s ...\n", o.qo.text, e[i].plan.name);
    if (study_quality_run(e[i].path, &e[i].plan, &o.qo, &e[i].q)) fprintf(stderr, "cedar report: %s\n", e[i].q.why);
  }
  cJSON *j = rc ? NULL : to_json(e, n, &o);
  if (!rc) {
    char *s = cJSON_Print(j);
    FILE *f = study_open(o.out, "report.json", err, sizeof err);
    if (!f) rc = 1;
    else fputs(s, f), rc = study_close(f, err, sizeof err);
    cJSON_free(s);
  }
  if (!rc) rc = write_plots(e, n, &o, n_measured, err, sizeof err);
  const char *scripts[] = {"memory.gp", "prefix_hit.gp", "time.gp", "drift.gp"};
  for (int k = 0; k < (n_measured ? 4 : 2) && !rc; k++) rc = study_gnuplot(o.out, scripts[k], err, sizeof err);
  if (!rc) rc = write_html(e, n, &o, n_measured, err, sizeof err);
  if (rc && err[0]) fprintf(stderr, "cedar report: %s\n", err);
  if (!rc && o.json) { /* what report.json holds, and where it all went */
    cJSON_AddStringToObject(j, "out", o.out);
    cJSON *files = cJSON_AddArrayToObject(j, "files");
    const char *written[] = {"index.html", "report.json", "memory.png", "prefix_hit.png", "time.png", "drift.png"};
    for (int k = 0; k < (n_measured ? 6 : 4); k++) cJSON_AddItemToArray(files, cJSON_CreateString(written[k]));
    cJSON_AddNumberToObject(j, "n_measured", n_measured);
    cli_print_json(j);
    j = NULL;
  } else if (!rc) {
    printf("cedar report: %s/index.html: %d plan%s, %d measured; plots memory.png prefix_hit.png%s\n", o.out, n,
           n == 1 ? "" : "s", n_measured, n_measured ? " time.png drift.png" : "");
  }
  cJSON_Delete(j);
  for (int i = 0; i < loaded; i++) plan_free(&e[i].plan);
  free(e);
  return rc;
}

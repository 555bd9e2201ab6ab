/* cmd_eval.c: `cedar eval`, teacher-forced quality of a model over a text:
 * bits per byte, perplexity and next-token accuracy, read off the plan's own
 * prefill graph and decode steps (runtime/engine/eval.h), with the
 * agreement with the dense `ced: false` forward (--dense-ref) or with fp32
 * numerics (--f32-ref) on request.
 *
 *   cedar eval (--model DIR | --plan P [--weights W | --seed S]) --text FILE [--json] ...
 *
 * The text's ids: the tokenizer (--tokenizer, else --model DIR's own
 * tokenizer.json) with BOS first when its tokenizer_config.json names one;
 * without a tokenizer, one id per byte (as `cedar run`'s built-in prompt).
 * Under mpirun with a P/D plan the decode rank prints the figures.
 * Tested by tests/cli/eval.sh (the NumPy oracle, both executors, mpirun P/D,
 * bad input).
 */
#include <cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "cli/cli.h"
#include "cli/run_text.h"
#include "runtime/comm/comm.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/eval.h"

#define EVAL_MAX_BYTES_DEFAULT ((uint64_t)1 << 20)

struct eopts {
  const char *plan, *weights, *model, *text, *tokenizer, *sched;
  uint64_t seed, max_bytes;
  int64_t context, stride;
  enum rt_executor executor;
  int workers;
  bool json, per_token, dense_ref, f32_ref, executor_given;
};

/* The reference's key in --json and its words in the text report. */
static const char *ref_key(const struct eopts *o) { return o->dense_ref ? "dense" : "f32"; }
static const char *ref_words(const struct eopts *o) {
  return o->dense_ref ? "dense (ced: false)" : "fp32 numerics (model.numerics all f32)";
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: cedar eval (--model DIR | --plan P [--weights W | --seed S]) --text FILE [options]\n"
          "\n"
          "Teacher-forced quality over a text: its ids run through the plan's own prefill graph (CED,\n"
          "bounded replay and chunking as the plan says) and decode steps, each step consuming the\n"
          "text's next id; every scored id's probability comes from the step that would sample it\n"
          "(the last prefill row, then one decode step per id). Prints bits per byte (total NLL in\n"
          "bits over the scored ids' bytes), perplexity (per id), next-token accuracy, ids and bytes.\n"
          "\n"
          "  --model DIR       a checkpoint in the released layout (its config.json's plan, its\n"
          "                    tokenizer.json when it has one); --plan P is then checked against it\n"
          "  --plan P          a plan (default %s) with --weights W, or synthetic weights of --seed S (0)\n"
          "  --text FILE       the text (\"-\": stdin); FIFOs, devices and directories are refused\n"
          "  --tokenizer T     a tokenizer.json (default: DIR/tokenizer.json; without one, one id per byte,\n"
          "                    which needs the plan's vocab >= 256); BOS first when its\n"
          "                    tokenizer_config.json names one\n"
          "  --max-bytes N     refuse a longer text (default 1M; K, M, G suffixes)\n"
          "  --context N       ids per window (default 512): a longer text runs as windows, the first\n"
          "                    scoring ids 1 .. N-1 after a prefill of id 0, each later one prefilling the\n"
          "                    N - stride ids before its part and scoring the next stride ids\n"
          "  --stride S        ids scored per later window (default N/2), in [1, N-1]\n"
          "  --dense-ref       also run every window on the same plan and weights with serving.ced false\n"
          "                    (the dense forward) and report its bits per byte, top-1 agreement and\n"
          "                    KL(dense || plan)\n"
          "  --f32-ref         the same with model.numerics all f32 (no bf16 or MXFP8 activation rounding):\n"
          "                    what the vendor numerics cost on this text\n"
          "  --per-token       --json: each scored id's position, id, NLL, argmax (and KL)\n"
          "  --executor E      direct (default) or starpu: the figures are bitwise the same\n"
          "  --workers N, --sched S   StarPU's CPU workers and policy (they imply --executor starpu)\n"
          "  --json            one JSON object\n"
          "\n"
          "Under mpirun with a P/D plan (plans/v41-mini-pd.yaml) each window's prefill runs on the\n"
          "prefill rank and its decode steps on the decode rank, which prints the figures; the references\n"
          "run in one process only. Cost: one decode step per scored id (docs/PERF.md).\n",
          CEDAR_DEFAULT_PLAN);
}

static int parse(int argc, char **argv, struct eopts *o) {
  static const struct option lo[] = {
      {"model", required_argument, 0, 'M'},   {"plan", required_argument, 0, 'p'},
      {"weights", required_argument, 0, 'w'}, {"seed", required_argument, 0, 's'},
      {"text", required_argument, 0, 't'},    {"tokenizer", required_argument, 0, 'T'},
      {"max-bytes", required_argument, 0, 'b'}, {"context", required_argument, 0, 'c'},
      {"stride", required_argument, 0, 'S'},  {"executor", required_argument, 0, 'e'},
      {"workers", required_argument, 0, 'W'}, {"sched", required_argument, 0, 'P'},
      {"json", no_argument, 0, 'j'},          {"per-token", no_argument, 0, 'k'},
      {"dense-ref", no_argument, 0, 'd'},     {"f32-ref", no_argument, 0, 'F'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->max_bytes = EVAL_MAX_BYTES_DEFAULT;
  o->context = 512;
  o->stride = -1;
  int64_t v;
  optind = 1, opterr = 0;
  for (int c; (c = getopt_long(argc, argv, "h", lo, NULL)) != -1;) {
    switch (c) {
    case 'M': o->model = optarg; break;
    case 'p': o->plan = optarg; break;
    case 'w': o->weights = optarg; break;
    case 't': o->text = optarg; break;
    case 'T': o->tokenizer = optarg; break;
    case 'P': o->sched = optarg; break;
    case 'j': o->json = true; break;
    case 'k': o->per_token = true; break;
    case 'd': o->dense_ref = true; break;
    case 'F': o->f32_ref = true; break;
    case 's':
      if (!cli_parse_int(optarg, 0, INT64_MAX, &v)) return cli_usage_error("eval", "--seed %s: give an integer >= 0", optarg);
      o->seed = (uint64_t)v;
      break;
    case 'b':
      if (!cli_parse_size(optarg, &o->max_bytes) || !o->max_bytes || o->max_bytes > CEDAR_TEXT_MAX)
        return cli_usage_error("eval", "--max-bytes %s: give a size in [1, 256M] (K, M suffixes)", optarg);
      break;
    case 'c':
      if (!cli_parse_int(optarg, 2, 1 << 24, &o->context))
        return cli_usage_error("eval", "--context %s: give ids per window in [2, 16777216]", optarg);
      break;
    case 'S':
      if (!cli_parse_int(optarg, 1, 1 << 24, &o->stride)) return cli_usage_error("eval", "--stride %s: give an integer >= 1", optarg);
      break;
    case 'W':
      if (!cli_parse_int(optarg, 1, 1024, &v)) return cli_usage_error("eval", "--workers %s: give 1..1024", optarg);
      o->workers = (int)v;
      break;
    case 'e':
      if (!rt_executor_parse(optarg, &o->executor)) return cli_usage_error("eval", "--executor %s: give direct or starpu", optarg);
      o->executor_given = true;
      break;
    case 'h': return usage(stdout), 0;
    case ':': return cli_usage_error("eval", "%s needs a value", argv[optind - 1]);
    default: return cli_usage_error("eval", "unknown option '%s' (cedar eval --help)", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("eval", "unexpected argument '%s' (the text is --text FILE)", argv[optind]);
  if (!o->text) return cli_usage_error("eval", "give --text FILE (the text to score)");
  if (o->model && o->weights) return cli_usage_error("eval", "--model DIR holds the weights: drop --weights");
  if (o->stride < 0) o->stride = o->context / 2;
  if (o->stride >= o->context)
    return cli_usage_error("eval", "--stride %lld: give fewer than --context's %lld ids", (long long)o->stride,
                           (long long)o->context);
  if (o->per_token && !o->json) return cli_usage_error("eval", "--per-token goes with --json");
  if (o->dense_ref && o->f32_ref) return cli_usage_error("eval", "give one reference: --dense-ref or --f32-ref");
  if (!o->executor_given && (o->sched || o->workers)) o->executor = RT_EXEC_STARPU; /* they are StarPU's, as in run */
  if (o->executor == RT_EXEC_DIRECT && (o->sched || o->workers))
    return cli_usage_error("eval", "--sched and --workers need --executor starpu (the direct executor runs one thread)");
  return -1;
}

/* ---- the text's ids -------------------------------------------------------- */

struct text_ids {
  int32_t *ids, *bytes; /* (n) ids and the bytes each stands for */
  int64_t n, text_bytes;
  char how[4200];       /* "bytes (one id per byte)" or the tokenizer's path [+ BOS] */
};

static int text_ids(const struct eopts *o, const char *text, size_t len, struct text_ids *t) {
  memset(t, 0, sizeof *t);
  t->text_bytes = (int64_t)len;
  char own[4096];
  bool has_own = o->model && snprintf(own, sizeof own, "%s/tokenizer.json", o->model) < (int)sizeof own &&
                 access(own, F_OK) == 0;
  if (!o->tokenizer && !has_own) { /* one id per byte */
    t->ids = cedar_xmalloc(sizeof(int32_t) * len);
    t->bytes = cedar_xmalloc(sizeof(int32_t) * len);
    for (size_t i = 0; i < len; i++) t->ids[i] = (unsigned char)text[i], t->bytes[i] = 1;
    t->n = (int64_t)len;
    snprintf(t->how, sizeof t->how, "bytes (one id per byte)");
    return 0;
  }
  struct run_text tx;
  if (run_text_open(&tx, "eval", o->tokenizer, o->model)) return 1;
  int32_t bos = tx.chat.bos ? tok_added_id(tx.tok, tx.chat.bos) : -1;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (bos >= 0) {
    ids = cedar_xmalloc(sizeof(int32_t)), cap = 1;
    ids[n++] = bos;
  }
  if (tok_encode(tx.tok, text, len, &ids, &n, &cap)) {
    fprintf(stderr, "cedar eval: --text %s: the tokenizer could not encode it (over its %zu-byte limit, or out of "
            "memory)\n", o->text, (size_t)TOK_MAX_TEXT);
    free(ids);
    run_text_close(&tx);
    return 1;
  }
  t->ids = ids;
  t->n = (int64_t)n;
  t->bytes = cedar_xmalloc(sizeof(int32_t) * (n ? n : 1));
  for (size_t i = 0; i < n; i++) {
    size_t b = 0;
    if (!(bos >= 0 && i == 0)) tok_id_bytes(tx.tok, ids[i], &b);
    t->bytes[i] = (int32_t)b;
  }
  snprintf(t->how, sizeof t->how, "%s%s", tx.tok_path, bos >= 0 ? " (BOS first)" : "");
  run_text_close(&tx);
  return 0;
}

/* on_plan: every id inside the plan's vocab, before the weights are built. */
static int ids_fit(void *user, const struct plan *p, char *err, size_t err_len) {
  const struct text_ids *t = user;
  int32_t top = 0;
  for (int64_t i = 0; i < t->n; i++) top = t->ids[i] > top ? t->ids[i] : top;
  if (top < p->model.vocab) return 0;
  snprintf(err, err_len, "the text's ids (%s) reach %d, but plan %s's vocab is %d: give a plan or model whose "
           "vocab holds them (plans/v41-mini-text.yaml for the DeepSeek tokenizer), or --tokenizer T", t->how, top,
           p->name, p->model.vocab);
  return CEDAR_EINVAL;
}

/* ---- progress and report ------------------------------------------------- */

struct progress {
  double t0, last;
  bool tty, shown;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress_cb(void *user, int64_t done, int64_t total) {
  struct progress *pg = user;
  double t = now_s();
  double every = pg->tty ? 0.5 : 30.0; /* a line every 30 s when not a terminal; nothing for a short run */
  if (done < total ? t - pg->last < every : !pg->shown && t - pg->t0 < every) return;
  pg->last = t;
  pg->shown = true;
  fprintf(stderr, "%seval: %lld/%lld ids scored, %.1f s, %.1f ids/s%s", pg->tty ? "\r" : "", (long long)done,
          (long long)total, t - pg->t0, done / (t - pg->t0 > 0 ? t - pg->t0 : 1), pg->tty ? "" : "\n");
  if (pg->tty && done == total) fputc('\n', stderr);
}

static void report_json(const struct eopts *o, const struct rt_engine *e, const struct text_ids *t,
                        const struct rt_eval_result *r) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "plan", e->plan.name);
  if (o->model) cJSON_AddStringToObject(j, "model", o->model);
  else if (o->weights) cJSON_AddStringToObject(j, "weights", o->weights);
  else cJSON_AddNumberToObject(j, "seed", (double)o->seed);
  cJSON_AddStringToObject(j, "text", o->text);
  cJSON_AddStringToObject(j, "ids_from", t->how);
  cJSON_AddStringToObject(j, "executor", rt_executor_name(o->executor));
  cJSON_AddBoolToObject(j, "ced", e->plan.serving.ced);
  cJSON_AddNumberToObject(j, "context", (double)o->context);
  cJSON_AddNumberToObject(j, "stride", (double)o->stride);
  cJSON_AddNumberToObject(j, "windows", (double)r->windows);
  cJSON_AddNumberToObject(j, "text_bytes", (double)t->text_bytes);
  cJSON_AddNumberToObject(j, "text_ids", (double)t->n);
  cJSON_AddNumberToObject(j, "tokens", (double)r->tokens);
  cJSON_AddNumberToObject(j, "bytes", (double)r->bytes);
  cJSON_AddNumberToObject(j, "nll_nats", r->nll);
  cJSON_AddNumberToObject(j, "bits_per_byte", r->bytes ? r->nll / log(2.0) / (double)r->bytes : 0);
  cJSON_AddNumberToObject(j, "bits_per_token", r->nll / log(2.0) / (double)r->tokens);
  cJSON_AddNumberToObject(j, "perplexity", exp(r->nll / (double)r->tokens));
  cJSON_AddNumberToObject(j, "accuracy", (double)r->correct / (double)r->tokens);
  cJSON_AddNumberToObject(j, "correct", (double)r->correct);
  cJSON_AddNumberToObject(j, "decode_steps", (double)r->decode_steps);
  cJSON_AddNumberToObject(j, "seconds", r->seconds);
  cJSON_AddNumberToObject(j, "tokens_per_s", r->seconds > 0 ? (double)r->tokens / r->seconds : 0);
  if (o->dense_ref || o->f32_ref) {
    cJSON *d = cJSON_AddObjectToObject(j, ref_key(o));
    cJSON_AddNumberToObject(d, "bits_per_byte", r->bytes ? r->ref_nll / log(2.0) / (double)r->bytes : 0);
    cJSON_AddNumberToObject(d, "nll_nats", r->ref_nll);
    cJSON_AddNumberToObject(d, "top1_agreement", (double)r->agree / (double)r->tokens);
    cJSON_AddNumberToObject(d, "kl_nats_per_token", r->kl / (double)r->tokens);
    cJSON_AddNumberToObject(d, "seconds", r->ref_seconds);
  }
  if (o->per_token) {
    cJSON *p = cJSON_AddObjectToObject(j, "per_token");
    cJSON *pos = cJSON_AddArrayToObject(p, "pos"), *id = cJSON_AddArrayToObject(p, "id");
    cJSON *nll = cJSON_AddArrayToObject(p, "nll"), *am = cJSON_AddArrayToObject(p, "argmax");
    cJSON *kl = o->dense_ref || o->f32_ref ? cJSON_AddArrayToObject(p, "kl") : NULL;
    for (int64_t i = 0; i < r->tokens; i++) {
      cJSON_AddItemToArray(pos, cJSON_CreateNumber((double)r->tok_pos[i]));
      cJSON_AddItemToArray(id, cJSON_CreateNumber(t->ids[r->tok_pos[i]]));
      cJSON_AddItemToArray(nll, cJSON_CreateNumber(r->tok_nll[i]));
      cJSON_AddItemToArray(am, cJSON_CreateNumber(r->tok_argmax[i]));
      if (kl) cJSON_AddItemToArray(kl, cJSON_CreateNumber(r->tok_kl[i]));
    }
  }
  cli_print_json(j);
}

static void report_text(const struct eopts *o, const struct rt_engine *e, const struct text_ids *t,
                        const struct rt_eval_result *r) {
  printf("cedar eval: plan %s (%s), ", e->plan.name, e->plan.serving.ced ? "CED" : "dense");
  if (o->model) printf("model %s\n", o->model);
  else if (o->weights) printf("weights %s\n", o->weights);
  else printf("synthetic weights, seed %llu\n", (unsigned long long)o->seed);
  printf("text %s: %lld bytes, %lld ids from %s\n", o->text, (long long)t->text_bytes, (long long)t->n, t->how);
  printf("windows: %lld of context %lld, stride %lld (after the first, every scored id has >= %lld ids before "
         "it in its window); prefill then one decode step per scored id\n", (long long)r->windows,
         (long long)o->context, (long long)o->stride, (long long)(o->context - o->stride));
  printf("scored: %lld ids, %lld bytes\n", (long long)r->tokens, (long long)r->bytes);
  printf("  bits per byte        %.6f\n", r->bytes ? r->nll / log(2.0) / (double)r->bytes : 0);
  printf("  perplexity           %.6g (per id)\n", exp(r->nll / (double)r->tokens));
  printf("  next-token accuracy  %.4f (%lld of %lld)\n", (double)r->correct / (double)r->tokens,
         (long long)r->correct, (long long)r->tokens);
  if ((o->dense_ref || o->f32_ref) && r->bytes)
    printf("  vs %s: its bits per byte %.6f (plan - it: %+.3g), top-1 agreement %.4f, KL(it || plan) %.6g nats per id "
           "(it ran %.1f s)\n", ref_words(o), r->ref_nll / log(2.0) / (double)r->bytes, (r->nll - r->ref_nll) / log(2.0) / (double)r->bytes,
           (double)r->agree / (double)r->tokens, r->kl / (double)r->tokens, r->ref_seconds);
  printf("time: %.2f s, %.1f ids/s (%s executor, %lld decode steps)\n", r->seconds,
         r->seconds > 0 ? (double)r->tokens / r->seconds : 0, rt_executor_name(o->executor),
         (long long)r->decode_steps);
}

/* ---- the command ------------------------------------------------------------ */

static void open_failed(const struct rt_engine *e, const struct eopts *o, const struct plan_diags *d,
                        const struct weights_problems *pr, const char *err) {
  if (e->failed == RT_ENGINE_PLAN) plan_diags_print(d, stderr);
  fprintf(stderr, "cedar eval: %s\n", err);
  if ((e->failed == RT_ENGINE_PLAN && o->model) || (e->failed == RT_ENGINE_WEIGHTS && (o->weights || o->model)))
    weights_problems_print(pr, stderr, 20);
}

/* The engine, or with ref the reference of o (dense or f32) on the direct executor. */
static int open_engine(struct rt_engine *e, const struct eopts *o, struct text_ids *t, bool ref) {
  struct plan_diags diags = {0};
  struct weights_problems pr = {0};
  char err[1024];
  struct rt_engine_opts eo = {.plan = o->plan ? o->plan : o->model ? NULL : cli_default_plan(),
                              .weights = o->weights,
                              .model = o->model,
                              .tokenizer = o->tokenizer,
                              .seed = o->seed,
                              .exec = {.executor = ref ? RT_EXEC_DIRECT : o->executor,
                                       .workers = o->workers,
                                       .sched = o->sched},
                              .dense = ref && o->dense_ref,
                              .f32 = ref && o->f32_ref,
                              .diags = &diags,
                              .problems = &pr,
                              .on_plan = ids_fit,
                              .user = t};
  int rc = rt_engine_open(e, &eo, err, sizeof err);
  if (rc) open_failed(e, o, &diags, &pr, err);
  else if (!ref) plan_diags_print(&diags, stderr); /* the plan's warnings, once */
  plan_diags_free(&diags);
  weights_problems_free(&pr);
  return rc ? 1 : 0;
}

int cmd_eval(int argc, char **argv) {
  struct eopts o;
  int rc = parse(argc, argv, &o);
  if (rc >= 0) return rc;
  char err[1024];
  size_t len = 0;
  char *text = cedar_read_all(o.text, o.max_bytes, &len, err, sizeof err);
  if (!text) {
    fprintf(stderr, "cedar eval: --text: %s%s\n", err, strstr(err, "limit") ? " (or raise --max-bytes)" : "");
    return 1;
  }
  if (!len) {
    fprintf(stderr, "cedar eval: --text %s is empty: give a text to score\n", o.text);
    free(text);
    return 1;
  }
  struct text_ids t;
  rc = text_ids(&o, text, len, &t);
  free(text);
  if (rc) return 1;
  int status = 1;
  if (t.n < 2) {
    fprintf(stderr, "cedar eval: --text %s gives %lld id(s) (%s): scoring needs at least 2 (the first is only "
            "context)\n", o.text, (long long)t.n, t.how);
    goto done;
  }
  if (comm_begin(&argc, &argv, err, sizeof err)) { /* under mpirun: MPI before StarPU (runtime/dist/pd.h) */
    fprintf(stderr, "cedar eval: %s\n", err);
    goto done;
  }
  bool with_ref = o.dense_ref || o.f32_ref;
  if (with_ref && comm_world_size() > 1) {
    fprintf(stderr, "cedar eval: %s runs in one process; run it without mpirun\n", o.dense_ref ? "--dense-ref" : "--f32-ref");
    comm_end();
    goto done;
  }
  struct rt_engine e, ref;
  memset(&ref, 0, sizeof ref);
  if (open_engine(&e, &o, &t, false)) goto out;
  if (with_ref && open_engine(&ref, &o, &t, true)) goto out;
  struct progress pg = {now_s(), now_s(), isatty(2), false};
  struct rt_eval_opts eo = {.context = o.context,
                            .stride = o.stride,
                            .per_token = o.per_token,
                            .ref = with_ref ? &ref : NULL,
                            .progress = progress_cb,
                            .user = &pg};
  struct rt_eval_result r;
  rc = rt_eval_text(&e, t.ids, t.bytes, t.n, &eo, &r, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar eval: %s\n", err);
  } else if (!r.elsewhere) {
    if (o.json) report_json(&o, &e, &t, &r);
    else report_text(&o, &e, &t, &r);
    status = 0;
  } else {
    status = 0; /* another rank reports */
  }
  rt_eval_result_free(&r);
out:
  rt_engine_close(&ref);
  rt_engine_close(&e);
  comm_end();
done:
  free(t.ids);
  free(t.bytes);
  return status;
}

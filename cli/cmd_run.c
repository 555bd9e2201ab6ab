/* cmd_run.c: `cedar run`, the main job: a prompt in, tokens out, through the
 * graph compiled from the plan, on the direct executor (default) or the
 * StarPU one (runtime/engine/engine.h opens plan, weights, model, pools and the
 * executor; runtime/gen/generate.h runs the request).
 *
 * --prompt TEXT is text (cli/run_text.h: the chat format, the vocab check,
 * the output streamed as text until EOS, --stop or --max-new).
 * Prints the generated ids (or text), TTFT, first and steady ITL, token-layers, bytes
 * by state class (checked against `cedar plan cost` for the same length),
 * peak memory and time by op group; --json prints the same as one object.
 * --exact-replay runs the prompt a second time with the decoder replaying
 * every position (the state bounded replay approximates) and reports the
 * drift. --dump writes logits, tokens and caches as safetensors for the
 * oracle comparison (tests/oracle/compare.py). --trace writes what ran as
 * Chrome Trace Event JSON (viz/trace.h), --dot the prefill graph as DOT.
 * Tested by tests/cli/run.sh, run_text.sh, oracle_run.sh and trace.sh.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "runtime/device/cuda_backend.h"
#include "runtime/comm/comm.h"
#include "ops/isa.h"
#include "base/check.h"
#include "base/file.h"
#include "cli/cli.h"
#include "cli/run_opts.h"
#include "cli/run_spec.h"
#include "runtime/engine/speculate.h"
#include "runtime/node/backend.h"
#include "runtime/engine/engine.h"
#include "cli/run_dump.h"
#include "cli/run_pd.h"
#include "cli/run_text.h"
#include "cli/run_place.h"
#include "cli/weights_resident.h"
#include "scheduler/plan_place.h"
#include "runtime/dist/pd.h"
#include "scheduler/plan_cost.h"
#include "viz/trace.h"


/* The --help text: cli/run_usage.c (printf arguments: the default plan, the
 * built-in prompt's length). */


/* The prompt as ids; CEDAR_EINVAL with a message naming the bad id. */
static int make_prompt(const struct ropts *o, int vocab, int32_t **out, int64_t *n, char *err, size_t len) {
  const char *text = o->prompt ? o->prompt : run_default_prompt;
  if (o->tokens) {
    int64_t cap = 1;
    for (const char *s = o->tokens; *s; s++) cap += *s == ',';
    *out = cedar_xmalloc(sizeof(int32_t) * (size_t)cap);
    *n = 0;
    char *copy = cedar_xstrdup(o->tokens);
    /* every item between commas is an id: "1,,2" and "1," are refused (strtok would skip the empty ones) */
    for (char *t = copy, *next; t; t = next) {
      next = strchr(t, ',');
      if (next) *next++ = 0;
      int64_t v;
      if (!cli_parse_int(t, 0, vocab - 1, &v)) {
        snprintf(err, len, "--tokens: '%s' (item %lld) is not a token id in [0, %d)", t, (long long)*n + 1, vocab);
        free(copy);
        return CEDAR_EINVAL;
      }
      (*out)[(*n)++] = (int32_t)v;
    }
    free(copy);
    if (!*n) {
      snprintf(err, len, "--tokens: no token ids given");
      return CEDAR_EINVAL;
    }
    return 0;
  }
  if (vocab < 256) {
    snprintf(err, len, "byte tokens need model.vocab >= 256 (the plan has %d); use --tokens", vocab);
    return CEDAR_EINVAL;
  }
  size_t tl = strlen(text);
  if (!tl) {
    snprintf(err, len, "--prompt is empty");
    return CEDAR_EINVAL;
  }
  *n = o->prompt_len ? o->prompt_len : (int64_t)tl;
  *out = cedar_xmalloc(sizeof(int32_t) * (size_t)*n);
  for (int64_t i = 0; i < *n; i++) (*out)[i] = (unsigned char)text[i % (int64_t)tl];
  return 0;
}

/* ---- progress ------------------------------------------------------------ */

struct progress {
  double t0, last;
  bool shown;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress_cb(void *user, int done, int total) {
  struct progress *pg = user;
  double t = now_s();
  if (t - pg->t0 < 1.0 || (t - pg->last < 0.1 && done < total)) return;
  pg->last = t;
  pg->shown = true;
  int w = 40, fill = (int)((int64_t)w * done / total);
  fprintf(stderr, "\rprefill [%.*s%*s] %3d%% %.1f s", fill, "########################################", w - fill,
          "", (int)(100LL * done / total), t - pg->t0);
  if (done == total) fputc('\n', stderr);
}

/* ---- opening the engine ---------------------------------------------------- */

/* The prompt, made once the plan is known (its vocab), before the weights. */
struct prompt {
  const struct ropts *o;
  int32_t *ids;
  int64_t n;
  const struct run_text *text; /* --prompt: ids made already, checked against the vocab here */
};

static int prompt_on_plan(void *user, const struct plan *p, char *err, size_t len) {
  struct prompt *q = user;
  /* the prompt and the tokens to generate must fit the positions the plan's RoPE covers (checked before the
   * prompt is made: --prompt-len 2e9 would otherwise allocate gigabytes first) */
  int64_t n = q->o->prompt_len ? q->o->prompt_len : 0, max = plan_max_positions(p);
  if (n + q->o->max_new > max) {
    snprintf(err, len, "--prompt-len %lld plus --max-new %d is more than the %lld positions plan %s holds "
             "(model.rope.csa)", (long long)n, q->o->max_new, (long long)max, p->name);
    return CEDAR_EINVAL;
  }
  int rc = q->text ? run_text_fits(q->text, q->ids, q->n, p->model.vocab, p->name, err, len)
                   : make_prompt(q->o, p->model.vocab, &q->ids, &q->n, err, len);
  if (!rc && q->n + q->o->max_new > max) {
    snprintf(err, len, "a prompt of %lld tokens plus --max-new %d is more than the %lld positions plan %s holds "
             "(model.rope.csa)", (long long)q->n, q->o->max_new, (long long)max, p->name);
    return CEDAR_EINVAL;
  }
  return rc;
}

/* Each step's failure worded as `cedar run` always has. */
static void open_failed(const struct rt_engine *e, const struct ropts *o, const struct plan_diags *d,
                        const struct weights_problems *pr, const char *err) {
  switch (e->failed) {
  case RT_ENGINE_PLAN:
    plan_diags_print(d, stderr);
    fprintf(stderr, "cedar run: %s\n", err);
    if (o->model) weights_problems_print(pr, stderr, 40);
    break;
  case RT_ENGINE_WEIGHTS:
    if (o->weights || o->model) {
      fprintf(stderr, "cedar run: %s\n", err);
      weights_problems_print(pr, stderr, 20);
    } else {
      fprintf(stderr, "cedar run: %s; or give --weights W, or a smaller plan\n", err);
    }
    break;
  case RT_ENGINE_MODEL: fprintf(stderr, "cedar run: plan %s: %s\n", e->name, err); break;
  default: fprintf(stderr, "cedar run: %s\n", err); break;
  }
}

/* ---- report ------------------------------------------------------------- */

struct drift {
  double max_abs, rel_rms;
  bool same_top1, entries_equal;
  int64_t exact_token_layers;
};

/* "starpu (lws, 2 CPU workers)" or "direct (one thread)". */
static void executor_desc(const struct ropts *o, char *b, size_t len) {
  if (o->executor == RT_EXEC_DIRECT)
    snprintf(b, len, "direct (one thread)");
  else
    snprintf(b, len, "starpu (%s, %d CPU worker%s)", rt_starpu_sched(), rt_starpu_workers(),
             rt_starpu_workers() == 1 ? "" : "s");
}

static double sum_op(const struct rt_exec_stats *s) {
  double t = 0;
  for (int i = 0; i < GRAPH_OP_COUNT; i++) t += s->op_seconds[i];
  return t;
}

static void report_text(const struct plan *p, const struct ropts *o, const struct weights *w, int64_t n,
                        const struct rt_gen_result *res, const struct rt_state_bytes *b, const struct plan_cost *pc,
                        const struct drift *dr, const struct rt_dist_report *dist, long rss_kb) {
  char fp[17];
  weights_fingerprint_hex(w->list.fingerprint, fp);
  printf("plan %s (%s, %d layers); weights ", p->name, res->replay ? "CED" : "dense", p->n_layers);
  if (w->synthetic && !o->weights && !o->model)
    printf("synthetic, seed %" PRIu64, w->seed);
  else
    printf("%s", o->model ? o->model : o->weights);
  char ex[96];
  executor_desc(o, ex, sizeof ex);
  printf(" (fingerprint %s); executor %s; kernels at %s\n", fp, ex, op_isa_name(op_isa()));
  if (o->engram_map) printf("engram token map: %s\n", o->engram_map);
  if (o->out) {
    run_text_report(o->out, o->raw ? "raw text" : "chat format", o->prompt_ids, n, res->tokens, res->n_tokens, o->ids);
  } else {
    printf("prompt %" PRId64 " tokens", n);
    for (int64_t i = 0; o->ids && i < n; i++) printf("%s%d", i ? " " : ": ", o->prompt_ids[i]);
    printf("; generated %d:", res->n_tokens);
    for (int i = 0; i < res->n_tokens; i++) printf(" %d", res->tokens[i]);
    printf("\n");
  }
  printf("TTFT %.3f s", res->ttft_s);
  if (res->n_tokens > 1) printf("; ITL first %.2f ms", 1e3 * res->first_itl_s);
  if (res->n_tokens > 2) printf(", steady %.2f ms (%.1f tok/s)", 1e3 * res->steady_itl_s, 1.0 / res->steady_itl_s);
  printf("\ntoken-layers: prefill %" PRId64, res->prefill.token_layers);
  if (res->replay) printf(" (encoder %" PRId64 " positions, decoder replay %" PRId64 ")", n, res->replay);
  printf(", decode %" PRId64 "\n", res->decode.token_layers);
  printf("graphs: prefill %d nodes, %d edges; decode step %d nodes\n", res->prefill_nodes, res->prefill_edges,
         res->decode_nodes);
  printf("state after %" PRId64 " positions: global KV %" PRId64 " entries, %" PRId64 " B (pages %" PRId64
         " B); SWA %" PRId64 " B; tails %" PRId64 " B; kept encoder outputs %" PRId64 " B; tokens %" PRId64
         " B\n",
         pc->q.tokens, b->kv_entries, b->kv_entry_bytes, b->kv_page_bytes, b->swa_bytes, b->tail_bytes, b->xe_bytes,
         b->token_bytes);
  bool agree = b->kv_entry_bytes == pc->bytes && b->kv_entries == pc->entries &&
               b->swa_bytes == pc->swa_payload_bytes + pc->swa_scale_bytes && b->tail_bytes == pc->tail_bytes;
  printf("  `cedar plan cost --tokens %" PRId64 "` %s: global %" PRId64 " B, SWA %" PRId64 " B, tails %" PRId64
         " B\n",
         pc->q.tokens, agree ? "agrees" : "DISAGREES", pc->bytes, pc->swa_payload_bytes + pc->swa_scale_bytes,
         pc->tail_bytes);
  int64_t act = res->prefill.act_peak_bytes > res->decode.act_peak_bytes ? res->prefill.act_peak_bytes
                                                                          : res->decode.act_peak_bytes;
  int64_t scr = res->prefill.scratch_peak_bytes > res->decode.scratch_peak_bytes ? res->prefill.scratch_peak_bytes
                                                                                  : res->decode.scratch_peak_bytes;
  struct weights_resident wr;
  weights_resident(w, &wr); /* as held (the line below says by format) */
  printf("peak memory: activations %.2f MB, scratch %.2f MB, weights %.1f MB, max RSS %.1f MB\n", act / 1e6,
         scr / 1e6, (double)wr.total / 1e6, rss_kb / 1e3);
  cli_weights_resident_line(stdout, p, w);
  double tp = sum_op(&res->prefill), td = sum_op(&res->decode);
  printf("time by op group (prefill | decode):");
  for (int i = 0; i < GRAPH_OP_COUNT; i++)
    if (res->prefill.op_nodes[i] || res->decode.op_nodes[i])
      printf(" %s %.0f%% | %.0f%%;", graph_op_name(i), tp > 0 ? 100 * res->prefill.op_seconds[i] / tp : 0,
             td > 0 ? 100 * res->decode.op_seconds[i] / td : 0);
  printf("\n");
  if (dr)
    printf("exact replay (decoder over all %" PRId64 " positions, %" PRId64 " token-layers): encoder region %s; "
           "decoder region: last-position logits max |diff| %.3g, relative RMS %.3g, top-1 %s\n",
           n, dr->exact_token_layers, dr->entries_equal ? "identical (global entries bitwise equal)" : "DIFFERS",
           dr->max_abs, dr->rel_rms, dr->same_top1 ? "same" : "differs");
  if (dist->pd) run_pd_text(stdout, p, dist);
  if (dist->pipe) run_pipe_text(stdout, p, dist, res->n_tokens - 1);
  if (dist->ep) run_ep_text(stdout, p, dist); /* routed experts on ranks (cli/run_ep.c) */
}

static void report_json(const struct plan *p, const struct ropts *o, const struct weights *w, int64_t n,
                        const struct rt_gen_result *res, const struct rt_state_bytes *b, const struct plan_cost *pc,
                        const struct drift *dr, const struct rt_dist_report *dist, long rss_kb) {
  cJSON *j = cJSON_CreateObject();
  char fp[17];
  weights_fingerprint_hex(w->list.fingerprint, fp);
  cJSON *ex = cJSON_AddObjectToObject(j, "executor");
  cJSON_AddStringToObject(ex, "name", rt_executor_name(o->executor));
  if (o->executor == RT_EXEC_STARPU) {
    cJSON_AddStringToObject(ex, "sched", rt_starpu_sched());
    cJSON_AddNumberToObject(ex, "workers", rt_starpu_workers());
  }
  cJSON_AddStringToObject(ex, "isa", op_isa_name(op_isa()));
  cJSON_AddStringToObject(j, "plan", p->name);
  cJSON_AddStringToObject(j, "flow", res->replay ? "ced" : "dense");
  cJSON_AddStringToObject(j, "weights_fingerprint", fp);
  cJSON_AddNumberToObject(j, "prompt_tokens", (double)n);
  if (o->engram_map) cJSON_AddStringToObject(j, "engram_map", o->engram_map);
  if (o->out) run_text_json(j, o->out, o->raw ? "raw text" : "chat format", o->prompt_ids, n, o->ids);
  else if (o->ids) run_text_ids_json(j, o->prompt_ids, n);
  cJSON *t = cJSON_AddArrayToObject(j, "tokens");
  for (int i = 0; i < res->n_tokens; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(res->tokens[i]));
  cJSON_AddNumberToObject(j, "ttft_s", res->ttft_s);
  cJSON_AddNumberToObject(j, "itl_first_s", res->first_itl_s);
  cJSON_AddNumberToObject(j, "itl_steady_s", res->steady_itl_s);
  cJSON_AddNumberToObject(j, "decoder_replay", (double)res->replay);
  cJSON_AddNumberToObject(j, "token_layers_prefill", (double)res->prefill.token_layers);
  cJSON_AddNumberToObject(j, "token_layers_decode", (double)res->decode.token_layers);
  cJSON_AddNumberToObject(j, "prefill_nodes", res->prefill_nodes);
  cJSON_AddNumberToObject(j, "prefill_edges", res->prefill_edges);
  cJSON_AddNumberToObject(j, "decode_nodes", res->decode_nodes);
  cJSON *s = cJSON_AddObjectToObject(j, "state_bytes");
  cJSON_AddNumberToObject(s, "positions", (double)pc->q.tokens);
  cJSON_AddNumberToObject(s, "global_kv_entries", (double)b->kv_entries);
  cJSON_AddNumberToObject(s, "global_kv", (double)b->kv_entry_bytes);
  cJSON_AddNumberToObject(s, "global_kv_pages", (double)b->kv_page_bytes);
  cJSON_AddNumberToObject(s, "swa", (double)b->swa_bytes);
  cJSON_AddNumberToObject(s, "tails", (double)b->tail_bytes);
  cJSON_AddNumberToObject(s, "tokens", (double)b->token_bytes);
  cJSON_AddNumberToObject(s, "encoder_outputs", (double)b->xe_bytes);
  cJSON *c = cJSON_AddObjectToObject(j, "plan_cost");
  cJSON_AddNumberToObject(c, "global_kv_entries", (double)pc->entries);
  cJSON_AddNumberToObject(c, "global_kv", (double)pc->bytes);
  cJSON_AddNumberToObject(c, "swa", (double)(pc->swa_payload_bytes + pc->swa_scale_bytes));
  cJSON_AddNumberToObject(c, "tails", (double)pc->tail_bytes);
  cJSON *m = cJSON_AddObjectToObject(j, "peak_bytes");
  cJSON_AddNumberToObject(m, "activations_prefill", (double)res->prefill.act_peak_bytes);
  cJSON_AddNumberToObject(m, "activations_decode", (double)res->decode.act_peak_bytes);
  cJSON_AddNumberToObject(m, "scratch", (double)(res->prefill.scratch_peak_bytes > res->decode.scratch_peak_bytes
                                                     ? res->prefill.scratch_peak_bytes
                                                     : res->decode.scratch_peak_bytes));
  struct weights_resident wr;
  weights_resident(w, &wr);
  cJSON_AddNumberToObject(m, "weights", (double)wr.total);
  cJSON_AddNumberToObject(m, "max_rss", rss_kb * 1024.0);
  cJSON *wj = cJSON_AddObjectToObject(j, "weights_resident"); /* by held format (docs/weights.md) */
  static const char *const fmt[4] = {"f32", "bf16", "fp8", "fp4"};
  for (int i = 0; i < 4; i++) cJSON_AddNumberToObject(wj, fmt[i], (double)wr.bytes[i]);
  cJSON_AddNumberToObject(wj, "widened_f32", (double)wr.widened);
  cJSON_AddNumberToObject(wj, "widened_stored", (double)wr.widened_stored);
  cJSON_AddNumberToObject(wj, "engram_mapped", (double)wr.engram_mapped);
  cJSON *ops = cJSON_AddObjectToObject(j, "op_seconds");
  for (int i = 0; i < GRAPH_OP_COUNT; i++) {
    if (!res->prefill.op_nodes[i] && !res->decode.op_nodes[i]) continue;
    cJSON *e = cJSON_AddObjectToObject(ops, graph_op_name(i));
    cJSON_AddNumberToObject(e, "prefill", res->prefill.op_seconds[i]);
    cJSON_AddNumberToObject(e, "decode", res->decode.op_seconds[i]);
  }
  if (dr) {
    cJSON *d = cJSON_AddObjectToObject(j, "exact_replay");
    cJSON_AddNumberToObject(d, "token_layers", (double)dr->exact_token_layers);
    cJSON_AddBoolToObject(d, "encoder_entries_equal", dr->entries_equal);
    cJSON_AddNumberToObject(d, "decoder_logits_max_abs", dr->max_abs);
    cJSON_AddNumberToObject(d, "decoder_logits_rel_rms", dr->rel_rms);
    cJSON_AddBoolToObject(d, "same_top1", dr->same_top1);
  }
  if (dist->pd) run_pd_json(j, p, dist);
  if (dist->pipe) run_pipe_json(j, p, dist);
  if (dist->ep) run_ep_json(j, p, dist);
  cli_print_json(j);
}

/* ---- exact replay -------------------------------------------------------- */

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return b;
}

/* Prefill again with the decoder over every position; compare the last
 * logits and the global entries (which the encoder region alone decides). */
static int exact_replay(struct rt_engine *e, const struct rt_request *r0, const int32_t *prompt, int64_t n,
                        const struct ropts *o, const struct rt_gen_result *res, struct drift *dr, char *err,
                        size_t len) {
  const struct rt_model *M = &e->model;
  struct rt_request r;
  struct rt_gen_result ex;
  struct rt_gen_opts go = {.chunk = o->chunk, .replay = n, .max_new = 1, .top_p = 1};
  int rc = rt_engine_generate(e, &r, prompt, n, &go, &ex, err, len);
  if (!rc) {
    int V = M->p->model.vocab;
    const float *a = res->prefill_logits + (size_t)(res->prefill_rows - 1) * V;
    const float *b = ex.prefill_logits + (size_t)(ex.prefill_rows - 1) * V;
    double ss = 0, sd = 0;
    dr->max_abs = 0;
    for (int i = 0; i < V; i++) {
      double d = (double)a[i] - b[i];
      if (fabs(d) > dr->max_abs) dr->max_abs = fabs(d);
      sd += d * d;
      ss += (double)b[i] * b[i];
    }
    dr->rel_rms = ss > 0 ? sqrt(sd / ss) : 0;
    dr->same_top1 = argmax(a, V) == argmax(b, V);
    dr->exact_token_layers = ex.prefill.token_layers;
    /* Entries of the first n positions: the run under test has also decoded. */
    dr->entries_equal = true;
    for (int l = 0; l < M->p->n_layers; l++) {
      const struct rt_kv_seq *s = &r.seq[l], *t = &r0->seq[l];
      if (!s->pool) continue;
      for (int64_t e = 0; e < s->n_entries && dr->entries_equal; e++)
        if (e >= t->n_entries || memcmp(rt_kv_entry(s, e), rt_kv_entry(t, e), s->pool->entry_bytes))
          dr->entries_equal = false;
    }
  }
  rt_gen_result_free(&ex);
  rt_engine_request_free(e, &r);
  return rc;
}

/* ---- --trace and --dot ----------------------------------------------------- */

struct sink {
  struct viz_trace trace;
  bool tracing;
  struct cedar_out dot; /* open (dot.f) until the prefill graph is written; base/file.h */
  char dot_err[512];
  const char *dot_path;
  int request;
  bool dot_failed;
};

/* Every graph that ran: the first (the prefill) to --dot, all to --trace. */
static void on_graph(void *user, const struct graph *g, const struct rt_task_time *times) {
  struct sink *s = user;
  if (s->dot.f) {
    graph_dot(g, s->dot.f);
    s->dot_failed = cedar_out_commit(&s->dot, s->dot_err, sizeof s->dot_err) != 0;
  }
  if (!s->tracing || !times) return;
  if (run_pipe_trace_graph(&s->trace, g, s->request)) return; /* layer stages under mpirun: a process per rank */
  struct viz_task_time *vt = cedar_xmalloc(sizeof(*vt) * (size_t)(g->n_node > 0 ? g->n_node : 1));
  for (int k = 0; k < g->n_node; k++) vt[k] = (struct viz_task_time){times[k].worker, times[k].start_us, times[k].end_us};
  viz_trace_add_graph(&s->trace, g, vt, s->request);
  free(vt);
}

/* Name the trace's worker tracks and open --dot before the run (the engine
 * has started StarPU, with profiling for --trace), so a bad path fails
 * before minutes of prefill. */
static int sink_open(struct sink *s, const struct ropts *o, const struct plan *p, char *err, size_t len) {
  memset(s, 0, sizeof(*s));
  if (o->trace) {
    char name[96];
    snprintf(name, sizeof name, "cedar run %s", p->name);
    viz_trace_init(&s->trace, name, (int)getpid());
    for (int i = 0; i < rt_starpu_workers(); i++) {
      char wn[32];
      rt_starpu_worker_name(i, wn, sizeof wn);
      viz_trace_thread(&s->trace, i, wn);
    }
    s->tracing = true;
  }
  if (o->dot && cedar_out_open(&s->dot, o->dot, s->dot_err, sizeof s->dot_err)) {
    snprintf(err, len, "--dot: %s", s->dot_err);
    return 1;
  }
  s->dot_path = o->dot;
  return 0;
}

/* Write the trace; report a failed DOT write. Returns 0 or 1. */
static int sink_close(struct sink *s, const struct ropts *o, bool ok) {
  char err[512];
  int status = 0;
  cedar_out_discard(&s->dot); /* a run that ended before its prefill graph: no partial file */
  if (ok && s->dot_failed) {
    fprintf(stderr, "cedar run: --dot: %s\n", s->dot_err);
    status = 1;
  }
  if (ok && s->tracing && viz_trace_write(&s->trace, o->trace, err, sizeof err)) {
    fprintf(stderr, "cedar run: --trace: %s\n", err);
    status = 1;
  } else if (ok && s->tracing && viz_trace_prefetch_text(&s->trace, err, sizeof err)) {
    fprintf(stderr, "cedar run: --trace: %s\n", err);
  }
  if (s->tracing) viz_trace_free(&s->trace);
  return status;
}

/* ---- the command --------------------------------------------------------- */

/* The request's options from run's: sampling, text out, progress on the
 * terminal (pg, or NULL), the trace and graph sink. */
static struct rt_gen_opts gen_opts(const struct ropts *o, struct text_out *tout, struct progress *pg,
                                   struct sink *sk) {
  return (struct rt_gen_opts){.chunk = o->chunk,
                              .replay = o->replay,
                              .max_new = o->max_new,
                              .temperature = o->temperature,
                              .top_p = o->top_p,
                              .top_k = o->top_k,
                              .rep_penalty = o->rep_penalty,
                              .seed = o->sample_seed_given ? o->sample_seed : o->seed,
                              .on_token = o->out ? text_out_on_token : NULL,
                              .token_user = tout,
                              .all_logits = o->dump != NULL,
                              .progress = pg ? progress_cb : NULL,
                              .user = pg,
                              .on_graph = o->trace || o->dot ? on_graph : NULL,
                              .graph_user = sk};
}

/* What is refused before the plan and weights load, when nothing could run:
 * 0, or 1 with the reason on stderr. */
static int preflight(const struct ropts *o) {
  char err[1024];
  if (o->device && !strcmp(o->device, "cuda") && rt_cuda_ready(err, sizeof err)) {
    fprintf(stderr, "cedar run: --device cuda: %s; run with --device cpu\n", err);
    return 1;
  }
  if (o->speculate && (o->prompt || o->n_stops || o->ids)) {
    fprintf(stderr, "cedar run: --speculate runs on ids (--tokens or --prompt-len), greedy or sampled (every sampling "
                    "option); text prompts, --stop and --ids are not wired into it yet\n");
    return 1;
  }
  return 0;
}

/* The request's report once it ran on this rank: its state bytes (every
 * rank's under layer stages) against plan cost, --exact-replay's drift,
 * --dump, then the text or JSON report. 0, or 1 with the reason on stderr. */
static int report_request(struct rt_engine *e, struct rt_request *r, const int32_t *prompt, int64_t n,
                          struct ropts *o, struct rt_gen_result *res) {
  const struct plan *p = &e->plan;
  char err[1024];
  struct rt_state_bytes b;
  rt_request_bytes(r, &b);
  run_pipe_state_bytes(&b, &e->dist); /* layer stages under mpirun: every rank's global entries */
  struct plan_cost pc;
  struct plan_cost_query pq;
  plan_cost_query_init(&pq);
  pq.tokens = r->n_pos;
  pq.prompt = n;
  if (plan_cost_compute(p, &pq, &pc)) {
    fprintf(stderr, "cedar run: plan cost: %s\n", pc.error);
    return 1;
  }
  struct drift dr, *drp = NULL;
  if (o->exact) {
    if (exact_replay(e, r, prompt, n, o, res, &dr, err, sizeof err)) {
      fprintf(stderr, "cedar run: --exact-replay: %s\n", err);
      return 1;
    }
    drp = &dr;
  }
  if (o->dump && run_dump_write(o->dump, &e->model, r, res, err, sizeof err)) {
    fprintf(stderr, "cedar run: --dump: %s\n", err);
    return 1;
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  o->engram_map = e->model.cmap ? e->model.cmap_source : NULL;
  if (o->json)
    report_json(p, o, &e->weights, n, res, &b, &pc, drp, &e->dist, ru.ru_maxrss);
  else
    report_text(p, o, &e->weights, n, res, &b, &pc, drp, &e->dist, ru.ru_maxrss);
  return 0;
}

int cmd_run(int argc, char **argv) {
  struct ropts o;
  int rc = run_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  if ((o.dump && cli_check_out("run", "--dump", o.dump)) || (o.dot && cli_check_out("run", "--dot", o.dot)) ||
      (o.trace && cli_check_out("run", "--trace", o.trace)) || (o.dump_round && run_round_begin(o.dump_round)))
    return 1;
  char err[1024];
  int status = 1;
  if (preflight(&o)) return 1;
  struct prompt q = {&o, NULL, 0, NULL};
  struct run_text tx = {0};
  struct text_out tout = {0};
  if (o.prompt) { /* text: the tokenizer and the prompt's ids first, checked against the plan's vocab on_plan */
    if (run_text_open(&tx, "run", o.tokenizer, o.model)) return 1;
    if (run_text_prompt(&tx, o.prompt, o.raw, o.system, &q.ids, &q.n, NULL, err, sizeof err)) {
      fprintf(stderr, "cedar run: %s\n", err);
      run_text_close(&tx);
      return 1;
    }
    q.text = &tx;
    run_text_out(&tx, &tout, o.stops, o.n_stops, !o.json);
    o.out = &tout, o.prompt_ids = q.ids;
  }
  struct plan_diags diags = {0};
  struct weights_problems pr = {0};
  struct rt_engine_opts eo = {.plan = o.plan ? o.plan : o.model ? NULL : cli_default_plan(),
                              .weights = o.weights,
                              .model = o.model,
                              .tokenizer = o.tokenizer ? o.tokenizer : o.prompt ? tx.tok_path : NULL,
                              .seed = o.seed,
                              .weights_f32 = o.weights_f32,
                              .exec = {.executor = o.executor,
                                       .workers = o.workers,
                                       .sched = o.sched,
                                       .profile = o.trace != NULL,
                                       .cuda = o.device && !strcmp(o.device, "cuda")},
                              .cuda_graphs = o.cuda_graphs,
                              .dev_scratch = o.cuda_scratch,
                              .diags = &diags,
                              .problems = &pr,
                              .on_plan = prompt_on_plan,
                              .user = &q};
  if (comm_begin(&argc, &argv, err, sizeof err)) { /* under mpirun: MPI before StarPU (runtime/dist/pd.h) */
    fprintf(stderr, "cedar run: %s\n", err);
    return 1;
  }
  struct rt_engine e;
  struct rt_request r = {0};
  struct rt_gen_result res = {0};
  struct sink sk = {0};
  rc = rt_engine_open(&e, &eo, err, sizeof err);
  if (rc) open_failed(&e, &o, &diags, &pr, err);
  else plan_diags_print(&diags, stderr); /* the plan's warnings */
  plan_diags_free(&diags);
  weights_problems_free(&pr);
  if (rc) goto out;
  const struct plan *p = &e.plan;
  if (o.exact && rt_pd_role_of(p) >= RT_PD_PREFILL) {
    fprintf(stderr, "cedar run: --exact-replay runs in one process; run it without mpirun\n");
    goto out;
  }
  int32_t *prompt = q.ids;
  o.prompt_ids = q.ids;
  int64_t n = q.n;
  if (sink_open(&sk, &o, p, err, sizeof err)) {
    fprintf(stderr, "cedar run: %s\n", err);
    goto out;
  }
  struct progress pg = {now_s(), 0, false};
  bool tty = isatty(2) && !o.json;
  struct rt_gen_opts go = gen_opts(&o, &tout, tty ? &pg : NULL, &sk);
  if (o.speculate) { /* plain and speculative side by side (cli/run_spec.c) */
    status = run_spec(&e, prompt, n, &go, &o.spec);
    goto out;
  }
  int grc = rt_engine_generate(&e, &r, prompt, n, &go, &res, err, sizeof err);
  if (!grc && o.dump_round && run_round_write(o.dump_round)) goto out; /* before --exact-replay runs again */
  if (grc == RT_GEN_ELSEWHERE && o.dump && (plan_has_stages(p) || p->serving.place.n_ep_ranks) &&
      run_pipe_dump(o.dump, &e.model, &r, &res, err, sizeof err)) {
    fprintf(stderr, "cedar run: --dump: %s\n", err); /* a stage's rank: its own layers' state, DUMP.rankN */
    goto out;
  }
  if (grc == RT_GEN_ELSEWHERE) { /* a rank other than the reporting one: the decode rank reports (and writes --trace) */
    sink_close(&sk, &o, false);
    memset(&sk, 0, sizeof sk);
    status = 0;
    goto out;
  }
  if (o.out) text_out_finish(&tout); /* what a partial character held back, then a line end after the text */
  if (o.out && !o.json && tout.len && tout.text[tout.len - 1] != '\n') putchar('\n');
  if (grc) {
    if (pg.shown) fputc('\n', stderr);
    fprintf(stderr, "cedar run: %s\n", err);
    goto out;
  }
  if (sk.tracing) run_pd_trace(&sk.trace, p, &e.dist.pd_trace); /* under mpirun: P's rank and the transfers too */
  status = report_request(&e, &r, prompt, n, &o, &res);
out:
  status |= sink_close(&sk, &o, status == 0);
  rt_gen_result_free(&res);
  rt_engine_request_free(&e, &r);
  rt_engine_close(&e);
  comm_end();
  free(q.ids);
  text_out_free(&tout);
  run_text_close(&tx);
  return status;
}

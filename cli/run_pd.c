/* run_pd.c: `cedar run`'s P/D section (run_pd.h), from the figures of the
 * last P/D request (the engine's report: runtime/dist/dist.h). */
#include "cli/run_pd.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"

#include "runtime/dist/pd.h"
#include "scheduler/plan_cost_pd.h"
#include "viz/trace.h"

/* The classes the plan knows agree with what moved (META is framing: no plan figure). */
static bool agrees(const struct rt_pd_stats *s) {
  for (int c = 0; c < RT_PD_META; c++)
    if (s->bytes[c] != s->expected[c]) return false;
  return true;
}

void run_pd_text(FILE *f, const struct plan *p, const struct rt_dist_report *rep) {
  const struct rt_pd_stats *s = &rep->pd_stats;
  char a[32], b[32];
  fprintf(f, "P/D: prefill on %s, decode on %s, %s\n", graph_place_str(graph_place_of(p, GRAPH_PREFILL_CED), a, sizeof a),
          graph_place_str(graph_place_of(p, GRAPH_DECODE), b, sizeof b),
          s->mpi ? "through StarPU-MPI" : "in one process (local copies)");
  fprintf(f, "  moved %" PRId64 " messages:", s->messages);
  int64_t tot = 0;
  for (int c = 0; c < RT_PD_CLASS_COUNT; c++) {
    fprintf(f, "%s %s %" PRId64 " B", c ? ";" : "", rt_pd_class_name(c), s->bytes[c]);
    tot += s->bytes[c];
  }
  fprintf(f, "; total %" PRId64 " B\n", tot);
  fprintf(f, "  the plan's package %s:", agrees(s) ? "agrees" : "DISAGREES");
  for (int c = 0; c < RT_PD_META; c++) fprintf(f, "%s %s %" PRId64 " B", c ? ";" : "", rt_pd_class_name(c), s->expected[c]);
  fprintf(f, "\n  prefill %.3f s; transfer %.3f s (first send to last arrival); KV sent before the prefill ended "
          "%.0f%% (%" PRId64 " B); handoff after the prefill %.2f ms%s; ready barrier %.3f ms\n",
          s->prefill_s, s->transfer_s, 100 * s->overlap, s->kv_bytes_before_end, 1e3 * s->handoff_s,
          s->replay_on_d ? " (D's replay included)" : "", 1e3 * s->ready_s);
  if (s->replay_on_d)
    fprintf(f, "  decoder replay on D: y1 sampled and delivered by D (the handoff and the replay are inside TTFT)\n");
  else
    fprintf(f, "  decoder replay on P: y1 sampled on P (inside TTFT), consumed on D by the first decode step (the "
            "handoff is outside TTFT, inside the first ITL)\n");
}

void run_pd_json(struct cJSON *j, const struct plan *p, const struct rt_dist_report *rep) {
  const struct rt_pd_stats *s = &rep->pd_stats;
  char a[32], b[32];
  cJSON *t = cJSON_AddObjectToObject(j, "transfer");
  cJSON_AddStringToObject(t, "prefill", graph_place_str(graph_place_of(p, GRAPH_PREFILL_CED), a, sizeof a));
  cJSON_AddStringToObject(t, "decode", graph_place_str(graph_place_of(p, GRAPH_DECODE), b, sizeof b));
  cJSON_AddStringToObject(t, "via", s->mpi ? "starpu-mpi" : "local");
  cJSON_AddNumberToObject(t, "messages", (double)s->messages);
  cJSON *by = cJSON_AddObjectToObject(t, "bytes");
  cJSON *ex = cJSON_AddObjectToObject(t, "plan_bytes");
  static const char *const key[RT_PD_CLASS_COUNT] = {"global_kv", "swa_encoder", "swa_decoder", "tails",
                                                     "encoder_outputs", "metadata"};
  for (int c = 0; c < RT_PD_CLASS_COUNT; c++) {
    cJSON_AddNumberToObject(by, key[c], (double)s->bytes[c]);
    if (c < RT_PD_META) cJSON_AddNumberToObject(ex, key[c], (double)s->expected[c]);
  }
  cJSON_AddBoolToObject(t, "agrees", agrees(s));
  cJSON_AddNumberToObject(t, "prefill_s", s->prefill_s);
  cJSON_AddNumberToObject(t, "transfer_s", s->transfer_s);
  cJSON_AddNumberToObject(t, "overlap", s->overlap);
  cJSON_AddNumberToObject(t, "kv_bytes_before_prefill_end", (double)s->kv_bytes_before_end);
  cJSON_AddNumberToObject(t, "handoff_s", s->handoff_s);
  cJSON_AddNumberToObject(t, "ready_s", s->ready_s);
  cJSON_AddStringToObject(t, "replay", s->replay_on_d ? "decode" : "prefill");
  cJSON_AddStringToObject(t, "y1", s->replay_on_d ? "sampled and consumed on D" : "sampled on P, consumed on D");
}

void run_pd_cost_print(FILE *f, const struct plan *p, int64_t n) {
  struct plan_pd_package k;
  if (plan_cost_pd_package(p, n, &k) || !k.split) return;
  fprintf(f, "\nP->D state package after a %" PRId64 "-token prompt (prefill on rank %d, decode on rank %d; decoder "
          "replay on %s)\n", n, p->serving.prefill_rank, p->serving.decode_rank, k.replay_on_decode ? "D" : "P");
  fprintf(f, "  %-46s %22" PRId64 "\n", "global KV (Main KV + Indexer K), B", k.kv);
  fprintf(f, "  %-46s %22" PRId64 "\n", "encoder SWA rings, B", k.swa_enc);
  fprintf(f, "  %-46s %22" PRId64 "\n", "decoder SWA rings, B", k.swa_dec);
  fprintf(f, "  %-46s %22" PRId64 "\n", "compressor tails, B", k.tails);
  fprintf(f, "  %-46s %22" PRId64 "\n", "kept encoder outputs (fp32), B", k.xe);
  fprintf(f, "  %-46s %22" PRId64 "\n", "total (metadata not counted), B", k.total);
}

void run_pd_cost_json(struct cJSON *j, const struct plan *p, int64_t n) {
  struct plan_pd_package k;
  if (plan_cost_pd_package(p, n, &k) || !k.split) return;
  cJSON *o = cJSON_AddObjectToObject(j, "pd_package");
  cJSON_AddStringToObject(o, "replay", k.replay_on_decode ? "decode" : "prefill");
  cJSON_AddNumberToObject(o, "prompt", (double)n);
  cJSON_AddNumberToObject(o, "global_kv", (double)k.kv);
  cJSON_AddNumberToObject(o, "swa_encoder", (double)k.swa_enc);
  cJSON_AddNumberToObject(o, "swa_decoder", (double)k.swa_dec);
  cJSON_AddNumberToObject(o, "tails", (double)k.tails);
  cJSON_AddNumberToObject(o, "encoder_outputs", (double)k.xe);
  cJSON_AddNumberToObject(o, "total", (double)k.total);
}

void run_pd_trace(struct viz_trace *t, const struct plan *p, const struct rt_pd_trace *x) {
  if (!x->g) return;
  (void)p;
  const struct graph *g = x->g;
  char name[96], old[sizeof t->process];
  memcpy(old, t->process, sizeof old);
  old[sizeof old - 1] = 0;
  /* at most 5 + 11 + 10 + 32 + 1 = 59 bytes: fits the 64 of t->process */
  snprintf(t->process, sizeof t->process, "rank %d: decode (%.32s)", x->d_rank, old);
  for (int i = 0; i < t->n_slice; i++) /* D's graphs so far: the process becomes D's rank */
    if (t->slice[i].pid == t->pid) t->slice[i].pid = x->d_rank;
  t->pid = x->d_rank;
  snprintf(name, sizeof name, "rank %d: prefill", x->p_rank);
  viz_trace_process(t, x->p_rank, name);
  int tid0 = t->n_thread; /* P's workers after D's tracks, then D's receives */
  for (int w = 0; w < x->p_workers; w++) {
    snprintf(name, sizeof name, "rank %d CPU %d", x->p_rank, w);
    viz_trace_thread_of(t, tid0 + w, x->p_rank, name);
  }
  int rx = tid0 + x->p_workers;
  snprintf(name, sizeof name, "rank %d StarPU-MPI receives", x->d_rank);
  viz_trace_thread_of(t, rx, x->d_rank, name);
  struct viz_task_time *vt = cedar_xmalloc(sizeof(*vt) * (size_t)(g->n_node > 0 ? g->n_node : 1));
  for (int k = 0; k < g->n_node; k++)
    vt[k] = (struct viz_task_time){tid0 + x->p_times[k].worker, x->p_times[k].start_us, x->p_times[k].end_us};
  int base = viz_trace_add_graph_at(t, g, vt, 0, x->p_rank);
  free(vt);
  /* the receives in arrival order: one short slice each (an arrival is an
   * instant; 1 us, cut short so the track's slices never overlap) */
  int n = 0;
  int *ord = cedar_xmalloc(sizeof(int) * (size_t)(g->n_node > 0 ? g->n_node : 1));
  for (int k = 0; k < g->n_node; k++)
    if (g->node[k].op == GRAPH_TRANSFER) ord[n++] = k;
  for (int i = 1; i < n; i++) /* insertion sort by arrival: a few hundred messages */
    for (int j = i; j > 0 && x->arrive_us[ord[j]] < x->arrive_us[ord[j - 1]]; j--) {
      int s = ord[j];
      ord[j] = ord[j - 1];
      ord[j - 1] = s;
    }
  double prev = 0;
  for (int i = 0; i < n; i++) {
    int k = ord[i];
    const struct graph_node *nd = &g->node[k];
    double ts = x->arrive_us[k], next = i + 1 < n ? x->arrive_us[ord[i + 1]] : ts + 1;
    if (ts < t->slice[base + k].ts) ts = t->slice[base + k].ts; /* never before its send (one clock: never happens) */
    if (ts < prev) ts = prev;
    struct viz_slice s = {.tid = rx, .ts = ts, .dur = next - ts < 1 ? (next - ts) / 2 : 1, .op = "transfer",
                          .mode = "recv", .phase = "transfer", .layer = nd->layer, .chunk = nd->chunk,
                          .request = 0, .node = k, .rank = x->d_rank, .pos = nd->a, .n = nd->n,
                          .pid = x->d_rank};
    if (s.dur < 0) s.dur = 0;
    prev = ts + s.dur;
    snprintf(s.name, sizeof s.name, "recv %s", nd->name);
    int idx = viz_trace_add_slice(t, &s);
    viz_trace_add_flow(t, base + k, idx, "transfer");
  }
  free(ord);
}

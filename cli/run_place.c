/* run_place.c: the printers of layer and expert placement (run_place.h):
 * `cedar plan cost --per-rank`, `cedar plan diff --per-rank`, and the
 * pipeline section of `cedar run`'s report. */
#include "cli/run_place.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_dump.h"
#include "runtime/comm/comm.h"
#include "runtime/dist/pd.h"

#include "base/check.h"
#include "runtime/exec/exec.h"
#include "runtime/dist/pipeline.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_place.h"
#include "viz/trace.h"

static double gb(int64_t b) { return (double)b / 1e9; }

static void layers_str(const struct rt_rank_cost *r, char *buf, size_t len) {
  if (r->first_layer < 0)
    snprintf(buf, len, "experts only");
  else
    snprintf(buf, len, "L%d-%d %s", r->first_layer, r->last_layer, r->cuda ? "cuda" : "cpu");
}

void place_cost_print(FILE *f, const struct plan *p, const struct rt_place_cost *c) {
  fprintf(f, "plan %s: %d rank%s, one request of N = %" PRId64 " tokens, capacity %.1f GB a device\n", p->name,
          c->ranks, c->ranks == 1 ? "" : "s", c->tokens, c->capacity / 1e9);
  fprintf(f, "weights in stored formats, all ranks: %.3f GB\n\n", gb(c->total_weights));
  fprintf(f, "%-4s %-16s %12s %12s %12s %12s %12s %12s %12s %12s %12s %12s  %s\n", "rank", "layers", "weights GB",
          "experts GB", "engram GB", "KV GB", "SWA GB", "tails GB", "resident GB", "act B/tok", "EP out B/tok",
          "host/file GB", "fits");
  for (int r = 0; r < c->ranks; r++) {
    const struct rt_rank_cost *k = &c->r[r];
    char ly[32];
    layers_str(k, ly, sizeof ly);
    fprintf(f, "%-4d %-16s %12.3f %12.3f %12.3f %12.6f %12.6f %12.6f %12.3f %12" PRId64 " %12.0f %12.3f  %s\n", r, ly,
            gb(k->weights), gb(k->experts), gb(k->engram_device), gb(k->kv), gb(k->swa), gb(k->tails), gb(k->resident),
            k->act_per_token, k->ep_dispatch_per_token + k->ep_combine_per_token, gb(k->engram_host + k->engram_file),
            k->fits ? "yes" : "NO");
  }
  int bad = 0;
  for (int r = 0; r < c->ranks; r++) bad += !c->r[r].fits;
  if (bad)
    fprintf(f, "\n%d rank%s over %.1f GB: this placement does not fit\n", bad, bad == 1 ? " is" : "s are",
            c->capacity / 1e9);
  else
    fprintf(f, "\nevery rank fits in %.1f GB\n", c->capacity / 1e9);
  for (int r = 0; r < c->ranks; r++)
    if (c->r[r].kv_ship_per_token > 0)
      fprintf(f, "rank %d ships its KV sources' entries to reader stages: %.2f B a token, %" PRId64 " B at N (the "
              "receiving ranks' KV GB count the copies)\n", r, c->r[r].kv_ship_per_token, c->r[r].kv_ship);
  fprintf(f, "(act B/tok: residual streams + carried mHC pre, and buses, sent across the rank's stage boundary; "
          "EP out B/tok: expected expert-parallel dispatch + combine bytes the rank sends per token, uniform "
          "routing)\n");
}

cJSON *place_cost_json(const struct plan *p, const struct rt_place_cost *c) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "plan", p->name);
  cJSON_AddNumberToObject(j, "tokens", (double)c->tokens);
  cJSON_AddNumberToObject(j, "capacity_bytes", c->capacity);
  cJSON_AddNumberToObject(j, "weights_bytes", (double)c->total_weights);
  cJSON *a = cJSON_AddArrayToObject(j, "ranks");
  bool all = true;
  for (int r = 0; r < c->ranks; r++) {
    const struct rt_rank_cost *k = &c->r[r];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON_AddNumberToObject(o, "first_layer", k->first_layer);
    cJSON_AddNumberToObject(o, "last_layer", k->last_layer);
    cJSON_AddStringToObject(o, "device", k->first_layer < 0 ? "none" : k->cuda ? "cuda" : "cpu");
    cJSON_AddNumberToObject(o, "weights_bytes", (double)k->weights);
    cJSON_AddNumberToObject(o, "expert_bytes", (double)k->experts);
    cJSON_AddNumberToObject(o, "engram_device_bytes", (double)k->engram_device);
    cJSON_AddNumberToObject(o, "engram_host_bytes", (double)k->engram_host);
    cJSON_AddNumberToObject(o, "engram_file_bytes", (double)k->engram_file);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)k->kv);
    cJSON_AddNumberToObject(o, "swa_bytes", (double)k->swa);
    cJSON_AddNumberToObject(o, "tail_bytes", (double)k->tails);
    cJSON_AddNumberToObject(o, "resident_bytes", (double)k->resident);
    cJSON_AddNumberToObject(o, "act_bytes_per_token", (double)k->act_per_token);
    cJSON_AddNumberToObject(o, "kv_ship_bytes_per_token", k->kv_ship_per_token);
    cJSON_AddNumberToObject(o, "kv_ship_bytes", (double)k->kv_ship);
    cJSON_AddNumberToObject(o, "ep_dispatch_bytes_per_token", k->ep_dispatch_per_token);
    cJSON_AddNumberToObject(o, "ep_combine_bytes_per_token", k->ep_combine_per_token);
    cJSON_AddBoolToObject(o, "fits", k->fits);
    all &= k->fits;
    cJSON_AddItemToArray(a, o);
  }
  cJSON_AddBoolToObject(j, "fits", all);
  return j;
}

void place_cost_diff(FILE *f, const struct plan *pa, const struct rt_place_cost *a, const struct plan *pb,
                     const struct rt_place_cost *b) {
  fprintf(f, "placement A: %s (%d ranks)\nplacement B: %s (%d ranks)\nN = %" PRId64 " tokens, capacity %.1f GB\n\n",
          pa->name, a->ranks, pb->name, b->ranks, a->tokens, a->capacity / 1e9);
  fprintf(f, "%-4s | %-16s %12s %12s %5s | %-16s %12s %12s %5s\n", "rank", "A layers", "resident GB", "act B/tok",
          "fits", "B layers", "resident GB", "act B/tok", "fits");
  int n = a->ranks > b->ranks ? a->ranks : b->ranks;
  for (int r = 0; r < n; r++) {
    char la[32] = "-", lb[32] = "-";
    const struct rt_rank_cost *x = r < a->ranks ? &a->r[r] : NULL, *y = r < b->ranks ? &b->r[r] : NULL;
    if (x) layers_str(x, la, sizeof la);
    if (y) layers_str(y, lb, sizeof lb);
    fprintf(f, "%-4d | %-16s %12.3f %12.0f %5s | %-16s %12.3f %12.0f %5s\n", r, la, x ? gb(x->resident) : 0,
            x ? (double)x->act_per_token + x->ep_dispatch_per_token + x->ep_combine_per_token : 0,
            x ? (x->fits ? "yes" : "NO") : "-", lb, y ? gb(y->resident) : 0,
            y ? (double)y->act_per_token + y->ep_dispatch_per_token + y->ep_combine_per_token : 0,
            y ? (y->fits ? "yes" : "NO") : "-");
  }
  int64_t ma = 0, mb = 0;
  for (int r = 0; r < a->ranks; r++) ma = a->r[r].resident > ma ? a->r[r].resident : ma;
  for (int r = 0; r < b->ranks; r++) mb = b->r[r].resident > mb ? b->r[r].resident : mb;
  fprintf(f, "\nlargest rank: A %.3f GB, B %.3f GB (B/A %.3f)\n", gb(ma), gb(mb), ma ? (double)mb / (double)ma : 0);
}

/* ---- cedar run -------------------------------------------------------------- */

/* The prefill's bubbles from the recorded times. rank-time: from the
 * first stage's start (a rank started earlier only waits for it: start-up
 * skew, not a bubble) to the last rank's end, on the host's one monotonic
 * clock; every rank is held that long. busy: each rank's own non-transfer
 * nodes. The ideal for C chunks through S equal stages: C / (C + S - 1). */
void run_pipe_figures(const struct plan *p, const struct rt_dist_report *rep, struct run_pipe_fig *f) {
  const struct rt_pipe_stats *s = &rep->pipe_stats;
  const struct plan_placement *pl = &p->serving.place;
  memset(f, 0, sizeof *f);
  f->ranks = s->ranks < RT_PIPE_MAX_RANKS ? s->ranks : RT_PIPE_MAX_RANKS;
  f->stages = pl->n_stages;
  f->chunks = s->chunks;
  if (!s->mpi || f->ranks < 1 || pl->n_stages < 1) return;
  double t1 = 0, t0 = s->rank[pl->stage[0].rank % RT_PIPE_MAX_RANKS].prefill_t0;
  for (int r = 0; r < f->ranks; r++) {
    if (s->rank[r].prefill_t1 > t1) t1 = s->rank[r].prefill_t1;
    if (s->rank[r].decode_wall_s > f->decode_wall_s) f->decode_wall_s = s->rank[r].decode_wall_s;
    f->busy_s += s->rank[r].prefill_busy_s;
  }
  f->rank_time_s = t1 - t0;
  int held = f->ranks; /* P/D stages: the prefill role's ranks hold the prefill (the decode homes wait for it) */
  if (plan_place_pd(p)) {
    held = 0;
    for (int r = 0; r < f->ranks; r++) {
      bool in = false;
      for (int i = 0; i < pl->n_stages; i++) in |= pl->stage[i].rank == r;
      for (int i = 0; i < pl->n_ep_ranks; i++) in |= pl->ep_rank[i] == r;
      held += in;
    }
  }
  if (f->rank_time_s > 0 && held > 0) {
    f->efficiency = f->busy_s / (f->rank_time_s * held);
    f->bubble = 1 - f->efficiency;
  }
  if (f->chunks > 0) {
    f->ideal = (double)f->chunks / (double)(f->chunks + f->stages - 1);
    f->ideal_bubble = 1 - f->ideal;
  }
}

void run_pipe_text(FILE *f, const struct plan *p, const struct rt_dist_report *rep, int64_t decode_steps) {
  const struct rt_pipe_stats *s = &rep->pipe_stats;
  const struct plan_placement *pl = &p->serving.place;
  fprintf(f, "pipeline: %d stages on %d ranks, %s:", pl->n_stages, plan_place_ranks(p),
          s->mpi ? "through StarPU-MPI" : "in one process (transfers are copies)");
  for (int i = 0; i < pl->n_stages; i++)
    fprintf(f, "%s L%d-%d on rank %d", i ? ";" : "", pl->stage[i].lo, pl->stage[i].hi, pl->stage[i].rank);
  for (int i = 0; i < pl->n_stages && pl->stage[0].pd; i++) /* P/D stages: the decode homes too */
    fprintf(f, "%s L%d-%d on rank %d", i ? ";" : "; decode:", pl->stage[i].lo, pl->stage[i].hi, pl->stage[i].decode);
  fputc('\n', f);
  if (!s->mpi) return;
  struct run_pipe_fig x;
  run_pipe_figures(p, rep, &x);
  fprintf(f, "  activations moved: prefill %" PRId64 " B, decode %.0f B a step\n", s->act_bytes_prefill,
          decode_steps > 0 ? (double)s->act_bytes_decode / (double)decode_steps : 0.0);
  if (s->kv_bytes_prefill || s->kv_bytes_decode)
    fprintf(f, "  KV entries shipped to reader stages: prefill %" PRId64 " B, decode %.0f B a step\n",
            s->kv_bytes_prefill, decode_steps > 0 ? (double)s->kv_bytes_decode / (double)decode_steps : 0.0);
  for (int r = 0; r < x.ranks; r++) {
    const struct rt_pipe_rank *k = &s->rank[r];
    fprintf(f, "  rank %d: prefill busy %.3f s of %.3f s (idle %.0f%%); decode busy %.3f s of %.3f s (idle %.0f%%); "
            "sent %" PRId64 " B in %" PRId64 " messages\n", r, k->prefill_busy_s, x.rank_time_s,
            x.rank_time_s > 0 ? 100 * (1 - k->prefill_busy_s / x.rank_time_s) : 0.0, k->decode_busy_s, x.decode_wall_s,
            x.decode_wall_s > 0 ? 100 * (1 - k->decode_busy_s / x.decode_wall_s) : 0.0, k->bytes_sent, k->messages);
  }
  if (x.rank_time_s > 0)
    fprintf(f, "  prefill pipeline efficiency %.2f (busy over rank-time%s), bubble fraction %.2f; ideal for %d chunks "
            "through %d equal stages %.2f (bubble %.2f)\n", x.efficiency,
            plan_place_pd(p) ? ", the prefill role's ranks" : "", x.bubble, x.chunks, x.stages, x.ideal,
            x.ideal_bubble);
}

void run_pipe_json(cJSON *j, const struct plan *p, const struct rt_dist_report *rep) {
  const struct rt_pipe_stats *s = &rep->pipe_stats;
  struct run_pipe_fig x;
  run_pipe_figures(p, rep, &x);
  cJSON *t = cJSON_AddObjectToObject(j, "pipeline");
  cJSON_AddNumberToObject(t, "stages", p->serving.place.n_stages);
  cJSON_AddNumberToObject(t, "ranks", plan_place_ranks(p));
  cJSON_AddStringToObject(t, "via", s->mpi ? "starpu-mpi" : "local");
  cJSON_AddNumberToObject(t, "chunks", s->chunks);
  cJSON_AddNumberToObject(t, "act_bytes_prefill", (double)s->act_bytes_prefill);
  cJSON_AddNumberToObject(t, "act_bytes_decode", (double)s->act_bytes_decode);
  cJSON_AddNumberToObject(t, "kv_bytes_prefill", (double)s->kv_bytes_prefill);
  cJSON_AddNumberToObject(t, "kv_bytes_decode", (double)s->kv_bytes_decode);
  if (s->mpi) {
    cJSON_AddNumberToObject(t, "prefill_rank_time_s", x.rank_time_s);
    cJSON_AddNumberToObject(t, "prefill_efficiency", x.efficiency);
    cJSON_AddNumberToObject(t, "prefill_bubble_fraction", x.bubble);
    cJSON_AddNumberToObject(t, "ideal_efficiency", x.ideal);
    cJSON_AddNumberToObject(t, "ideal_bubble_fraction", x.ideal_bubble);
  }
  int64_t msgs = 0;
  cJSON *a = cJSON_AddArrayToObject(t, "rank");
  for (int r = 0; s->mpi && r < s->ranks && r < RT_PIPE_MAX_RANKS; r++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prefill_busy_s", s->rank[r].prefill_busy_s);
    cJSON_AddNumberToObject(o, "prefill_wall_s", s->rank[r].prefill_wall_s);
    cJSON_AddNumberToObject(o, "prefill_idle_fraction",
                            x.rank_time_s > 0 ? 1 - s->rank[r].prefill_busy_s / x.rank_time_s : 0.0);
    cJSON_AddNumberToObject(o, "decode_busy_s", s->rank[r].decode_busy_s);
    cJSON_AddNumberToObject(o, "decode_wall_s", s->rank[r].decode_wall_s);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)s->rank[r].bytes_sent);
    cJSON_AddNumberToObject(o, "messages", (double)s->rank[r].messages);
    msgs += s->rank[r].messages;
    cJSON_AddItemToArray(a, o);
  }
  cJSON_AddNumberToObject(t, "transfers", (double)msgs);
}

void run_pipe_state_bytes(struct rt_state_bytes *b, const struct rt_dist_report *rep) {
  const struct rt_pipe_stats *s = &rep->pipe_stats;
  if (!s->mpi) return;
  b->kv_entries = b->kv_entry_bytes = b->kv_page_bytes = 0;
  for (int r = 0; r < s->ranks && r < RT_PIPE_MAX_RANKS; r++) {
    b->kv_entries += s->rank[r].kv_entries;
    b->kv_entry_bytes += s->rank[r].kv_entry_bytes;
    b->kv_page_bytes += s->rank[r].kv_page_bytes;
  }
}

int run_pipe_dump(const char *path, const struct rt_model *M, const struct rt_request *r,
                  const struct rt_gen_result *res, char *err, size_t err_len) {
  char *p = malloc(strlen(path) + 32);
  sprintf(p, "%s.rank%d", path, comm_world_rank());
  int rc = run_dump_write(p, M, r, res, err, err_len);
  free(p);
  return rc;
}

/* ---- cedar run --trace under mpirun ------------------------------------------------ */

/* Tracks: rank r's StarPU worker w is tid r * (W + 1) + w; its receives
 * track is r * (W + 1) + W (rank 0's workers keep the tids the trace named
 * before the run). */
static int tr_workers;
static double tr_recv_end[RT_PIPE_MAX_RANKS]; /* where each rank's receives track ends */

static bool has_process(const struct viz_trace *t, int pid) {
  for (int i = 0; i < t->n_proc; i++)
    if (t->proc_pid[i] == pid) return true;
  return t->pid == pid;
}

static void stage_name(const struct plan *p, int r, char *buf, size_t len) {
  int n = snprintf(buf, len, "rank %d:", r);
  const struct plan_placement *pl = &p->serving.place;
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stage[s].rank == r && n > 0 && (size_t)n < len)
      n += snprintf(buf + n, len - (size_t)n, " stage %d (L%d-%d)", s, pl->stage[s].lo, pl->stage[s].hi);
}

struct arrival {
  int rank, node;
  double ts;
};

static int cmp_arrival(const void *a, const void *b) {
  const struct arrival *x = a, *y = b;
  if (x->rank != y->rank) return x->rank - y->rank;
  return x->ts < y->ts ? -1 : x->ts > y->ts;
}

bool run_pipe_trace_graph(struct viz_trace *t, const struct graph *g, int request) {
  const struct rt_pipe_trace *x = rt_pipe_graph_trace(g);
  if (!x) return false;
  const struct plan *p = g->plan;
  int n = x->n_node, R = x->ranks < RT_PIPE_MAX_RANKS ? x->ranks : RT_PIPE_MAX_RANKS;
  char name[96];
  if (t->pid != 0) { /* the first graph: the trace's own process becomes rank 0 */
    for (int i = 0; i < t->n_slice; i++)
      if (t->slice[i].pid == t->pid) t->slice[i].pid = 0;
    t->pid = 0;
    stage_name(p, 0, t->process, sizeof t->process);
    memset(tr_recv_end, 0, sizeof tr_recv_end);
    tr_workers = rt_starpu_workers() > 0 ? rt_starpu_workers() : 1;
  }
  int W = tr_workers;
  for (int r = 0; r < R; r++) {
    if (has_process(t, r) && (r > 0 || t->n_thread > r * (W + 1) + W)) continue;
    if (r > 0) {
      stage_name(p, r, name, sizeof name);
      viz_trace_process(t, r, name);
      for (int w = 0; w < W; w++) {
        snprintf(name, sizeof name, "rank %d CPU %d", r, w);
        viz_trace_thread_of(t, r * (W + 1) + w, r, name);
      }
    }
    snprintf(name, sizeof name, "rank %d StarPU-MPI receives", r);
    viz_trace_thread_of(t, r * (W + 1) + W, r ? r : -1, name);
  }
  struct viz_task_time *vt = cedar_xcalloc((size_t)(n > 0 ? n : 1), sizeof(*vt));
  int *pid_of = cedar_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  int *slice_of = cedar_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  struct arrival *arr = cedar_xmalloc(sizeof(*arr) * (size_t)(n > 0 ? n : 1));
  int n_arr = 0;
  for (int k = 0; k < n; k++) {
    const struct graph_node *nd = &g->node[k];
    int r = nd->place.rank; /* its own rank; a transfer: the sender */
    pid_of[k] = -1;
    if (r >= 0 && r < R && x->rec[((size_t)r * n + k) * 4] >= 0) {
      const double *e = &x->rec[((size_t)r * n + k) * 4];
      int w = (int)e[0] < W ? (int)e[0] : W - 1;
      pid_of[k] = r;
      vt[k] = (struct viz_task_time){r * (W + 1) + w, e[1], e[2]};
    }
    if (nd->op != GRAPH_TRANSFER || pid_of[k] < 0) continue;
    int to = g->data[nd->xfer_dst].home.rank;
    if (to >= 0 && to < R && x->rec[((size_t)to * n + k) * 4 + 3] > 0)
      arr[n_arr++] = (struct arrival){to, k, x->rec[((size_t)to * n + k) * 4 + 3]};
  }
  viz_trace_add_graph_split(t, g, vt, request, pid_of, slice_of);
  /* the receives, in arrival order on each rank's track: one short slice
   * each (an arrival is an instant), a flow from the send to it */
  qsort(arr, (size_t)n_arr, sizeof *arr, cmp_arrival);
  for (int i = 0; i < n_arr; i++) {
    const struct arrival *a = &arr[i];
    const struct graph_node *nd = &g->node[a->node];
    double ts = a->ts, sent = t->slice[slice_of[a->node]].ts;
    if (ts < sent) ts = sent;                 /* one clock: never before its send */
    if (ts < tr_recv_end[a->rank]) ts = tr_recv_end[a->rank];
    double next = i + 1 < n_arr && arr[i + 1].rank == a->rank ? arr[i + 1].ts : ts + 2;
    double dur = next - ts < 2 ? (next - ts) / 2 : 1;
    if (dur < 0) dur = 0;
    struct viz_slice s = {.tid = a->rank * (W + 1) + W, .ts = ts, .dur = dur, .op = "transfer", .mode = "recv",
                          .phase = "transfer", .layer = nd->layer, .chunk = nd->chunk, .request = request,
                          .node = a->node, .rank = a->rank, .pos = nd->a, .n = nd->n, .pid = a->rank};
    snprintf(s.name, sizeof s.name, "recv %s", nd->name);
    tr_recv_end[a->rank] = ts + dur;
    viz_trace_add_flow(t, slice_of[a->node], viz_trace_add_slice(t, &s), "transfer");
  }
  free(vt);
  free(pid_of);
  free(slice_of);
  free(arr);
  return true;
}

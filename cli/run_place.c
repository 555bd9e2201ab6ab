/* run_place.c: the printers of layer and expert placement (run_place.h):
 * `cedar plan cost --per-rank`, `cedar plan diff --per-rank`, and the
 * pipeline section of `cedar run`'s report. */
#include "cli/run_place.h"

#include <cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_dump.h"
#include "runtime/pd.h"

#include "runtime/pipeline.h"
#include "runtime/place_cost.h"
#include "scheduler/plan_place.h"

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

void run_pipe_text(FILE *f, const struct plan *p, int64_t decode_steps) {
  const struct rt_pipe_stats *s = rt_pipe_last_stats();
  const struct plan_placement *pl = &p->serving.place;
  fprintf(f, "pipeline: %d stages on %d ranks, %s:", pl->n_stages, plan_place_ranks(p),
          s->mpi ? "through StarPU-MPI" : "in one process (transfers are copies)");
  for (int i = 0; i < pl->n_stages; i++)
    fprintf(f, "%s L%d-%d on rank %d", i ? ";" : "", pl->stage[i].lo, pl->stage[i].hi, pl->stage[i].rank);
  fputc('\n', f);
  if (!s->mpi) return;
  fprintf(f, "  activations moved: prefill %" PRId64 " B, decode %.0f B a step\n", s->act_bytes_prefill,
          decode_steps > 0 ? (double)s->act_bytes_decode / (double)decode_steps : 0.0);
  /* rank-time: from the first stage's start (a rank started earlier only
   * waits for it: start-up skew, not a bubble) to the last rank's end, on
   * the host's one monotonic clock; every rank is held that long. Decode:
   * the longest rank's summed step time. */
  double busy = 0, wall = 0, dwall = 0, t1 = 0, t0 = s->rank[pl->stage[0].rank % RT_PIPE_MAX_RANKS].prefill_t0;
  for (int r = 0; r < s->ranks && r < RT_PIPE_MAX_RANKS; r++) {
    if (s->rank[r].prefill_t1 > t1) t1 = s->rank[r].prefill_t1;
    if (s->rank[r].decode_wall_s > dwall) dwall = s->rank[r].decode_wall_s;
  }
  wall = t1 - t0;
  for (int r = 0; r < s->ranks && r < RT_PIPE_MAX_RANKS; r++) {
    const struct rt_pipe_rank *k = &s->rank[r];
    fprintf(f, "  rank %d: prefill busy %.3f s of %.3f s (idle %.0f%%); decode busy %.3f s of %.3f s (idle %.0f%%); "
            "sent %" PRId64 " B in %" PRId64 " messages\n", r, k->prefill_busy_s, wall,
            wall > 0 ? 100 * (1 - k->prefill_busy_s / wall) : 0.0, k->decode_busy_s, dwall,
            dwall > 0 ? 100 * (1 - k->decode_busy_s / dwall) : 0.0, k->bytes_sent, k->messages);
    busy += k->prefill_busy_s;
  }
  int S = pl->n_stages, C = s->chunks;
  if (wall > 0 && s->ranks > 0)
    fprintf(f, "  prefill pipeline efficiency %.2f (busy over rank-time), bubble fraction %.2f; ideal for %d chunks "
            "through %d equal stages %.2f\n", busy / (wall * s->ranks), 1 - busy / (wall * s->ranks), C, S,
            (double)C / (double)(C + S - 1));
}

void run_pipe_json(cJSON *j, const struct plan *p) {
  const struct rt_pipe_stats *s = rt_pipe_last_stats();
  cJSON *t = cJSON_AddObjectToObject(j, "pipeline");
  cJSON_AddNumberToObject(t, "stages", p->serving.place.n_stages);
  cJSON_AddNumberToObject(t, "ranks", plan_place_ranks(p));
  cJSON_AddStringToObject(t, "via", s->mpi ? "starpu-mpi" : "local");
  cJSON_AddNumberToObject(t, "act_bytes_prefill", (double)s->act_bytes_prefill);
  cJSON_AddNumberToObject(t, "act_bytes_decode", (double)s->act_bytes_decode);
  cJSON *a = cJSON_AddArrayToObject(t, "rank");
  for (int r = 0; s->mpi && r < s->ranks && r < RT_PIPE_MAX_RANKS; r++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prefill_busy_s", s->rank[r].prefill_busy_s);
    cJSON_AddNumberToObject(o, "prefill_wall_s", s->rank[r].prefill_wall_s);
    cJSON_AddNumberToObject(o, "decode_busy_s", s->rank[r].decode_busy_s);
    cJSON_AddNumberToObject(o, "decode_wall_s", s->rank[r].decode_wall_s);
    cJSON_AddNumberToObject(o, "bytes_sent", (double)s->rank[r].bytes_sent);
    cJSON_AddItemToArray(a, o);
  }
}

void run_pipe_state_bytes(struct rt_state_bytes *b) {
  const struct rt_pipe_stats *s = rt_pipe_last_stats();
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
  sprintf(p, "%s.rank%d", path, rt_pd_world_rank());
  int rc = rt_dump_write(p, M, r, res, err, err_len);
  free(p);
  return rc;
}

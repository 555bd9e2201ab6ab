/* run_ep.c: the expert-parallel section of `cedar run`'s report
 * (runtime/dist/expert_par.h): the shards, each rank's load (rows and
 * expert-rows its experts computed, their seconds) and the dispatch and
 * combine bytes per token against what `cedar plan cost --per-rank`
 * expects for the same placement under uniform routing. */
#include <cJSON.h>
#include <inttypes.h>
#include <math.h>

#include "cli/run_place.h"
#include "runtime/dist/expert_par.h"
#include "runtime/dist/place_cost.h"
#include "scheduler/plan_place.h"

/* Measured bytes per token through every expert-parallel layer (a row
 * through one layer's MoE node is one pass), and the plan's expectation. */
struct ep_fig {
  int64_t dispatch, meta, combine, rows, pairs;
  double dispatch_tok, combine_tok, want_dispatch_tok, want_combine_tok;
};

static void figures(const struct plan *p, const struct rt_dist_report *rep, struct ep_fig *f) {
  const struct rt_ep_stats *s = &rep->ep_stats;
  *f = (struct ep_fig){0};
  for (int r = 0; r < RT_EP_MAX_RANKS; r++) {
    f->dispatch += s->rank[r].dispatch_bytes, f->meta += s->rank[r].dispatch_meta_bytes;
    f->combine += s->rank[r].combine_bytes, f->rows += s->rank[r].rows, f->pairs += s->rank[r].expert_rows;
  }
  double per_pass = s->passes > 0 ? (double)s->layers / (double)s->passes : 0;
  f->dispatch_tok = (double)f->dispatch * per_pass, f->combine_tok = (double)f->combine * per_pass;
  /* A token takes one role's layers (its prompt P's, a generated one D's):
   * the expectation is a role's, and under P/D the roles must agree for the
   * run's average to be held to it (else NaN: "n/a"). */
  static struct rt_place_cost c; /* large; one report at a time */
  double want[2][2] = {{0, 0}, {0, 0}};
  for (int role = 0; role < 2; role++)
    if (rt_place_cost_role(p, role, 1, 1e30, &c) == 0)
      for (int r = 0; r < c.ranks; r++)
        want[role][0] += c.r[r].ep_dispatch_per_token, want[role][1] += c.r[r].ep_combine_per_token;
  bool agree = fabs(want[0][0] - want[1][0]) < 1e-6 * (1 + want[0][0]) &&
               fabs(want[0][1] - want[1][1]) < 1e-6 * (1 + want[0][1]);
  f->want_dispatch_tok = agree ? want[0][0] : NAN;
  f->want_combine_tok = agree ? want[0][1] : NAN;
}

void run_ep_text(FILE *out, const struct plan *p, const struct rt_dist_report *rep) {
  const struct rt_ep_stats *s = &rep->ep_stats;
  const struct plan_placement *pl = &p->serving.place;
  int E = p->model.n_routed, per = E / pl->n_ep_ranks;
  fprintf(out, "experts: %d routed experts of %d layers in %d shards, %s:", E, s->layers, pl->n_ep_ranks,
          s->mpi ? "through StarPU-MPI" : "in one process (dispatch and combine are copies)");
  for (int i = 0; i < pl->n_ep_ranks; i++)
    fprintf(out, "%s experts %d-%d on rank %d", i ? ";" : "", i * per, (i + 1) * per - 1, pl->ep_rank[i]);
  if (pl->ep_pd) { /* the decode role's shards (the list above is the prefill role's) */
    int per_d = E / (pl->n_ep_ranks_d ? pl->n_ep_ranks_d : 1);
    fprintf(out, " (prefill); decode:");
    for (int i = 0; i < pl->n_ep_ranks_d; i++)
      fprintf(out, "%s experts %d-%d on rank %d", i ? ";" : "", i * per_d, (i + 1) * per_d - 1, pl->ep_rank_d[i]);
  }
  fputc('\n', out);
  for (int r = 0; r < plan_place_ranks(p) && r < RT_EP_MAX_RANKS; r++) {
    const struct rt_ep_rank *k = &s->rank[r];
    fprintf(out, "  rank %d: %" PRId64 " rows, %" PRId64 " expert-rows, experts %.3f s; sent %" PRId64
            " B dispatch, %" PRId64 " B combine\n", r, k->rows, k->expert_rows, k->expert_s,
            k->dispatch_bytes + k->dispatch_meta_bytes, k->combine_bytes);
  }
  static struct rt_place_cost c; /* large; one report at a time */
  if (s->mpi && rt_place_cost(p, 1, 1e30, &c) == 0)
    for (int r = 0; r < c.ranks && r < RT_EP_MAX_RANKS; r++)
      fprintf(out, "  rank %d holds %" PRId64 " B of routed experts (stored formats); plan cost --per-rank: %" PRId64
              " B%s\n", r, s->rank[r].held_expert_bytes, c.r[r].experts,
              s->rank[r].held_expert_bytes == c.r[r].experts ? "" : " (differs)");
  struct ep_fig f;
  figures(p, rep, &f);
  fprintf(out, "  dispatch %.0f B/token (token rows; + %" PRId64 " B of headers and routing in all), combine %.0f "
          "B/token, over %" PRId64 " row-passes; ", f.dispatch_tok, f.meta, f.combine_tok, s->passes);
  if (isnan(f.want_dispatch_tok))
    fprintf(out, "no one expectation: the prefill and decode roles' shards differ in count or layers\n");
  else
    fprintf(out, "plan cost --per-rank expects %.0f and %.0f B/token (uniform routing)\n", f.want_dispatch_tok,
            f.want_combine_tok);
}

void run_ep_json(cJSON *j, const struct plan *p, const struct rt_dist_report *rep) {
  const struct rt_ep_stats *s = &rep->ep_stats;
  const struct plan_placement *pl = &p->serving.place;
  cJSON *t = cJSON_AddObjectToObject(j, "experts");
  cJSON_AddStringToObject(t, "via", s->mpi ? "starpu-mpi" : "local");
  cJSON_AddNumberToObject(t, "shards", pl->n_ep_ranks);
  cJSON_AddNumberToObject(t, "layers", s->layers);
  cJSON_AddNumberToObject(t, "experts_per_shard", p->model.n_routed / pl->n_ep_ranks);
  cJSON_AddNumberToObject(t, "passes", (double)s->passes);
  struct ep_fig f;
  figures(p, rep, &f);
  cJSON_AddNumberToObject(t, "dispatch_bytes", (double)f.dispatch);
  cJSON_AddNumberToObject(t, "dispatch_meta_bytes", (double)f.meta);
  cJSON_AddNumberToObject(t, "combine_bytes", (double)f.combine);
  cJSON_AddNumberToObject(t, "dispatch_bytes_per_token", f.dispatch_tok);
  cJSON_AddNumberToObject(t, "combine_bytes_per_token", f.combine_tok);
  cJSON_AddNumberToObject(t, "expected_dispatch_bytes_per_token", f.want_dispatch_tok);
  cJSON_AddNumberToObject(t, "expected_combine_bytes_per_token", f.want_combine_tok);
  static struct rt_place_cost c; /* large; one report at a time */
  if (rt_place_cost(p, 1, 1e30, &c)) c.ranks = 0;
  cJSON *a = cJSON_AddArrayToObject(t, "rank");
  for (int r = 0; r < plan_place_ranks(p) && r < RT_EP_MAX_RANKS; r++) {
    const struct rt_ep_rank *k = &s->rank[r];
    int first = -1; /* its shard's first expert; -1: it holds none */
    for (int i = 0; i < pl->n_ep_ranks; i++)
      if (pl->ep_rank[i] == r) first = i * (p->model.n_routed / pl->n_ep_ranks);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON_AddNumberToObject(o, "first_expert", first);
    cJSON_AddNumberToObject(o, "rows", (double)k->rows);
    cJSON_AddNumberToObject(o, "expert_rows", (double)k->expert_rows);
    cJSON_AddNumberToObject(o, "expert_s", k->expert_s);
    cJSON_AddNumberToObject(o, "dispatch_bytes", (double)k->dispatch_bytes);
    cJSON_AddNumberToObject(o, "dispatch_meta_bytes", (double)k->dispatch_meta_bytes);
    cJSON_AddNumberToObject(o, "combine_bytes", (double)k->combine_bytes);
    cJSON_AddNumberToObject(o, "messages", (double)k->messages);
    if (s->mpi) cJSON_AddNumberToObject(o, "held_expert_bytes", (double)k->held_expert_bytes);
    if (s->mpi && c.ranks > r) cJSON_AddNumberToObject(o, "accounted_expert_bytes", (double)c.r[r].experts);
    cJSON_AddItemToArray(a, o);
  }
}

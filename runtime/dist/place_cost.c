/* place_cost.c: per-rank bytes of a layer and expert placement
 * (place_cost.h). */
#include "runtime/dist/place_cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/load/checkpoint.h"
#include "runtime/dist/pd.h"
#include "runtime/load/weights.h"
#include "scheduler/graph.h"
#include "scheduler/plan_cost.h"
#include "scheduler/plan_place.h"

/* A tensor's bytes in the released checkpoint's stored format. */
static int64_t stored_bytes(const struct weights_spec *s) {
  int layer;
  const struct ckpt_map_row *row = ckpt_map_find(s->name, &layer);
  int64_t elems = 1;
  for (int i = 0; i < s->ndim; i++) elems *= s->shape[i];
  if (!row) return (int64_t)s->nbytes;
  switch (row->conv) {
  case CKPT_FP8: { /* E4M3 values + one E8M0 per 32x32 tile of the 2-D view */
    int64_t cols = s->shape[s->ndim - 1], rows = elems / (cols ? cols : 1);
    return elems + ((rows + 31) / 32) * ((cols + 31) / 32);
  }
  case CKPT_EXPERTS: return elems / 2 + elems / 32; /* E2M1 two a byte + E8M0 per 32 */
  case CKPT_ENGRAM: return (int64_t)s->nbytes;     /* cedar's rows are the stored E4M3 + E8M0 bytes */
  case CKPT_ABSENT: return 0;
  case CKPT_BIAS2: return elems * 4;
  case CKPT_FLOAT: return elems * (row->dtype == ST_BF16 ? 2 : 4);
  }
  return (int64_t)s->nbytes;
}

int64_t rt_place_stored_bytes(const struct weights_spec *s) { return stored_bytes(s); }

/* Expert e's share of an expert stack of b stored bytes. */
static int64_t expert_part(int64_t b, int E, int e) { return b / E + (e < b % E); }

int64_t rt_place_held_experts(const struct plan *p, const struct weights *w) {
  int64_t sum = 0;
  int E = p->model.n_routed;
  for (size_t i = 0; i < w->list.n; i++) {
    const struct weights_spec *s = &w->list.t[i];
    const char *leaf = s->layer >= 0 ? strstr(s->name, ".ffn.experts.") : NULL;
    if (!leaf || E <= 0) continue;
    int64_t lo = w->part ? w->part[i].lo : 0, hi = w->part ? w->part[i].hi : E, b = stored_bytes(s);
    for (int64_t e = lo; e < hi; e++) sum += expert_part(b, E, (int)e);
  }
  return sum;
}

static int stage_rank(const struct plan *p, int s) {
  return plan_has_stages(p) ? p->serving.place.stage[s].rank : p->serving.prefill_rank;
}

static int layer_rank(const struct plan *p, int l) { return stage_rank(p, plan_stage_of(p, l)); }

/* C(a, k) / C(b, k) for a <= b: the chance k draws without replacement from
 * b items all miss the b - a others. */
static double choose_ratio(int a, int b, int k) {
  if (k > a) return 0;
  double r = 1;
  for (int i = 0; i < k; i++) r *= (double)(a - i) / (double)(b - i);
  return r;
}

/* The ranks holding experts [lo, hi) of a layer in view v: the rank of
 * expert e (plan_expert_rank; contiguous blocks), as the range of experts
 * rank r holds there ([0, 0) for none). */
static void expert_range(const struct plan *v, int l, int r, int E, int *lo, int *hi) {
  *lo = *hi = 0;
  for (int e = 0; e < E; e++)
    if (plan_expert_rank(v, l, e) == r) {
      if (*hi <= *lo) *lo = e;
      *hi = e + 1;
    }
}

/* The rank view v puts a tensor on that is not a routed-expert stack. */
static int tensor_rank(const struct plan *v, const struct weights_spec *s, const char *leaf) {
  if (s->layer < 0) return layer_rank(v, strcmp(s->name, "embed") ? v->n_layers - 1 : 0);
  if (!strcmp(leaf, "engram.table") && v->serving.place.engram_set) return plan_engram_rank(v);
  return layer_rank(v, s->layer);
}

/* Every tensor's stored bytes on the ranks the views put it on: a rank both
 * roles put a tensor on holds it once, and a rank's routed experts of a
 * layer are the range covering both roles' blocks there (as
 * runtime/dist/expert_par.c loads them). */
static int account_weights(const struct plan *p, const struct plan *const *view, int n_view,
                           struct rt_place_cost *out) {
  struct weights_list wl;
  char err[200];
  if (weights_list_init(&wl, p, err, sizeof err)) {
    snprintf(out->error, sizeof out->error, "%s", err);
    return CEDAR_EINVAL;
  }
  const int E = p->model.n_routed;
  for (size_t i = 0; i < wl.n; i++) {
    const struct weights_spec *s = &wl.t[i];
    int64_t b = stored_bytes(s);
    out->total_weights += b;
    const char *leaf = s->layer < 0 ? s->name : strchr(strchr(s->name, '.') + 1, '.') + 1; /* after "layers.L." */
    if (s->layer >= 0 && !strncmp(leaf, "ffn.experts.", 12)) {
      for (int r = 0; r < out->ranks; r++) {
        int lo = 0, hi = 0;
        for (int k = 0; k < n_view; k++) {
          int a, z;
          expert_range(view[k], s->layer, r, E, &a, &z);
          if (z > a) lo = hi > lo ? (a < lo ? a : lo) : a, hi = z > hi ? z : hi;
        }
        for (int e = lo; e < hi; e++) {
          int64_t part = expert_part(b, E, e);
          out->r[r].weights += part;
          out->r[r].experts += part;
        }
      }
      continue;
    }
    int held[2] = {-1, -1};
    for (int k = 0; k < n_view; k++) {
      int r = tensor_rank(view[k], s, leaf);
      if (k && r == held[0]) continue;
      held[k] = r;
      struct rt_rank_cost *rk = &out->r[r];
      if (s->layer >= 0 && !strcmp(leaf, "engram.table")) {
        if (p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP) /* = engram: {memory: file} (plan_check.c) */
          rk->engram_file += b;
        else if (p->serving.place.engram_set)
          rk->engram_host += b;
        else
          rk->weights += b, rk->engram_device += b;
      } else {
        rk->weights += b;
      }
    }
  }
  weights_list_free(&wl);
  return 0;
}

/* One role's request state, activation and expert traffic (view v: the
 * plan as that role places it). */
static void account_role(const struct plan *v, const struct plan_cost *c, struct rt_place_cost *out) {
  const struct plan_placement *pl = &v->serving.place;
  const struct plan_model *m = &v->model;
  for (int i = 0; i < c->n_sources; i++) {
    int home = layer_rank(v, c->src[i].layer);
    struct rt_rank_cost *rk = &out->r[home];
    rk->kv += c->src[i].bytes;
    rk->tails += c->src[i].tail_bytes;
    /* readers in another stage: a copy of the pool on each such rank, every
     * entry shipped there once (scheduler/graph_place.c) */
    bool to[RT_PLACE_MAX_RANKS] = {false};
    for (int l = 0; l < v->n_layers; l++) {
      int r = layer_rank(v, l), key[2];
      graph__key_sources(v, l, key); /* key_slot: vendor: a stage scoring the source's keys holds a copy too */
      bool reads = (v->layer[l].kv_src == c->src[i].layer && plan_is_csa(&v->layer[l])) || key[0] == c->src[i].layer ||
                   key[1] == c->src[i].layer;
      if (!reads || r == home || to[r]) continue;
      to[r] = true;
      out->r[r].kv += c->src[i].bytes;
      rk->kv_ship_per_token += c->src[i].bytes_per_token;
      rk->kv_ship += c->src[i].bytes;
    }
  }
  for (int l = 0; l < v->n_layers; l++)
    out->r[layer_rank(v, l)].swa += c->swa_payload_per_layer + c->swa_scale_bytes / (v->n_layers ? v->n_layers : 1);
  /* activations across each stage boundary, per token */
  int64_t stream = ((int64_t)m->hc_streams * m->hidden + m->hc_streams) * 4;
  for (int s = 0; plan_has_stages(v) && s + 1 < pl->n_stages; s++) {
    int64_t b = stream;
    int cut = pl->stage[s + 1].lo;
    bool topk[PLAN_MAX_LAYERS] = {false}, pool[PLAN_MAX_LAYERS] = {false};
    for (int l = cut; l < v->n_layers; l++) { /* buses built before the cut and read after it, once each */
      const struct plan_layer *L = &v->layer[l];
      if (L->mode == PLAN_REUSE && L->topk_src >= 0 && L->topk_src < cut && !topk[L->topk_src]) {
        topk[L->topk_src] = true;
        b += (int64_t)m->topk * 4;
      }
      if (L->mode == PLAN_REINDEX && L->cand == PLAN_CAND_READ && L->pool_src >= 0 && L->pool_src < cut &&
          !pool[L->pool_src]) {
        pool[L->pool_src] = true;
        b += (int64_t)m->cand_top_blocks * 4;
      }
    }
    out->r[stage_rank(v, s)].act_per_token += b;
  }
  /* expert parallel: expected dispatch and combine per token */
  int Re = pl->n_ep_ranks;
  for (int l = 0; Re && l < v->n_layers; l++) {
    if (!pl->ep_layer[l]) continue;
    int home = layer_rank(v, l), per = m->n_routed / Re, k = m->n_active;
    double miss = choose_ratio(m->n_routed - per, m->n_routed, k); /* a rank holds none of the k */
    for (int i = 0; i < Re; i++) {
      int er = pl->ep_rank[i];
      if (er == home) continue;
      out->r[home].ep_dispatch_per_token += (1 - miss) * m->hidden * 4.0;
      out->r[er].ep_combine_per_token += (double)k * per / m->n_routed * m->hidden * 4.0;
    }
  }
}

int rt_place_cost(const struct plan *p, int64_t tokens, double capacity, struct rt_place_cost *out) {
  return rt_place_cost_role(p, -1, tokens, capacity, out);
}

int rt_place_cost_role(const struct plan *p, int role, int64_t tokens, double capacity, struct rt_place_cost *out) {
  memset(out, 0, sizeof *out);
  out->tokens = tokens;
  out->capacity = capacity;
  /* Under P/D each role places the model on its own homes (plan_role_view;
   * without stages the decode role's is serving.placement's decode rank):
   * a rank holds what either role puts on it. */
  const bool pd = rt_pd_split(p);
  struct plan *views = cedar_xmalloc(sizeof(*views) * 2);
  plan_role_view(p, false, &views[0]);
  plan_role_view(p, true, &views[1]);
  if (!plan_has_stages(&views[1])) {
    views[1].serving.prefill_rank = p->serving.decode_rank;
    views[1].serving.prefill_device = p->serving.decode_device;
  }
  const struct plan *view[2] = {&views[0], &views[1]};
  int n_view = pd ? 2 : 1;
  if (pd && role >= 0) /* one role's homes only */
    view[0] = &views[role ? 1 : 0], n_view = 1;
  int R = plan_place_ranks(p);
  if (pd) {
    if (p->serving.prefill_rank + 1 > R) R = p->serving.prefill_rank + 1;
    if (p->serving.decode_rank + 1 > R) R = p->serving.decode_rank + 1;
  }
  int rc = 0;
  if (R > RT_PLACE_MAX_RANKS) {
    snprintf(out->error, sizeof out->error, "the placement names %d ranks; accounting takes at most %d", R,
             RT_PLACE_MAX_RANKS);
    rc = CEDAR_EINVAL;
  }
  out->ranks = R;
  for (int r = 0; r < R && !rc; r++) out->r[r].first_layer = out->r[r].last_layer = -1;
  for (int k = 0; k < n_view && !rc; k++) {
    const struct plan *v = view[k];
    const struct plan_placement *pl = &v->serving.place;
    for (int s = 0; s < (plan_has_stages(v) ? pl->n_stages : 1); s++) {
      struct rt_rank_cost *rk = &out->r[stage_rank(v, s)];
      int lo = plan_has_stages(v) ? pl->stage[s].lo : 0, hi = plan_has_stages(v) ? pl->stage[s].hi : v->n_layers - 1;
      if (rk->first_layer < 0 || lo < rk->first_layer) rk->first_layer = lo;
      if (hi > rk->last_layer) rk->last_layer = hi;
      rk->cuda |= plan_has_stages(v) ? pl->stage[s].device == PLAN_DEV_CUDA : v->serving.prefill_device == PLAN_DEV_CUDA;
    }
  }
  if (!rc) rc = account_weights(p, view, n_view, out);
  /* one request's state at N, on each role's homes */
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = tokens;
  struct plan_cost *c = cedar_xcalloc(1, sizeof *c);
  if (!rc && plan_cost_compute(p, &q, c)) {
    snprintf(out->error, sizeof out->error, "%s", c->error);
    rc = CEDAR_EINVAL;
  }
  for (int k = 0; k < n_view && !rc; k++) account_role(view[k], c, out);
  free(c);
  free(views);
  for (int r = 0; r < R && !rc; r++) {
    struct rt_rank_cost *rk = &out->r[r];
    rk->resident = rk->weights + rk->kv + rk->swa + rk->tails;
    rk->fits = (double)rk->resident <= capacity;
  }
  return rc;
}

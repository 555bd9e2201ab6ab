/* plan_place.c: serving.placement.stages / experts / engram read from the
 * merged tree and checked against the layer table (plan_place.h). */
#include "scheduler/plan_place.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler/plan_internal.h"

bool plan__read_int(struct plan_ctx *ctx, const struct pnode *v, const char *key, double lo, double hi,
                    long long *out);
void plan__unknown_key(struct plan_ctx *ctx, const struct pnode *k, const char *where, const char *const *known,
                       size_t n_known);

/* ---- queries -------------------------------------------------------------- */

int plan_stage_of(const struct plan *p, int l) {
  const struct plan_placement *pl = &p->serving.place;
  for (int s = 0; s < pl->n_stages; s++)
    if (l >= pl->stage[s].lo && l <= pl->stage[s].hi) return s;
  return 0;
}

int plan_place_ranks(const struct plan *p) {
  const struct plan_placement *pl = &p->serving.place;
  int n = 1;
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stage[s].rank + 1 > n) n = pl->stage[s].rank + 1;
  for (int i = 0; i < pl->n_ep_ranks; i++)
    if (pl->ep_rank[i] + 1 > n) n = pl->ep_rank[i] + 1;
  if (pl->engram_set && pl->engram_rank + 1 > n) n = pl->engram_rank + 1;
  return n;
}

int plan_expert_rank(const struct plan *p, int l, int e) {
  const struct plan_placement *pl = &p->serving.place;
  if (pl->n_ep_ranks > 0 && pl->ep_layer[l]) {
    int per = (p->model.n_routed + pl->n_ep_ranks - 1) / pl->n_ep_ranks;
    return pl->ep_rank[e / per];
  }
  return pl->n_stages ? pl->stage[plan_stage_of(p, l)].rank : p->serving.prefill_rank;
}

int plan_engram_rank(const struct plan *p) {
  const struct plan_placement *pl = &p->serving.place;
  if (pl->engram_set) return pl->engram_rank;
  return pl->n_stages ? pl->stage[0].rank : p->serving.prefill_rank;
}

/* ---- reading ---------------------------------------------------------------- */

/* "7" or "3-7" into [lo, hi] within the plan's layers. */
static bool read_range(struct plan_ctx *ctx, const struct pnode *v, const char *key, int n_layers, int *lo,
                       int *hi) {
  const char *hint = "write a layer number or a range like 0-19";
  if (v->kind != PN_SCALAR) {
    plan__error(ctx, v->mark, hint, "`%s` must name layers, not %s", key, plan__kind_name(v));
    return false;
  }
  long long a, b;
  const char *dash = strchr(v->str, '-');
  struct pnode l = *v, r = *v;
  char left[32];
  l.plain = r.plain = true;
  if (dash && dash != v->str) {
    size_t n = (size_t)(dash - v->str);
    if (n >= sizeof left) n = sizeof left - 1;
    memcpy(left, v->str, n);
    left[n] = 0;
    l.str = left;
    r.str = (char *)dash + 1;
    if (!plan__read_int(ctx, &l, key, 0, n_layers - 1, &a) || !plan__read_int(ctx, &r, key, 0, n_layers - 1, &b))
      return false;
  } else {
    if (!plan__read_int(ctx, &l, key, 0, n_layers - 1, &a)) return false;
    b = a;
  }
  if (b < a) {
    plan__error(ctx, v->mark, "write the range low-high", "`%s` range %s runs backwards", key, v->str);
    return false;
  }
  *lo = (int)a, *hi = (int)b;
  return true;
}

static bool read_device(struct plan_ctx *ctx, const struct pnode *v, int *dev) {
  if (v->kind == PN_SCALAR && !strcmp(v->str, "cpu")) return *dev = PLAN_DEV_CPU, true;
  if (v->kind == PN_SCALAR && !strcmp(v->str, "cuda")) return *dev = PLAN_DEV_CUDA, true;
  plan__error(ctx, v->mark, "write cpu or cuda (and device_id: N for cuda:N)", "`device` must be cpu or cuda, not %s",
              v->kind == PN_SCALAR ? v->str : plan__kind_name(v));
  return false;
}

static void read_stages(struct plan_ctx *ctx, const struct pnode *v, struct plan *p) {
  static const char *const keys[] = {"layers", "rank", "device", "device_id"};
  struct plan_placement *pl = &p->serving.place;
  pl->mark_stages = v->mark;
  if (v->kind != PN_SEQ || v->n == 0) {
    plan__error(ctx, v->mark, "write stages: [{layers: 0-19, rank: 0}, {layers: 20-39, rank: 1}]",
                "serving.placement.stages must be a non-empty list of layer groups");
    return;
  }
  if (v->n > PLAN_MAX_STAGES) {
    plan__error(ctx, v->mark, "merge stages", "serving.placement.stages has %zu stages; at most %d", v->n,
                PLAN_MAX_STAGES);
    return;
  }
  for (size_t i = 0; i < v->n; i++) {
    const struct pnode *e = v->kids[i];
    struct plan_stage *s = &pl->stage[pl->n_stages];
    memset(s, 0, sizeof *s);
    s->mark = e->mark;
    s->lo = -1;
    if (e->kind != PN_MAP) {
      plan__error(ctx, e->mark, "write {layers: 0-19, rank: 0}", "a stage must be a map, not %s", plan__kind_name(e));
      continue;
    }
    bool ok = true, has_rank = false;
    for (size_t k = 0; k + 1 < e->n; k += 2) {
      const struct pnode *key = e->kids[k], *val = e->kids[k + 1];
      long long x;
      if (!strcmp(key->str, "layers"))
        ok &= read_range(ctx, val, "layers", p->n_layers, &s->lo, &s->hi);
      else if (!strcmp(key->str, "rank")) {
        ok &= has_rank = plan__read_int(ctx, val, "rank", 0, 1 << 20, &x);
        s->rank = (int)x;
        s->mark_rank = val->mark;
      } else if (!strcmp(key->str, "device")) {
        ok &= read_device(ctx, val, &s->device);
        s->mark_device = val->mark;
      } else if (!strcmp(key->str, "device_id")) {
        ok &= plan__read_int(ctx, val, "device_id", 0, 1024, &x);
        s->device_id = (int)x;
      } else {
        plan__unknown_key(ctx, key, "serving.placement.stages[]", keys, sizeof keys / sizeof *keys);
        ok = false;
      }
    }
    if (ok && (s->lo < 0 || !has_rank)) {
      plan__error(ctx, e->mark, "write {layers: 0-19, rank: 0}", "stage %zu needs both `layers` and `rank`", i);
      ok = false;
    }
    if (ok) pl->n_stages++;
  }
}

static void read_experts(struct plan_ctx *ctx, const struct pnode *v, struct plan *p) {
  static const char *const keys[] = {"ranks", "layers"};
  struct plan_placement *pl = &p->serving.place;
  pl->mark_experts = v->mark;
  if (v->kind != PN_MAP) {
    plan__error(ctx, v->mark, "write experts: {ranks: [0, 1]}", "serving.placement.experts must be a map");
    return;
  }
  const struct pnode *ranks = NULL, *layers = NULL;
  for (size_t k = 0; k + 1 < v->n; k += 2) {
    if (!strcmp(v->kids[k]->str, "ranks"))
      ranks = v->kids[k + 1];
    else if (!strcmp(v->kids[k]->str, "layers"))
      layers = v->kids[k + 1];
    else
      plan__unknown_key(ctx, v->kids[k], "serving.placement.experts", keys, 2);
  }
  if (!ranks || ranks->kind != PN_SEQ || ranks->n == 0 || ranks->n > PLAN_MAX_EP_RANKS) {
    plan__error(ctx, ranks ? ranks->mark : v->mark, "write ranks: [0, 1] (up to 64 ranks)",
                "serving.placement.experts needs `ranks`, a list of ranks");
    return;
  }
  for (size_t i = 0; i < ranks->n; i++) {
    long long x;
    if (!plan__read_int(ctx, ranks->kids[i], "ranks", 0, 1 << 20, &x)) return;
    for (int j = 0; j < pl->n_ep_ranks; j++)
      if (pl->ep_rank[j] == x) {
        plan__error(ctx, ranks->kids[i]->mark, "name each rank once", "serving.placement.experts.ranks names rank %lld twice", x);
        return;
      }
    pl->mark_ep_rank[pl->n_ep_ranks] = ranks->kids[i]->mark;
    pl->ep_rank[pl->n_ep_ranks++] = (int)x;
  }
  int lo = 0, hi = p->n_layers - 1;
  if (layers) {
    size_t items = layers->kind == PN_SEQ ? layers->n : 1;
    for (size_t i = 0; i < items; i++)
      if (read_range(ctx, layers->kind == PN_SEQ ? layers->kids[i] : layers, "layers", p->n_layers, &lo, &hi))
        for (int l = lo; l <= hi; l++) pl->ep_layer[l] = true;
  } else {
    for (int l = 0; l < p->n_layers; l++) pl->ep_layer[l] = true;
  }
}

static void read_engram(struct plan_ctx *ctx, const struct pnode *v, struct plan *p) {
  static const char *const keys[] = {"rank", "memory"};
  struct plan_placement *pl = &p->serving.place;
  pl->mark_engram = v->mark;
  if (v->kind != PN_MAP) {
    plan__error(ctx, v->mark, "write engram: {rank: 0, memory: host}", "serving.placement.engram must be a map");
    return;
  }
  pl->engram_set = true;
  for (size_t k = 0; k + 1 < v->n; k += 2) {
    const struct pnode *key = v->kids[k], *val = v->kids[k + 1];
    long long x;
    if (!strcmp(key->str, "rank")) {
      if (plan__read_int(ctx, val, "rank", 0, 1 << 20, &x)) pl->engram_rank = (int)x;
    } else if (!strcmp(key->str, "memory")) {
      if (val->kind == PN_SCALAR && !strcmp(val->str, "host"))
        pl->engram_memory = PLAN_ENGRAM_HOST;
      else if (val->kind == PN_SCALAR && !strcmp(val->str, "file"))
        pl->engram_memory = PLAN_ENGRAM_FILE;
      else
        plan__error(ctx, val->mark, "write host (tables in the rank's memory) or file (read from the weights file)",
                    "serving.placement.engram.memory must be host or file");
    } else {
      plan__unknown_key(ctx, key, "serving.placement.engram", keys, 2);
    }
  }
}

void plan__read_placement(struct plan_ctx *ctx, const struct pnode *root, struct plan *p) {
  const struct pnode *s = plan__map_get(root, "serving");
  const struct pnode *pl = s && s->kind == PN_MAP ? plan__map_get(s, "placement") : NULL;
  if (!pl || pl->kind != PN_MAP) return;
  const struct pnode *v;
  if ((v = plan__map_get(pl, "stages"))) read_stages(ctx, v, p);
  if ((v = plan__map_get(pl, "experts"))) read_experts(ctx, v, p);
  if ((v = plan__map_get(pl, "engram"))) read_engram(ctx, v, p);
}

/* ---- checking ---------------------------------------------------------------- */

void plan__check_placement(struct plan_ctx *ctx, struct plan *p) {
  struct plan_placement *pl = &p->serving.place;
  if (pl->n_stages) {
    int next = 0;
    for (int s = 0; s < pl->n_stages; s++) {
      const struct plan_stage *st = &pl->stage[s];
      if (st->lo != next) {
        char hint[96];
        snprintf(hint, sizeof hint, "start this stage at layer %d: stages run in layer order and cover every layer "
                 "once", next);
        plan__error(ctx, st->mark, hint, "stage %d starts at layer %d, but %s", s, st->lo,
                    st->lo < next ? "an earlier stage already holds it" : "the layers before it are in no stage");
        return;
      }
      next = st->hi + 1;
    }
    if (next != p->n_layers) {
      char hint[96];
      snprintf(hint, sizeof hint, "end the last stage at layer %d", p->n_layers - 1);
      plan__error(ctx, pl->stage[pl->n_stages - 1].mark, hint, "the stages end at layer %d, but the plan has %d "
                  "layers", next - 1, p->n_layers);
      return;
    }
    const struct plan_serving *sv = &p->serving;
    if (sv->prefill_rank != sv->decode_rank || sv->prefill_device != sv->decode_device) {
      plan__error(ctx, pl->mark_stages, "drop stages, or place prefill and decode on one home",
                  "serving.placement.stages with prefill and decode on different homes (P/D) is not built yet: "
                  "each stage would need a prefill and a decode home");
      return;
    }
  }
  const struct plan_serving *sv = &p->serving;
  if (pl->n_ep_ranks && (sv->prefill_rank != sv->decode_rank || sv->prefill_device != sv->decode_device)) {
    plan__error(ctx, pl->mark_experts, "drop experts, or place prefill and decode on one home",
                "serving.placement.experts with prefill and decode on different homes (P/D) is not built yet: "
                "the shards would serve two owners (runtime/expert_par.h)");
    return;
  }
  if (pl->n_ep_ranks > p->model.n_routed)
    plan__error(ctx, pl->mark_experts, "name at most as many ranks as there are routed experts",
                "serving.placement.experts names %d ranks for %d routed experts", pl->n_ep_ranks, p->model.n_routed);
  else if (pl->n_ep_ranks && p->model.n_routed % pl->n_ep_ranks)
    plan__error(ctx, pl->mark_experts, "name a number of ranks that divides model.moe.routed_experts",
                "serving.placement.experts splits %d routed experts over %d ranks: the blocks would be unequal",
                p->model.n_routed, pl->n_ep_ranks);
}

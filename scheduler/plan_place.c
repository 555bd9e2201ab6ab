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
  for (int s = 0; s < pl->n_stages; s++) {
    if (pl->stage[s].rank + 1 > n) n = pl->stage[s].rank + 1;
    if (pl->stage[s].pd && pl->stage[s].decode + 1 > n) n = pl->stage[s].decode + 1;
  }
  for (int i = 0; i < pl->n_ep_ranks; i++)
    if (pl->ep_rank[i] + 1 > n) n = pl->ep_rank[i] + 1;
  for (int i = 0; pl->ep_pd && i < pl->n_ep_ranks_d; i++)
    if (pl->ep_rank_d[i] + 1 > n) n = pl->ep_rank_d[i] + 1;
  if (plan_place_pd(p)) { /* the P/D homes too */
    if (p->serving.prefill_rank + 1 > n) n = p->serving.prefill_rank + 1;
    if (p->serving.decode_rank + 1 > n) n = p->serving.decode_rank + 1;
  }
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

bool plan_place_pd(const struct plan *p) {
  const struct plan_placement *pl = &p->serving.place;
  return (pl->n_stages && pl->stage[0].pd) || pl->ep_pd;
}

void plan_role_view(const struct plan *p, bool decode, struct plan *v) {
  *v = *p;
  struct plan_placement *pl = &v->serving.place;
  if (!decode) return; /* stage[].rank and ep_rank already name the prefill role's */
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stage[s].pd) pl->stage[s].rank = pl->stage[s].decode;
  if (pl->ep_pd) {
    pl->n_ep_ranks = pl->n_ep_ranks_d;
    memcpy(pl->ep_rank, pl->ep_rank_d, sizeof pl->ep_rank);
    memcpy(pl->mark_ep_rank, pl->mark_ep_rank_d, sizeof pl->mark_ep_rank);
  }
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
  static const char *const keys[] = {"layers", "rank", "prefill", "decode", "device", "device_id"};
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
    bool ok = true, has_rank = false, has_p = false, has_d = false;
    for (size_t k = 0; k + 1 < e->n; k += 2) {
      const struct pnode *key = e->kids[k], *val = e->kids[k + 1];
      long long x;
      if (!strcmp(key->str, "layers"))
        ok &= read_range(ctx, val, "layers", p->n_layers, &s->lo, &s->hi);
      else if (!strcmp(key->str, "rank")) {
        ok &= has_rank = plan__read_int(ctx, val, "rank", 0, 1 << 20, &x);
        s->rank = (int)x;
        s->mark_rank = val->mark;
      } else if (!strcmp(key->str, "prefill")) { /* P/D: the stage's prefill home */
        ok &= has_p = plan__read_int(ctx, val, "prefill", 0, 1 << 20, &x);
        s->rank = (int)x;
        s->mark_rank = val->mark;
      } else if (!strcmp(key->str, "decode")) { /* P/D: the stage's decode home */
        ok &= has_d = plan__read_int(ctx, val, "decode", 0, 1 << 20, &x);
        s->decode = (int)x;
        s->mark_decode = val->mark;
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
    s->pd = has_p || has_d;
    if (ok && has_rank && s->pd) {
      plan__error(ctx, e->mark, "write either rank: N (one home) or prefill: N, decode: M (P/D), not both",
                  "stage %zu names `rank` and a P/D home", i);
      ok = false;
    } else if (ok && s->pd && !(has_p && has_d)) {
      plan__error(ctx, e->mark, "write {layers: 0-19, prefill: 0, decode: 2}", "stage %zu names only its %s home: a "
                  "P/D stage needs both `prefill` and `decode`", i, has_p ? "prefill" : "decode");
      ok = false;
    } else if (ok && (s->lo < 0 || !(has_rank || s->pd))) {
      plan__error(ctx, e->mark, "write {layers: 0-19, rank: 0} (or prefill: 0, decode: 2 for P/D)",
                  "stage %zu needs both `layers` and `rank`", i);
      ok = false;
    }
    if (ok) pl->n_stages++;
  }
}

/* A list of distinct ranks (experts.ranks / .prefill / .decode) into rank[]. */
static bool read_rank_list(struct plan_ctx *ctx, const struct pnode *v, const struct pnode *at, const char *key,
                           int *rank, struct plan_mark *mark, int *n) {
  if (!v || v->kind != PN_SEQ || v->n == 0 || v->n > PLAN_MAX_EP_RANKS) {
    plan__error(ctx, v ? v->mark : at->mark, "write ranks: [0, 1] (up to 64 ranks)",
                "serving.placement.experts needs `%s`, a list of ranks", key);
    return false;
  }
  for (size_t i = 0; i < v->n; i++) {
    long long x;
    if (!plan__read_int(ctx, v->kids[i], key, 0, 1 << 20, &x)) return false;
    for (int j = 0; j < *n; j++)
      if (rank[j] == x) {
        plan__error(ctx, v->kids[i]->mark, "name each rank once", "serving.placement.experts.%s names rank %lld "
                    "twice", key, x);
        return false;
      }
    mark[*n] = v->kids[i]->mark;
    rank[(*n)++] = (int)x;
  }
  return true;
}

static void read_experts(struct plan_ctx *ctx, const struct pnode *v, struct plan *p) {
  static const char *const keys[] = {"ranks", "prefill", "decode", "layers"};
  struct plan_placement *pl = &p->serving.place;
  pl->mark_experts = v->mark;
  if (v->kind != PN_MAP) {
    plan__error(ctx, v->mark, "write experts: {ranks: [0, 1]}", "serving.placement.experts must be a map");
    return;
  }
  const struct pnode *ranks = NULL, *layers = NULL, *pre = NULL, *dec = NULL;
  for (size_t k = 0; k + 1 < v->n; k += 2) {
    if (!strcmp(v->kids[k]->str, "ranks"))
      ranks = v->kids[k + 1];
    else if (!strcmp(v->kids[k]->str, "prefill"))
      pre = v->kids[k + 1];
    else if (!strcmp(v->kids[k]->str, "decode"))
      dec = v->kids[k + 1];
    else if (!strcmp(v->kids[k]->str, "layers"))
      layers = v->kids[k + 1];
    else
      plan__unknown_key(ctx, v->kids[k], "serving.placement.experts", keys, 4);
  }
  if (ranks && (pre || dec)) {
    plan__error(ctx, ranks->mark, "write either ranks: [...] (one home) or prefill: [...], decode: [...] (P/D)",
                "serving.placement.experts names `ranks` and a role's shards");
    return;
  }
  if (pre || dec) { /* P/D: each role's shards */
    if (!pre || !dec) {
      plan__error(ctx, v->mark, "write experts: {prefill: [0, 2], decode: [1, 2]}", "serving.placement.experts "
                  "names only the %s role's shards: P/D experts need both `prefill` and `decode`",
                  pre ? "prefill" : "decode");
      return;
    }
    pl->ep_pd = true;
    if (!read_rank_list(ctx, pre, v, "prefill", pl->ep_rank, pl->mark_ep_rank, &pl->n_ep_ranks) ||
        !read_rank_list(ctx, dec, v, "decode", pl->ep_rank_d, pl->mark_ep_rank_d, &pl->n_ep_ranks_d))
      return;
  } else if (!read_rank_list(ctx, ranks, v, "ranks", pl->ep_rank, pl->mark_ep_rank, &pl->n_ep_ranks)) {
    return;
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

/* Written in the file that writes the stages (an inherited value, say
 * v41-flash's `decode: {rank: 0}`, gives way to the stages). */
static bool same_file(struct plan_mark a, struct plan_mark b) { return a.file && b.file && !strcmp(a.file, b.file); }

/* serving.placement.prefill / decode when the stages name the homes: the
 * first stage's; written beside the stages, they must agree. */
static bool pd_stage_homes(struct plan_ctx *ctx, struct plan *p) {
  struct plan_serving *sv = &p->serving;
  const struct plan_placement *pl = &p->serving.place;
  const struct plan_stage *s0 = &pl->stage[0];
  if (same_file(sv->mark_prefill_rank, pl->mark_stages) && sv->prefill_rank != s0->rank) {
    plan__error(ctx, sv->mark_prefill_rank, "drop serving.placement.prefill.rank: the stages name the homes",
                "serving.placement.prefill.rank is %d, but stage 0's prefill home is %d", sv->prefill_rank, s0->rank);
    return false;
  }
  if (same_file(sv->mark_decode_rank, pl->mark_stages) && sv->decode_rank != s0->decode) {
    plan__error(ctx, sv->mark_decode_rank, "drop serving.placement.decode.rank: the stages name the homes",
                "serving.placement.decode.rank is %d, but stage 0's decode home is %d", sv->decode_rank, s0->decode);
    return false;
  }
  sv->prefill_rank = s0->rank;
  sv->decode_rank = s0->decode;
  return true;
}

/* P/D stages: every stage names both homes, no rank holds both roles, the
 * replay runs on P, and a KV source's readers share its stage. */
static bool check_pd_stages(struct plan_ctx *ctx, struct plan *p) {
  const struct plan_placement *pl = &p->serving.place;
  for (int s = 0; s < pl->n_stages; s++)
    if (pl->stage[s].pd != pl->stage[0].pd) {
      plan__error(ctx, pl->stage[s].mark, pl->stage[0].pd ? "write {layers: ..., prefill: P, decode: D} here too"
                  : "write {layers: ..., rank: R} here too, or prefill and decode homes on every stage",
                  "stage %d %s, stage 0 %s: the stages must all name one home or all a P/D pair", s,
                  pl->stage[s].pd ? "names P/D homes" : "names one rank", pl->stage[0].pd ? "P/D homes" : "one rank");
      return false;
    }
  if (!pl->stage[0].pd) return true;
  for (int s = 0; s < pl->n_stages; s++)
    for (int t = 0; t < pl->n_stages; t++)
      if (pl->stage[s].rank == pl->stage[t].decode) {
        plan__error(ctx, pl->stage[t].mark_decode, "give the decode role ranks of its own",
                    "rank %d is stage %d's prefill home and stage %d's decode home: a rank holds one role",
                    pl->stage[s].rank, s, t);
        return false;
      }
  for (int l = 0; l < p->n_layers; l++) {
    int src = p->layer[l].kv_src;
    if (src < 0 || plan_stage_of(p, src) == plan_stage_of(p, l)) continue;
    plan__error(ctx, pl->stage[plan_stage_of(p, l)].mark, "move the stage boundary to a KV source, so that its "
                "readers stay in its stage", "layer %d reads KV source L%d of stage %d: with P/D stages a source's "
                "readers must share its stage (each P stage ships its own layers' pages to its decode home)", l, src,
                plan_stage_of(p, src));
    return false;
  }
  return pd_stage_homes(ctx, p);
}

static void check_ep_list(struct plan_ctx *ctx, const struct plan *p, int n, const char *key) {
  const struct plan_placement *pl = &p->serving.place;
  if (n > p->model.n_routed)
    plan__error(ctx, pl->mark_experts, "name at most as many ranks as there are routed experts",
                "serving.placement.experts%s names %d ranks for %d routed experts", key, n, p->model.n_routed);
  else if (n && p->model.n_routed % n)
    plan__error(ctx, pl->mark_experts, "name a number of ranks that divides model.moe.routed_experts",
                "serving.placement.experts%s splits %d routed experts over %d ranks: the blocks would be unequal",
                key, p->model.n_routed, n);
}

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
    if (!check_pd_stages(ctx, p)) return;
    const struct plan_serving *sv = &p->serving;
    if (!pl->stage[0].pd && (sv->prefill_rank != sv->decode_rank || sv->prefill_device != sv->decode_device)) {
      plan__error(ctx, pl->mark_stages, "give each stage both homes: {layers: 0-13, prefill: 0, decode: 2} "
                  "(docs/placement.md, \"P/D with stages and experts\"), or place prefill and decode on one home",
                  "serving.placement.stages with one rank a stage, but prefill and decode on different homes (P/D)");
      return;
    }
  }
  const struct plan_serving *sv = &p->serving;
  bool split = sv->prefill_rank != sv->decode_rank || sv->prefill_device != sv->decode_device;
  if (pl->n_ep_ranks && split && !pl->ep_pd) {
    plan__error(ctx, pl->mark_experts, "write experts: {prefill: [0, 2], decode: [1, 2]} (each role's shards)",
                "serving.placement.experts with prefill and decode on different homes (P/D) needs each role's "
                "shard ranks");
    return;
  }
  if (pl->ep_pd && !split) {
    plan__error(ctx, pl->mark_experts, "write experts: {ranks: [0, 1]}, or place prefill and decode apart",
                "serving.placement.experts names each role's shards, but prefill and decode share one home");
    return;
  }
  if (plan_place_pd(p) && sv->pd_replay == PLAN_REPLAY_ON_DECODE && p->serving.ced) {
    plan__error(ctx, pl->stage[0].pd ? pl->mark_stages : pl->mark_experts, "set serving.placement.replay: prefill",
                "P/D with stages or experts runs the decoder replay on the prefill side only: the replay on D "
                "across the decode role's ranks is not built");
    return;
  }
  check_ep_list(ctx, p, pl->n_ep_ranks, pl->ep_pd ? ".prefill" : "");
  if (pl->ep_pd) check_ep_list(ctx, p, pl->n_ep_ranks_d, ".decode");
}

bool plan_ep_layer(const struct plan *p, int l) {
  const struct plan_placement *pl = &p->serving.place;
  return pl->n_ep_ranks > 0 && l >= 0 && l < p->n_layers && pl->ep_layer[l];
}

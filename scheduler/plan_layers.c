/* plan_layers.c: reading the per-layer table of a plan.
 *
 *   layers:            # every layer exactly once, in increasing order
 *     - {at: 0-1, region: encoder, mode: swa_only}
 *     - {at: 2,   region: encoder, mode: full, ratio: 2}
 *     - {at: 3-7, region: encoder, mode: reuse, ratio: 2, kv: 2, topk: 2}
 *   layer_overrides:   # patches applied afterwards, any order (for `extends`)
 *     - {at: [24, 28], mode: reuse}
 *
 * `at` is a layer, a range "a-b", or a list of those. Unset kv/topk/pool are
 * derived later by plan_check.c (SPEC 2.1's rule). Not here: whether the
 * table makes sense (plan_check.c).
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/plan_internal.h"

bool plan__read_int(struct plan_ctx *ctx, const struct pnode *v, const char *key, double lo, double hi,
                    long long *out);
bool plan__read_bool(struct plan_ctx *ctx, const struct pnode *v, const char *key, bool *out);
bool plan__read_enum(struct plan_ctx *ctx, const struct pnode *v, const char *key,
                     const char *const *names, int *out);
void plan__unknown_key(struct plan_ctx *ctx, const struct pnode *k, const char *where,
                       const char *const *known, size_t n_known);

static const char *const region_names[] = {"encoder", "decoder", NULL};
static const char *const mode_names[] = {"swa_only", "full", "reindex", "reuse", NULL};
static const char *const cand_names[] = {"none", "build", "read", NULL};
static const char *const layer_keys[] = {"at", "region", "mode", "ratio", "kv",
                                         "topk", "candidates", "pool", "engram"};

/* Parse one `at` item ("7" or "3-7") into [lo, hi]. */
static bool parse_at_item(struct plan_ctx *ctx, const struct pnode *v, int n_layers, int *lo, int *hi) {
  long long a, b;
  const char *hint = "write a layer number, a range like 3-7, or a list of those";
  if (v->kind != PN_SCALAR) {
    plan__error(ctx, v->mark, hint, "`at` must name layers, not %s", plan__kind_name(v));
    return false;
  }
  const char *dash = strchr(v->str, '-');
  if (dash && dash != v->str) {
    char left[32];
    size_t n = (size_t)(dash - v->str);
    if (n >= sizeof left) n = sizeof left - 1;
    memcpy(left, v->str, n);
    left[n] = 0;
    struct pnode l = *v, r = *v;
    l.str = left, l.plain = true;
    r.str = (char *)dash + 1, r.plain = true;
    if (!plan__read_int(ctx, &l, "at", 0, n_layers - 1, &a) || !plan__read_int(ctx, &r, "at", 0, n_layers - 1, &b))
      return false;
    if (b < a) {
      plan__error(ctx, v->mark, "write the range low-high", "range %s runs backwards", v->str);
      return false;
    }
  } else {
    struct pnode x = *v;
    x.plain = true;
    if (!plan__read_int(ctx, &x, "at", 0, n_layers - 1, &a)) return false;
    b = a;
  }
  *lo = (int)a, *hi = (int)b;
  return true;
}

/* Expand an `at` value into a list of layer numbers (in the order written). */
static int parse_at(struct plan_ctx *ctx, const struct pnode *v, int n_layers, int *out) {
  int n = 0, lo, hi;
  size_t items = v->kind == PN_SEQ ? v->n : 1;
  for (size_t i = 0; i < items; i++) {
    const struct pnode *item = v->kind == PN_SEQ ? v->kids[i] : v;
    if (!parse_at_item(ctx, item, n_layers, &lo, &hi)) return -1;
    for (int l = lo; l <= hi; l++) {
      if (n == PLAN_MAX_LAYERS) return -1;
      out[n++] = l;
    }
  }
  if (!n) plan__error(ctx, v->mark, "name at least one layer", "`at` is an empty list");
  return n ? n : -1;
}

/* YAML null (`~`, `null`, or nothing after the colon), unquoted. */
static bool is_null(const struct pnode *v) {
  return v->kind == PN_SCALAR && v->plain && (!*v->str || !strcmp(v->str, "~") || !strcmp(v->str, "null"));
}

/* Apply one entry's fields (other than `at`) to layer l. A null value
 * unsets an optional field (ratio, kv, topk, pool, candidates: back to
 * unset or derived), so an override can take away what the base set. */
static void apply_fields(struct plan_ctx *ctx, const struct pnode *entry, struct plan_layer *l, int n_layers) {
  for (size_t i = 0; i + 1 < entry->n; i += 2) {
    const char *k = entry->kids[i]->str;
    const struct pnode *v = entry->kids[i + 1];
    long long x;
    int e;
    if (!strcmp(k, "at")) continue;
    if (is_null(v) && (!strcmp(k, "ratio") || !strcmp(k, "kv") || !strcmp(k, "topk") || !strcmp(k, "pool") ||
                       !strcmp(k, "candidates"))) {
      switch (k[0]) {
      case 'r': l->ratio = -1, l->mark_ratio = v->mark; break;
      case 'k': l->kv_src = -2, l->mark_kv = v->mark; break;
      case 't': l->topk_src = -2, l->mark_topk = v->mark; break;
      case 'p': l->pool_src = -2, l->mark_cand = v->mark; break;
      default: l->cand = PLAN_CAND_NONE, l->mark_cand = v->mark; break;
      }
      continue;
    }
    if (!strcmp(k, "region")) {
      if (plan__read_enum(ctx, v, k, region_names, &e)) l->region = e, l->mark_region = v->mark;
    } else if (!strcmp(k, "mode")) {
      if (plan__read_enum(ctx, v, k, mode_names, &e)) l->mode = e, l->mark_mode = v->mark;
    } else if (!strcmp(k, "ratio")) {
      if (plan__read_int(ctx, v, k, 1, 1 << 20, &x)) l->ratio = (int)x, l->mark_ratio = v->mark;
    } else if (!strcmp(k, "kv")) {
      if (plan__read_int(ctx, v, k, 0, n_layers - 1, &x)) l->kv_src = (int)x, l->mark_kv = v->mark;
    } else if (!strcmp(k, "topk")) {
      if (plan__read_int(ctx, v, k, 0, n_layers - 1, &x)) l->topk_src = (int)x, l->mark_topk = v->mark;
    } else if (!strcmp(k, "pool")) {
      if (plan__read_int(ctx, v, k, 0, n_layers - 1, &x)) l->pool_src = (int)x, l->mark_cand = v->mark;
    } else if (!strcmp(k, "candidates")) {
      if (plan__read_enum(ctx, v, k, cand_names, &e)) l->cand = e, l->mark_cand = v->mark;
    } else if (!strcmp(k, "engram")) {
      plan__read_bool(ctx, v, k, &l->engram);
    } else {
      plan__unknown_key(ctx, entry->kids[i], "in a layer entry", layer_keys,
                        sizeof layer_keys / sizeof layer_keys[0]);
    }
  }
}

static void init_layer(struct plan_layer *l, int index, struct plan_mark mark) {
  memset(l, 0, sizeof *l);
  l->index = index;
  l->ratio = -1;
  l->kv_src = l->topk_src = l->pool_src = -2; /* derive */
  l->mark = l->mark_mode = l->mark_ratio = l->mark_kv = l->mark_topk = l->mark_cand = l->mark_region = mark;
}

/* Report the undefined layers as ranges. */
static void report_missing(struct plan_ctx *ctx, const bool *defined, int n, struct plan_mark at) {
  for (int a = 0; a < n; a++) {
    if (defined[a]) continue;
    int b = a;
    while (b + 1 < n && !defined[b + 1]) b++;
    char hint[96];
    if (a == b) {
      snprintf(hint, sizeof hint, "add an entry `- {at: %d, region: ..., mode: ...}`", a);
      plan__error(ctx, at, hint, "layer %d is missing from `layers` (model.n_layers = %d)", a, n);
    } else {
      snprintf(hint, sizeof hint, "add an entry `- {at: %d-%d, region: ..., mode: ...}`", a, b);
      plan__error(ctx, at, hint, "layers %d-%d are missing from `layers` (model.n_layers = %d)", a, b, n);
    }
    a = b;
  }
}

static void read_definitions(struct plan_ctx *ctx, const struct pnode *seq, struct plan *p, bool *defined) {
  int n = p->model.n_layers, idx[PLAN_MAX_LAYERS], highest = -1;
  for (size_t e = 0; e < seq->n; e++) {
    const struct pnode *entry = seq->kids[e];
    if (entry->kind != PN_MAP) {
      plan__error(ctx, entry->mark, "write `- {at: 3-7, region: encoder, mode: reuse, ratio: 2}`",
                  "a layer entry must be a mapping, not %s", plan__kind_name(entry));
      continue;
    }
    const struct pnode *at = plan__map_get(entry, "at");
    if (!at) {
      plan__error(ctx, entry->mark, "add `at: N` or `at: a-b`", "layer entry without `at`");
      continue;
    }
    const char *need[] = {"region", "mode"};
    for (int k = 0; k < 2; k++)
      if (!plan__map_get(entry, need[k]))
        plan__error(ctx, entry->mark, "every entry under `layers` sets region and mode", "layer entry `at: %s` has no `%s`",
                    at->kind == PN_SCALAR ? at->str : "...", need[k]);
    int m = parse_at(ctx, at, n, idx);
    if (m < 0) continue;
    for (int i = 0; i < m; i++) {
      int l = idx[i];
      if (defined[l]) {
        char hint[128];
        snprintf(hint, sizeof hint, "remove it here or at line %d; use `layer_overrides` to change a layer",
                 p->layer[l].mark.line);
        plan__error(ctx, at->mark, hint, "layer %d is defined twice", l);
        continue;
      }
      if (l < highest) {
        char hint[96];
        snprintf(hint, sizeof hint, "list layers in increasing order (layer %d came before)", highest);
        plan__error(ctx, at->mark, hint, "layer %d is out of order", l);
      }
      if (l > highest) highest = l;
      defined[l] = true;
      init_layer(&p->layer[l], l, entry->mark);
      apply_fields(ctx, entry, &p->layer[l], n);
    }
  }
}

static void read_overrides(struct plan_ctx *ctx, const struct pnode *seq, struct plan *p, const bool *defined) {
  int n = p->model.n_layers, idx[PLAN_MAX_LAYERS];
  for (size_t e = 0; e < seq->n; e++) {
    const struct pnode *entry = seq->kids[e];
    const struct pnode *at = entry->kind == PN_MAP ? plan__map_get(entry, "at") : NULL;
    if (!at) {
      plan__error(ctx, entry->mark, "write `- {at: 24, mode: reuse}`", "a layer override must be a mapping with `at`");
      continue;
    }
    int m = parse_at(ctx, at, n, idx);
    for (int i = 0; i < m; i++)
      if (defined[idx[i]]) {
        apply_fields(ctx, entry, &p->layer[idx[i]], n);
        p->layer[idx[i]].mark_override = entry->mark; /* the layer's rules now blame this entry */
      }
  }
}

void plan__read_layers(struct plan_ctx *ctx, const struct pnode *root, struct plan *p) {
  const struct pnode *layers = plan__map_get(root, "layers");
  const struct pnode *over = plan__map_get(root, "layer_overrides");
  int n = p->model.n_layers;
  p->n_layers = n;
  if (!layers) {
    plan__error(ctx, root->mark, "add a `layers:` list (see docs/plans.md) or `extends:` a plan that has one",
                "the plan has no `layers`");
    return;
  }
  if (layers->kind != PN_SEQ) {
    plan__error(ctx, layers->mark, "write `layers:` as a list of `- {at: ..., region: ..., mode: ...}`",
                "`layers` must be a list, not %s", plan__kind_name(layers));
    return;
  }
  if (over && over->kind != PN_SEQ) {
    plan__error(ctx, over->mark, "write a list of `- {at: ..., field: value}`", "`layer_overrides` must be a list");
    over = NULL;
  }
  bool *defined = cedar_xcalloc((size_t)n, sizeof *defined);
  read_definitions(ctx, layers, p, defined);
  report_missing(ctx, defined, n, layers->mark);
  if (over) read_overrides(ctx, over, p, defined);
  free(defined);
}

const char *plan_mode_name(enum plan_mode m) { return m <= PLAN_REUSE ? mode_names[m] : "?"; }
const char *plan_region_name(enum plan_region r) { return r <= PLAN_DECODER ? region_names[r] : "?"; }
const char *plan_cand_name(enum plan_cand c) { return c <= PLAN_CAND_READ ? cand_names[c] : "?"; }

/* weights.c: a plan's weights as values (weights.h): synthetic values from
 * a seed (the scales are weights_list.c's, with the reasons), a rank's part,
 * the problems a file's check finds, and safetensors save/check/load. The
 * tensor list, its fingerprint and lookup are weights_list.c's.
 */
#include "runtime/load/weights.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/qweight.h"
#include "ops/sample.h"
#include "runtime/load/shards.h"
#include "base/check.h"

#define SQRT3 1.7320508f
/* ---- synthetic values --------------------------------------------------- */

/* Element i of the stream `key`: draw i of splitmix64 started at key, its top
 * 24 bits as a symmetric uniform in (-a, a), never 0 (k + 0.5 is exact). */
static float draw(uint64_t key, uint64_t i, float a) {
  uint64_t state = key + i * 0x9E3779B97F4A7C15ull;
  int32_t k = (int32_t)(op_rng_next(&state) >> 40) - (1 << 23);
  return a * (((float)k + 0.5f) * 0x1p-23f);
}

/* The mHC base logits without noise (see the header of this file). */
static float mhc_base(int64_t i, int hc) {
  if (i < hc) return hc > 1 ? (float)-log((double)(hc - 1)) : (float)log(19.0);
  if (i < 2 * hc) return 0.0f;
  int64_t k = i - 2 * hc;
  return hc > 1 && k / hc == k % hc ? (float)log(9.0 * (hc - 1)) : 0.0f;
}

static void fill_engram(uint8_t *out, const struct weights_spec *s, uint64_t key) {
  int hd = s->row_values;
  size_t rb = op_engram_row_bytes(hd, WEIGHTS_ENGRAM_BLOCK);
  float *v = cedar_xmalloc((size_t)hd * sizeof *v);
  for (int64_t r = 0; r < s->shape[0]; r++) {
    for (int j = 0; j < hd; j++) v[j] = draw(key, (uint64_t)r * (uint64_t)hd + (uint64_t)j, s->a);
    op_fp8_pack(out + (size_t)r * rb, v, hd, WEIGHTS_ENGRAM_BLOCK, OP_SCALE_E8M0);
  }
  free(v);
}

/* Elements [i0, i1) of tensor s into out (element i0 at out[0]): the same
 * values as the whole tensor's (counter-based). */
static void fill_range(void *out, const struct weights_spec *s, uint64_t seed, uint64_t i0, uint64_t i1) {
  uint64_t key = XXH3_64bits_withSeed(s->name, strlen(s->name), seed);
  if (s->init == WEIGHTS_ENGRAM_ROWS) {
    CEDAR_ASSERT(i0 == 0);
    fill_engram(out, s, key);
    return;
  }
  CEDAR_ASSERT(s->dtype == ST_F32);
  float *x = (float *)out - i0;
  for (uint64_t i = i0; i < i1; i++) {
    switch (s->init) {
      case WEIGHTS_UNIFORM: x[i] = draw(key, i, s->a); break;
      case WEIGHTS_ONES: x[i] = 1.0f + draw(key, i, s->a); break;
      case WEIGHTS_CONST: x[i] = s->a; break;
      case WEIGHTS_MHC_BASE: x[i] = mhc_base((int64_t)i, s->hc) + draw(key, i, s->a); break;
      case WEIGHTS_ENGRAM_ROWS: CEDAR_ASSERT(0); break;
    }
  }
}

void weights_fill(void *out, const struct weights_spec *s, uint64_t seed) {
  fill_range(out, s, seed, 0, s->nbytes / (s->init == WEIGHTS_ENGRAM_ROWS ? 1 : sizeof(float)));
}

/* ---- a rank's part ------------------------------------------------------ */

static uint64_t row_bytes(const struct weights_spec *s) { return s->shape[0] ? s->nbytes / (uint64_t)s->shape[0] : 0; }

/* w->part from part (NULL: none). */
static void part_init(struct weights *w, const struct weights_part *part) {
  if (!part) return;
  const struct weights_list *l = &w->list;
  w->part = cedar_xcalloc(l->n ? l->n : 1, sizeof *w->part);
  for (size_t i = 0; i < l->n; i++) {
    struct weights_rows r = {0, l->t[i].shape[0]};
    if (l->t[i].ndim > 0 && l->t[i].init != WEIGHTS_ENGRAM_ROWS && part->rows(&l->t[i], &r, part->ctx))
      CEDAR_ASSERT(r.lo >= 0 && r.lo <= r.hi && r.hi <= l->t[i].shape[0]);
    else
      r = (struct weights_rows){0, l->t[i].ndim > 0 ? l->t[i].shape[0] : 1};
    w->part[i] = r;
  }
}

uint64_t weights_held_bytes(const struct weights *w, size_t i) {
  const struct weights_spec *s = &w->list.t[i];
  if (!w->part || s->ndim == 0) return s->nbytes;
  return row_bytes(s) * (uint64_t)(w->part[i].hi - w->part[i].lo);
}

int64_t weights_row0(const struct weights *w, const char *name) {
  const struct weights_spec *hit = weights_list_find(&w->list, name);
  size_t i = hit ? (size_t)(hit - w->list.t) : SIZE_MAX;
  return w->part && i != SIZE_MAX ? w->part[i].lo : 0;
}

/* ---- problems ----------------------------------------------------------- */

static void problem(struct weights_problems *pr, size_t *count, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void problem(struct weights_problems *pr, size_t *count, const char *fmt, ...) {
  ++*count;
  if (!pr) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  CEDAR_ASSERT(n >= 0);
  char *s = cedar_xmalloc((size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  if (pr->n == pr->cap) {
    pr->cap = pr->cap ? 2 * pr->cap : 16;
    pr->msg = cedar_xrealloc(pr->msg, pr->cap * sizeof *pr->msg);
  }
  pr->msg[pr->n++] = s;
}

void weights_problems_print(const struct weights_problems *pr, FILE *f, size_t max_shown) {
  for (size_t i = 0; i < pr->n && i < max_shown; i++) fprintf(f, "  %s\n", pr->msg[i]);
  if (pr->n > max_shown) fprintf(f, "  ... and %zu more\n", pr->n - max_shown);
}

void weights_problems_free(struct weights_problems *pr) {
  for (size_t i = 0; i < pr->n; i++) free(pr->msg[i]);
  free(pr->msg);
  memset(pr, 0, sizeof *pr);
}

/* ---- check -------------------------------------------------------------- */

static void shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
  size_t o = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (o < len) snprintf(buf + o, len - o, ")");
}

static void check_fingerprint(const struct weights_list *l, const st_file_t *f, struct weights_problems *pr,
                              size_t *count, bool tensors_match) {
  char want[17];
  weights_fingerprint_hex(l->fingerprint, want);
  const char *got = st_meta_get(f, "cedar.fingerprint"), *plan = st_meta_get(f, "cedar.plan");
  if (!got)
    problem(pr, count,
            "__metadata__: no cedar.fingerprint (plan '%s' needs %s); make weights with `cedar weights init`",
            l->plan_name, want);
  else if (strcmp(got, want))
    problem(pr, count,
            "cedar.fingerprint %s (weights made for plan '%s') does not match plan '%s', which needs %s: %s",
            got, plan ? plan : "?", l->plan_name, want,
            tensors_match ? "every tensor's name, dtype and shape match the plan, so the plan's other settings or "
                            "the metadata itself differ; remake the weights with `cedar weights init --plan ...`"
                          : "the dimensions differ; make weights for this plan with `cedar weights init --plan ...`");
}

static bool is_engram_table(const struct weights_spec *s) { return s->init == WEIGHTS_ENGRAM_ROWS; }

/* Every tensor against the plan (pr NULL: only count the problems). */
static void check_tensors(const struct weights_list *l, const st_file_t *f, struct weights_problems *pr,
                          size_t *count_out) {
  size_t count = 0;
  char want[96], got[96];
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    const struct st_tensor *t = st_find(f, s->name);
    if (!t) {
      shape_str(want, sizeof want, s->ndim, s->shape);
      problem(pr, &count, "%s: missing (plan '%s' needs %s %s)", s->name, l->plan_name, st_dtype_name(s->dtype), want);
      continue;
    }
    if (t->dtype != s->dtype)
      problem(pr, &count, "%s: dtype %s in the file, plan '%s' needs %s", s->name, st_dtype_name(t->dtype),
              l->plan_name, st_dtype_name(s->dtype));
    bool same = t->ndim == s->ndim;
    for (int k = 0; same && k < s->ndim; k++) same = t->shape[k] == s->shape[k];
    if (!same) {
      shape_str(got, sizeof got, t->ndim, t->shape);
      shape_str(want, sizeof want, s->ndim, s->shape);
      problem(pr, &count, "%s: shape %s in the file, plan '%s' needs %s", s->name, got, l->plan_name, want);
    }
  }
  for (size_t i = 0; i < st_count(f); i++) {
    const struct st_tensor *t = st_tensor_at(f, i);
    if (!weights_list_find(l, t->name))
      problem(pr, &count, "%s: unexpected tensor (plan '%s' has no tensor of that name)", t->name, l->plan_name);
    char key[WEIGHTS_NAME_MAX + 300], hex[17];
    weights_hash_key(key, sizeof key, t->name);
    const char *rec = st_meta_get(f, key);
    const struct weights_spec *ws = l->engram_in_file ? weights_list_find(l, t->name) : NULL;
    if (ws && is_engram_table(ws)) rec = NULL; /* mmap tier: hashing would read every row (engram_tier.h) */
    if (rec && (weights_hash_hex(hex, t->data, t->nbytes), strcmp(rec, hex)))
      problem(pr, &count, "%s: content hash %s, the file records %s: the tensor's data is damaged", t->name, hex, rec);
  }
  *count_out += count;
}

size_t weights_check_file(const struct weights_list *l, const st_file_t *f, struct weights_problems *pr) {
  size_t count = 0, tensor_problems = 0;
  check_tensors(l, f, NULL, &tensor_problems); /* counted first: the fingerprint's message says whether they match */
  check_fingerprint(l, f, pr, &count, tensor_problems == 0);
  check_tensors(l, f, pr, &count);
  return count;
}

/* ---- handles ------------------------------------------------------------ */

static uint64_t round_align(uint64_t n) { return (n + WEIGHTS_ALIGN - 1) / WEIGHTS_ALIGN * WEIGHTS_ALIGN; }

static void human_bytes(char *buf, size_t len, uint64_t n) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = (double)n;
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, u++;
  snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
}

int weights_synth_part(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, bool no_engram,
                       const struct weights_part *part, char *err, size_t err_len) {
  memset(w, 0, sizeof *w);
  int rc = weights_list_init(&w->list, p, err, err_len);
  if (rc) return rc;
  part_init(w, part);
  const struct weights_list *l = &w->list;
  if (l->total_bytes - (no_engram ? l->engram_bytes : 0) > max_bytes) {
    char total[32], eng[32], lim[32];
    human_bytes(total, sizeof total, l->total_bytes);
    human_bytes(eng, sizeof eng, l->engram_bytes);
    human_bytes(lim, sizeof lim, max_bytes);
    snprintf(err, err_len,
             "plan '%s' needs %s of weights (%" PRIu64 " bytes, Engram tables %s of them), more than the limit of "
             "%s (`cedar weights init --max-bytes` raises it if this machine has the memory and disk; `cedar weights list` "
             "shows every tensor)",
             l->plan_name, total, l->total_bytes, eng, lim);
    weights_free(w);
    return CEDAR_EINVAL;
  }
  uint64_t arena = 0;
  for (size_t i = 0; i < l->n; i++)
    if (!(no_engram && is_engram_table(&l->t[i]))) arena += round_align(weights_held_bytes(w, i));
  w->data = calloc(l->n ? l->n : 1, sizeof *w->data);
  if (!w->data || arena > SIZE_MAX || posix_memalign(&w->arena, WEIGHTS_ALIGN, (size_t)(arena ? arena : 1))) {
    snprintf(err, err_len, "plan '%s': cannot allocate %" PRIu64 " bytes of weights", l->plan_name, arena);
    w->arena = NULL;
    weights_free(w);
    return CEDAR_ENOMEM;
  }
  w->arena_bytes = arena;
  uint8_t *at = w->arena;
  for (size_t i = 0; i < l->n; i++) {
    if (no_engram && is_engram_table(&l->t[i])) continue; /* the mmap tier's file holds them (engram_tier.h) */
    uint64_t rb = row_bytes(&l->t[i]) / (is_engram_table(&l->t[i]) ? 1 : sizeof(float)); /* elements a row */
    if (w->part && l->t[i].ndim > 0)
      fill_range(at, &l->t[i], seed, (uint64_t)w->part[i].lo * rb, (uint64_t)w->part[i].hi * rb);
    else
      weights_fill(at, &l->t[i], seed);
    if (!is_engram_table(&l->t[i])) /* the values the release's format holds (weights_held.c) */
      weights_store_values((float *)at, &l->t[i], (int64_t)(weights_held_bytes(w, i) / sizeof(float)) /
                                             (l->t[i].ndim ? l->t[i].shape[l->t[i].ndim - 1] : 1));
    w->data[i] = at;
    at += round_align(weights_held_bytes(w, i));
  }
  w->synthetic = true;
  w->seed = seed;
  return CEDAR_OK;
}

int weights_synth(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, char *err,
                  size_t err_len) {
  return weights_synth_part(w, p, seed, max_bytes, false, NULL, err, err_len);
}

int weights_synth_no_engram(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, char *err,
                            size_t err_len) {
  return weights_synth_part(w, p, seed, max_bytes, true, NULL, err, err_len);
}

int weights_save(const struct weights *w, const char *path, char *err, size_t err_len) {
  const struct weights_list *l = &w->list;
  CEDAR_ASSERT_MSG(!w->engram_scales, "weights_save of split Engram tables (a checkpoint under the mmap tier)");
  if (w->part) return snprintf(err, err_len, "%s: a rank's part of the weights is not a weight file", path), CEDAR_EINVAL;
  struct st_tensor *ts = calloc(l->n ? l->n : 1, sizeof *ts);
  if (!ts) return snprintf(err, err_len, "%s: out of memory", path), CEDAR_ENOMEM;
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    ts[i] = (struct st_tensor){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .nbytes = s->nbytes,
                               .data = w->data[i]};
    memcpy(ts[i].shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
  }
  char fp[17], seed[24];
  weights_fingerprint_hex(l->fingerprint, fp);
  snprintf(seed, sizeof seed, "%" PRIu64, w->seed);
  /* three fixed keys, then one content hash per tensor */
  struct st_meta *meta = cedar_xcalloc(l->n + 3, sizeof *meta);
  char (*hash)[WEIGHTS_NAME_MAX + 32] = cedar_xcalloc(l->n + 1, sizeof *hash);
  size_t nm = 0;
  meta[nm++] = (struct st_meta){"cedar.fingerprint", fp};
  meta[nm++] = (struct st_meta){"cedar.plan", l->plan_name};
  if (w->synthetic) meta[nm++] = (struct st_meta){"cedar.seed", seed};
  for (size_t i = 0; i < l->n; i++) {
    weights_hash_key(hash[i], WEIGHTS_NAME_MAX + 12, l->t[i].name);
    weights_hash_hex(hash[i] + WEIGHTS_NAME_MAX + 12, w->data[i], l->t[i].nbytes);
    meta[nm++] = (struct st_meta){hash[i], hash[i] + WEIGHTS_NAME_MAX + 12};
  }
  int rc = st_write(path, ts, l->n, meta, nm, err, err_len);
  free(hash);
  free(meta);
  free(ts);
  return rc;
}

/* Point at each tensor in the mapping, or copy it when it is not aligned. */
static int place_tensors(struct weights *w, const char *path, char *err, size_t err_len) {
  const struct weights_list *l = &w->list;
  uint64_t arena = 0;
  for (size_t i = 0; i < l->n; i++) {
    const struct st_tensor *t = st_find(w->file, l->t[i].name);
    const uint8_t *at0 = (const uint8_t *)t->data + (w->part ? (uint64_t)w->part[i].lo * row_bytes(&l->t[i]) : 0);
    if ((uintptr_t)at0 % WEIGHTS_ALIGN && !(l->engram_in_file && is_engram_table(&l->t[i])))
      arena += round_align(weights_held_bytes(w, i));
  }
  w->data = calloc(l->n ? l->n : 1, sizeof *w->data);
  if (!w->data || arena > SIZE_MAX || posix_memalign(&w->arena, WEIGHTS_ALIGN, (size_t)(arena ? arena : 1))) {
    w->arena = NULL;
    return snprintf(err, err_len, "%s: cannot allocate %" PRIu64 " bytes for unaligned tensors", path, arena),
           CEDAR_ENOMEM;
  }
  uint8_t *at = w->arena;
  for (size_t i = 0; i < l->n; i++) {
    const struct st_tensor *t = st_find(w->file, l->t[i].name);
    const uint8_t *at0 = (const uint8_t *)t->data + (w->part ? (uint64_t)w->part[i].lo * row_bytes(&l->t[i]) : 0);
    if ((uintptr_t)at0 % WEIGHTS_ALIGN == 0 || (l->engram_in_file && is_engram_table(&l->t[i]))) {
      w->data[i] = at0; /* an mmap-tier table is read in place, aligned or not (bytes); a part's rows too */
      continue;
    }
    memcpy(at, at0, weights_held_bytes(w, i));
    w->data[i] = at;
    at += round_align(weights_held_bytes(w, i));
    w->copied_bytes += weights_held_bytes(w, i);
  }
  return CEDAR_OK;
}

int weights_load(struct weights *w, const struct plan *p, const char *path, struct weights_problems *pr,
                 char *err, size_t err_len) {
  return weights_load_part(w, p, path, NULL, pr, err, err_len);
}

int weights_load_part(struct weights *w, const struct plan *p, const char *path, const struct weights_part *part,
                      struct weights_problems *pr, char *err, size_t err_len) {
  memset(w, 0, sizeof *w);
  int rc = weights_list_init(&w->list, p, err, err_len);
  if (rc) return rc;
  part_init(w, part);
  w->list.engram_in_file = p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP;
  rc = st_open(path, &w->file, err, err_len);
  if (rc) {
    weights_free(w);
    return rc;
  }
  struct weights_problems local = {0}, *use = pr ? pr : &local;
  size_t first = use->n, n = weights_check_file(&w->list, w->file, use);
  if (n) {
    snprintf(err, err_len, "%s: %zu problem%s against plan '%s'; the first: %s", path, n, n == 1 ? "" : "s",
             w->list.plan_name, use->msg[first]);
    weights_problems_free(&local);
    weights_free(w);
    return CEDAR_EFORMAT;
  }
  const char *seed = st_meta_get(w->file, "cedar.seed");
  if (seed) w->synthetic = true, w->seed = strtoull(seed, NULL, 10);
  rc = place_tensors(w, path, err, err_len);
  if (rc) weights_free(w);
  return rc;
}

void weights_free(struct weights *w) {
  ckpt_shards_free(w->shards);
  free(w->engram_scales);
  weights_list_free(&w->list);
  free(w->data);
  free(w->arena);
  free(w->part);
  free(w->qw);
  st_close(w->file);
  memset(w, 0, sizeof *w);
}

const void *weights_get(const struct weights *w, const char *name, const struct weights_spec **spec) {
  const struct weights_spec *hit = weights_list_find(&w->list, name);
  size_t i = hit ? (size_t)(hit - w->list.t) : SIZE_MAX;
  if (spec) *spec = i == SIZE_MAX ? NULL : &w->list.t[i];
  return i == SIZE_MAX ? NULL : w->data[i];
}

const float *weights_f32(const struct weights *w, const char *name) {
  const struct weights_spec *s;
  const void *d = weights_get(w, name, &s);
  return d && s->dtype == ST_F32 && weights_fmt_at(w, (size_t)(s - w->list.t)) == OP_W_F32 ? d : NULL;
}

uint64_t weights_identity(const struct weights *w) {
  if (w->synthetic) {
    uint64_t v[2] = {w->list.fingerprint, w->seed};
    return XXH3_64bits(v, sizeof(v));
  }
  XXH3_state_t *st = XXH3_createState();
  CEDAR_ASSERT(st != NULL);
  XXH3_64bits_reset_withSeed(st, w->list.fingerprint);
  bool in_file = w->list.engram_in_file; /* the mmap tier: the tables by their files (weights.h) */
  for (size_t i = 0; i < w->list.n; i++) {
    if (in_file && is_engram_table(&w->list.t[i])) continue;
    if (weights_fmt_at(w, i) == OP_W_F32) {
      XXH3_64bits_update(st, w->data[i], weights_held_bytes(w, i)); /* a part: its rows */
      continue;
    } /* held in a stored format: its elements and scales (weights_held.c) */
    XXH3_64bits_update(st, w->qw[i].data, op_qweight_data_bytes(&w->qw[i]));
    XXH3_64bits_update(st, w->qw[i].scale, op_qweight_scale_bytes(&w->qw[i]));
  }
  size_t n_files = w->shards ? w->shards->n : w->file ? 1 : 0;
  for (size_t k = 0; in_file && k < n_files; k++) {
    const st_file_t *f = w->shards ? w->shards->files[k] : w->file;
    uint64_t id[4];
    st_file_id(f, id);
    XXH3_64bits_update(st, id, sizeof id);
    for (size_t j = 0; j < st_meta_count(f); j++) {
      const struct st_meta *m = st_meta_at(f, j);
      XXH3_64bits_update(st, m->key, strlen(m->key) + 1);
      XXH3_64bits_update(st, m->value, strlen(m->value) + 1);
    }
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

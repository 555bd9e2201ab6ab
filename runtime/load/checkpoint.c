/* checkpoint.c: open a released-layout checkpoint directory and fill a
 * plan's weights from it (checkpoint.h). The writer is ckpt_write.c, the
 * name table and codecs ckpt_map.c, config.json ckpt_config.c.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include "runtime/load/checkpoint.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/check.h"
#include "base/file.h"
#include "base/log.h"
#include "ops/qweight.h"

/* ---- problems ------------------------------------------------------------------ */

struct ctx {
  const char *dir;
  struct weights_problems *pr;
  size_t count;
  char first[512];
};

static void problem(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(struct ctx *c, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (!c->count++) snprintf(c->first, sizeof c->first, "%s", buf);
  if (!c->pr) return;
  if (c->pr->n == c->pr->cap)
    c->pr->msg = cedar_xrealloc(c->pr->msg, (c->pr->cap = c->pr->cap ? 2 * c->pr->cap : 16) * sizeof *c->pr->msg);
  c->pr->msg[c->pr->n++] = cedar_xstrdup(buf);
}

static int finish(struct ctx *c, char *err, size_t len) {
  if (!c->count) return 0;
  snprintf(err, len, "%s: %zu problem%s; the first: %s", c->dir, c->count, c->count == 1 ? "" : "s", c->first);
  return CEDAR_EFORMAT;
}

/* ---- files --------------------------------------------------------------------- */

static char *read_text(const char *path, size_t cap, size_t *len, char *err, size_t err_len) {
  return cedar_read_all(path, cap, len, err, err_len); /* base/file.h: no FIFO, device or over-cap file */
}

/* A shard name from the index: a plain file name, nothing that leaves the
 * directory or hides (no '/', no '\\', no leading '.', no control bytes). */
static bool plain_shard_name(const char *s) {
  size_t n = strlen(s);
  if (n < 13 || n > 255 || s[0] == '.' || strcmp(s + n - 12, ".safetensors")) return false;
  for (const char *p = s; *p; p++)
    if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20) return false;
  return true;
}

static size_t shard_index(struct ckpt_shards *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], name)) return i;
  s->names = cedar_xrealloc(s->names, (s->n + 1) * sizeof *s->names);
  s->files = cedar_xrealloc(s->files, (s->n + 1) * sizeof *s->files);
  s->names[s->n] = cedar_xstrdup(name);
  s->files[s->n] = NULL;
  return s->n++;
}

/* One tensor of the checkpoint, by released name. */
struct entry {
  const char *name;
  size_t shard;           /* where the index says it is */
  const struct st_tensor *t;
  bool used;
};

static int entry_cmp(const void *a, const void *b) {
  return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

struct ckpt {
  struct ckpt_shards *s;
  struct entry *e;
  size_t n;
  cJSON *index;  /* owns the names of e */
};

static struct entry *find(struct ckpt *k, const char *name) {
  struct entry key = {.name = name};
  return k->n ? bsearch(&key, k->e, k->n, sizeof *k->e, entry_cmp) : NULL;
}

/* The index (or the one model.safetensors), each shard mapped and checked,
 * each tensor where the index says. */
static void open_shards(struct ckpt *k, struct ctx *c) {
  char path[4096], err[512];
  k->s = cedar_xcalloc(1, sizeof *k->s);
  k->s->dir = cedar_xstrdup(c->dir);
  snprintf(path, sizeof path, "%s/%s", c->dir, CKPT_INDEX);
  size_t len;
  struct stat st;
  if (stat(path, &st) == 0) {
    char *text = read_text(path, CKPT_INDEX_MAX_BYTES, &len, err, sizeof err);
    if (!text) return problem(c, "%s", err);
    k->index = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(k->index, "weight_map");
    if (!cJSON_IsObject(wm)) return problem(c, "%s: not JSON with a `weight_map` object", CKPT_INDEX);
    k->e = cedar_xcalloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof *k->e);
    const cJSON *it;
    cJSON_ArrayForEach(it, wm) {
      if (!cJSON_IsString(it) || !plain_shard_name(it->valuestring)) {
        problem(c, "%s: tensor '%s' names shard '%s', not a plain *.safetensors file name in the directory", CKPT_INDEX,
                it->string, cJSON_IsString(it) ? it->valuestring : "(not a string)");
        continue;
      }
      k->e[k->n++] = (struct entry){.name = it->string, .shard = shard_index(k->s, it->valuestring)};
    }
    /* a single-file checkpoint beside an index that does not name it: two
     * checkpoints' files (one written over the other); which one is meant
     * cannot be known, so neither is used */
    bool named = false;
    for (size_t i = 0; i < k->s->n; i++) named |= !strcmp(k->s->names[i], CKPT_SINGLE);
    snprintf(path, sizeof path, "%s/%s", c->dir, CKPT_SINGLE);
    if (!named && stat(path, &st) == 0)
      problem(c, "%s holds both %s and %s, which does not name it: the files of two checkpoints; remove the stale "
                 "one (the index and its shards, or the single file), or write the checkpoint again with "
                 "`cedar weights init --layout released`",
              c->dir, CKPT_SINGLE, CKPT_INDEX);
  } else {
    k->e = cedar_xcalloc(1, sizeof *k->e);
    shard_index(k->s, CKPT_SINGLE);
  }
  qsort(k->e, k->n, sizeof *k->e, entry_cmp);
  for (size_t i = 1; i < k->n; i++)
    if (!strcmp(k->e[i - 1].name, k->e[i].name)) problem(c, "%s: tensor '%s' listed twice", CKPT_INDEX, k->e[i].name);
  for (size_t i = 0; i < k->s->n; i++) {
    snprintf(path, sizeof path, "%s/%s", c->dir, k->s->names[i]);
    int rc = st_open(path, &k->s->files[i], err, sizeof err);
    if (rc) {
      problem(c, "%s", err);
      continue;
    }
    if (stat(path, &st) == 0) k->s->file_bytes += (uint64_t)st.st_size;
  }
  if (c->count) return;
  if (!k->index) { /* one file, no index: its tensors are the entries */
    const st_file_t *f = k->s->files[0];
    k->e = cedar_xrealloc(k->e, (st_count(f) + 1) * sizeof *k->e);
    for (size_t i = 0; i < st_count(f); i++) k->e[k->n++] = (struct entry){.name = st_tensor_at(f, i)->name};
    qsort(k->e, k->n, sizeof *k->e, entry_cmp);
  }
  for (size_t i = 0; i < k->s->n; i++)
    for (size_t j = 0; j < st_count(k->s->files[i]); j++) {
      const struct st_tensor *t = st_tensor_at(k->s->files[i], j);
      struct entry *e = find(k, t->name);
      if (!e) problem(c, "%s: tensor '%s' is not in %s", k->s->names[i], t->name, CKPT_INDEX);
      else if (e->shard != i) problem(c, "%s: tensor '%s' is here, but the index places it in %s", k->s->names[i], t->name, k->s->names[e->shard]);
      else e->t = t;
    }
  for (size_t i = 0; i < k->n; i++)
    if (!k->e[i].t) problem(c, "%s: the index lists tensor '%s' in it, but the shard has no such tensor", k->s->names[k->e[i].shard], k->e[i].name);
}

/* The content hashes a shard records (`cedar.hash.<name>`: XXH3-64, hex);
 * with tables_in_file (the mmap tier) not the Engram tables' (checkpoint.h). */
static void verify_hashes(struct ckpt *k, struct ctx *c, bool tables_in_file, struct ckpt_load_stats *st) {
  for (size_t i = 0; i < k->s->n; i++) {
    const st_file_t *f = k->s->files[i];
    for (size_t j = 0; j < st_count(f); j++) {
      const struct st_tensor *t = st_tensor_at(f, j);
      char key[300], got[17];
      snprintf(key, sizeof key, "cedar.hash.%s", t->name);
      const char *want = st_meta_get(f, key);
      if (!want) {
        st->unhashed++;
        continue;
      }
      if (tables_in_file && ckpt_is_engram_table(t->name)) {
        st->hash_skipped++;
        continue;
      }
      snprintf(got, sizeof got, "%016" PRIx64, XXH3_64bits(t->data, t->nbytes));
      if (strcmp(want, got))
        problem(c, "%s: tensor '%s': content hash %s, the shard's metadata records %s: the data is damaged",
                k->s->names[i], t->name, got, want);
      st->hashed++;
    }
  }
}

/* ---- one internal tensor --------------------------------------------------------- */

static const char *dt(enum st_dtype d) { return st_dtype_name(d); }

static void shape_str(char *b, size_t len, int nd, const int64_t *s) {
  size_t o = (size_t)snprintf(b, len, "[");
  for (int i = 0; i < nd && o < len; i++) o += (size_t)snprintf(b + o, len - o, "%s%" PRId64, i ? ", " : "", s[i]);
  if (o < len) snprintf(b + o, len - o, "]");
}

/* The released tensor `name` with dtype d (or F32/BF16 for floats) and shape; NULL after a problem. */
static const struct st_tensor *take(struct ckpt *k, struct ctx *c, const char *name, const char *internal,
                                    enum st_dtype d, bool any_float, int nd, const int64_t *shape) {
  struct entry *e = find(k, name);
  char want[96], got[96];
  shape_str(want, sizeof want, nd, shape);
  if (!e || !e->t) {
    problem(c, "tensor '%s' (cedar's %s): missing; the plan needs %s %s", name, internal,
            any_float ? "F32 or BF16" : dt(d), want);
    return NULL;
  }
  e->used = true;
  const struct st_tensor *t = e->t;
  bool ok_dt = any_float ? t->dtype == ST_F32 || t->dtype == ST_BF16 : t->dtype == d;
  bool ok_shape = t->ndim == nd;
  for (int i = 0; ok_shape && i < nd; i++) ok_shape = t->shape[i] == shape[i];
  if (!ok_dt) problem(c, "%s: tensor '%s' (cedar's %s): dtype %s, the released layout has %s", k->s->names[e->shard], name,
                      internal, dt(t->dtype), any_float ? "F32 or BF16" : dt(d));
  if (!ok_shape) {
    shape_str(got, sizeof got, t->ndim, t->shape);
    problem(c, "%s: tensor '%s' (cedar's %s): shape %s, the plan needs %s", k->s->names[e->shard], name, internal, got, want);
  }
  return ok_dt && ok_shape ? t : NULL;
}

static void to_f32(float *out, const struct st_tensor *t) {
  if (t->dtype == ST_F32) {
    memcpy(out, t->data, t->nbytes);
    return;
  }
  const uint8_t *b = t->data;
  for (uint64_t i = 0; i < t->nbytes / 2; i++) out[i] = ckpt_bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
}

static int64_t tiles(int64_t n) { return (n + CKPT_BLOCK - 1) / CKPT_BLOCK; }

static uint64_t round_align(uint64_t n) { return (n + WEIGHTS_ALIGN - 1) / WEIGHTS_ALIGN * WEIGHTS_ALIGN; }

/* The whole pages of [p, p + n) in a shard's read-only mapping leave this
 * process (a tensor copied out of it: its pages in the mapping are not read
 * again; the hashes were verified before). Advice: on failure they stay. */
static void release_pages(const void *p, size_t n) {
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), b = ((uintptr_t)p + pg - 1) / pg * pg;
  uintptr_t e = ((uintptr_t)p + n) / pg * pg;
  if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
}

/* Fill `out` (s->nbytes, aligned) with internal tensor s, or point *in_place
 * at the mapping (an mmap-tier Engram table: its values, and *scales at its
 * scales). qv (a stored hold; NULL: F32) comes with its held format set
 * (weights_held_fmt): FP8 and BF16 tensors are then used in place (a BF16 one
 * at an odd address copied), the experts copied into one stack at out
 * (elements, then the scales at the next aligned offset), and qv's data
 * and scales point at them; a tensor the file has as F32 sets it to F32.
 * Returns false after a problem. */
static bool fill(struct ckpt *k, struct ctx *c, const struct weights_spec *s, const struct ckpt_map_row *row, int layer,
                 void *out, const void **in_place, const void **scales, struct op_qweight *qv,
                 struct ckpt_load_stats *st) {
  char name[160], name2[160];
  const int64_t *sh = s->shape;
  ckpt_map_name(name, sizeof name, layer, row->released ? row->released : "", 0);
  switch (row->conv) {
    case CKPT_ABSENT:
      problem(c, "%s: %s", s->name, row->note);
      return false;
    case CKPT_FLOAT: {
      const struct st_tensor *t = take(k, c, name, s->name, ST_F32, true, s->ndim, sh);
      if (!t) return false;
      if (qv && qv->fmt == OP_W_BF16 && t->dtype == ST_BF16) { /* held as stored: in place, or a copy when odd */
        bool odd = (uintptr_t)t->data % 2;
        if (odd) memcpy(out, t->data, t->nbytes);
        else *in_place = t->data;
        qv->data = odd ? out : t->data;
        *(odd ? &st->copied_bytes : &st->in_place_bytes) += t->nbytes;
        return true;
      }
      if (qv) qv->fmt = OP_W_F32; /* an F32 tensor in the file: held as F32 */
      if (t->dtype == ST_F32 && (uintptr_t)t->data % WEIGHTS_ALIGN == 0) {
        *in_place = t->data;
        st->in_place_bytes += t->nbytes;
        return true;
      }
      to_f32(out, t);
      if (t->dtype == ST_F32) st->copied_bytes += t->nbytes;
      else st->dequant_bytes += t->nbytes;
      return true;
    }
    case CKPT_FP8: {
      int64_t rows = s->ndim == 3 ? sh[0] * sh[1] : sh[0], cols = s->ndim == 3 ? sh[2] : sh[1];
      int64_t w[2] = {rows, cols}, ws[2] = {tiles(rows), tiles(cols)};
      ckpt_map_name(name2, sizeof name2, layer, row->released, 0);
      char *dot = strrchr(name2, '.');
      snprintf(dot, sizeof name2 - (size_t)(dot - name2), ".scale");
      const struct st_tensor *q = take(k, c, name, s->name, ST_F8_E4M3, false, 2, w);
      const struct st_tensor *sc = take(k, c, name2, s->name, ST_F8_E8M0, false, 2, ws);
      if (!q || !sc) return false;
      if (qv && qv->fmt == OP_W_FP8) { /* held as stored: read in place (bytes: any alignment) */
        qv->data = *in_place = q->data, qv->scale = sc->data;
        st->in_place_bytes += q->nbytes + sc->nbytes;
        return true;
      }
      ckpt_fp8_dequant(out, q->data, sc->data, rows, cols);
      st->dequant_bytes += q->nbytes + sc->nbytes;
      return true;
    }
    case CKPT_EXPERTS: {
      int64_t R = sh[0], rows = sh[1], cols = sh[2];
      if (cols % CKPT_BLOCK) {
        problem(c, "%s: %" PRId64 " columns, not a multiple of %d (released experts carry a scale per %d)", s->name,
                cols, CKPT_BLOCK, CKPT_BLOCK);
        return false;
      }
      int64_t w[2] = {rows, cols / 2}, ws[2] = {rows, cols / CKPT_BLOCK};
      bool ok = true;
      for (int64_t e = 0; e < R; e++) {
        ckpt_map_name(name, sizeof name, layer, row->released, (int)e);
        snprintf(name2, sizeof name2, "%.*sscale", (int)(strlen(name) - 6), name);
        const struct st_tensor *q = take(k, c, name, s->name, ST_I8, false, 2, w);
        const struct st_tensor *sc = take(k, c, name2, s->name, ST_F8_E8M0, false, 2, ws);
        if (!q || !sc) {
          ok = false;
          continue;
        }
        if (qv && qv->fmt == OP_W_FP4) { /* held as stored: the experts' tensors made one stack (copied) */
          uint8_t *d = (uint8_t *)out + round_align((uint64_t)(R * rows * cols / 2));
          memcpy((uint8_t *)out + e * rows * cols / 2, q->data, q->nbytes);
          memcpy(d + e * rows * (cols / CKPT_BLOCK), sc->data, sc->nbytes);
          release_pages(q->data, q->nbytes); /* resident once: the stack, not the copy's source too */
          release_pages(sc->data, sc->nbytes);
          qv->data = out, qv->scale = d;
          st->copied_bytes += q->nbytes + sc->nbytes;
          continue;
        }
        ckpt_fp4_dequant((float *)out + e * rows * cols, q->data, sc->data, rows, cols);
        st->dequant_bytes += q->nbytes + sc->nbytes;
      }
      return ok;
    }
    case CKPT_BIAS2: {
      ckpt_map_name(name2, sizeof name2, layer, row->released2, 0);
      const struct st_tensor *a = take(k, c, name, s->name, ST_F32, true, 1, &sh[1]);
      const struct st_tensor *b = take(k, c, name2, s->name, ST_F32, true, 1, &sh[1]);
      if (!a || !b) return false;
      to_f32(out, a);
      to_f32((float *)out + sh[1], b);
      st->copied_bytes += a->nbytes + b->nbytes;
      return true;
    }
    case CKPT_ENGRAM: {
      int64_t hd = s->row_values, nsc = hd / CKPT_BLOCK, w[2] = {sh[0], hd}, ws[2] = {sh[0], nsc};
      ckpt_map_name(name2, sizeof name2, layer, row->released2, 0);
      const struct st_tensor *q = take(k, c, name, s->name, ST_F8_E4M3, false, 2, w);
      const struct st_tensor *sc = take(k, c, name2, s->name, ST_F8_E8M0, false, 2, ws);
      if (!q || !sc) return false;
      if (scales) { /* the mmap tier: read in place, row by row, by the gather (runtime/model/engram_tier.h) */
        *in_place = q->data, *scales = sc->data;
        st->in_place_bytes += q->nbytes + sc->nbytes;
        return true;
      }
      uint8_t *o = out;
      for (int64_t r = 0; r < sh[0]; r++) {
        memcpy(o + r * (hd + nsc), (const uint8_t *)q->data + r * hd, (size_t)hd);
        memcpy(o + r * (hd + nsc) + hd, (const uint8_t *)sc->data + r * nsc, (size_t)nsc);
      }
      st->copied_bytes += q->nbytes + sc->nbytes;
      return true;
    }
  }
  return false;
}

/* ---- the load ------------------------------------------------------------------- */

static void close_ckpt(struct ckpt *k, bool keep_shards) {
  if (!keep_shards) ckpt_shards_free(k->s);
  free(k->e);
  cJSON_Delete(k->index);
}

/* Arena bytes tensor s may need: F32 (dequantized or copied) without a
 * stored hold; with one, by its held format: nothing for FP8 (in place), a
 * BF16 copy in case it sits at an odd address, the experts' stack. */
static uint64_t reserve(const struct weights_spec *s, bool stored) {
  enum op_wfmt f = stored ? weights_held_fmt(s) : OP_W_F32;
  int64_t cols = s->ndim ? s->shape[s->ndim - 1] : 1, rows = (int64_t)(s->nbytes / 4) / (cols ? cols : 1);
  switch (f) {
    case OP_W_FP8: return 0;
    case OP_W_BF16: return round_align(s->nbytes / 2);
    case OP_W_FP4: return round_align((uint64_t)(rows * cols / 2)) + round_align((uint64_t)(rows * (cols / CKPT_BLOCK)));
    default: return round_align(s->nbytes);
  }
}

int ckpt_load(struct weights *w, const struct plan *p, const char *dir, bool verify, struct weights_problems *pr,
              struct ckpt_load_stats *stats, char *err, size_t err_len) {
  return ckpt_load_held(w, p, dir, verify, false, pr, stats, err, err_len);
}

int ckpt_load_held(struct weights *w, const struct plan *p, const char *dir, bool verify, bool stored,
                   struct weights_problems *pr, struct ckpt_load_stats *stats, char *err, size_t err_len) {
  memset(w, 0, sizeof *w);
  struct ckpt_load_stats local = {0}, *st = stats ? stats : &local;
  memset(st, 0, sizeof *st);
  struct ctx c = {.dir = dir, .pr = pr};
  int rc = weights_list_init(&w->list, p, err, err_len);
  if (rc) return rc;
  /* serving.engram.tier: mmap: the tables stay in the shards (checkpoint.h) */
  bool in_file = w->list.engram_in_file = p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP;
  struct ckpt k = {0};
  open_shards(&k, &c);
  bool opened = !c.count;
  if (opened && verify) verify_hashes(&k, &c, in_file, st);
  const struct weights_list *l = &w->list;
  uint64_t arena = 0;
  for (size_t i = 0; i < l->n; i++)
    if (!(in_file && l->t[i].init == WEIGHTS_ENGRAM_ROWS)) arena += reserve(&l->t[i], stored);
  w->data = cedar_xcalloc(l->n ? l->n : 1, sizeof *w->data);
  if (stored) w->qw = cedar_xcalloc(l->n ? l->n : 1, sizeof *w->qw);
  if (in_file && l->engram_bytes) w->engram_scales = cedar_xcalloc(l->n, sizeof *w->engram_scales);
  if (opened && (arena > SIZE_MAX || posix_memalign(&w->arena, WEIGHTS_ALIGN, (size_t)(arena ? arena : 1)))) {
    w->arena = NULL;
    problem(&c, "cannot allocate %" PRIu64 " bytes for the %s weights", arena, stored ? "copied" : "dequantized");
  }
  if (w->arena && arena >= ((uint64_t)4 << 20)) { /* first touch of the arena in 2 MB pages where THP allows:
                                                  * 512x fewer page faults while dequantizing (docs/PERF.md) */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), b = ((uintptr_t)w->arena + pg - 1) / pg * pg;
    uintptr_t e = ((uintptr_t)w->arena + (size_t)arena) / pg * pg;
    if (e > b) (void)madvise((void *)b, e - b, MADV_HUGEPAGE); /* advice only: failure changes nothing */
  }
  w->arena_bytes = w->arena ? arena : 0;
  uint8_t *at = w->arena;
  for (size_t i = 0; i < l->n && w->arena; i++) {
    int layer;
    const struct ckpt_map_row *row = ckpt_map_find(l->t[i].name, &layer);
    CEDAR_ASSERT_MSG(row, "no checkpoint mapping for %s (add a row to runtime/load/ckpt_map.c)", l->t[i].name);
    const void *in_place = NULL;
    bool split = in_file && l->t[i].init == WEIGHTS_ENGRAM_ROWS;
    const struct weights_spec *s = &l->t[i];
    struct op_qweight *qv = w->qw ? &w->qw[i] : NULL;
    if (qv) { /* its held format and 2-D view; fill points it at the bytes */
      int64_t cols = s->ndim ? s->shape[s->ndim - 1] : 1;
      *qv = (struct op_qweight){weights_held_fmt(s), (int)((int64_t)(s->nbytes / 4) / (cols ? cols : 1)), (int)cols,
                                NULL, NULL};
    }
    if (fill(&k, &c, s, row, layer, at, &in_place, split ? &w->engram_scales[i] : NULL, qv, st))
      w->data[i] = in_place ? in_place : at;
    if (qv && qv->fmt == OP_W_F32) qv->data = w->data[i];
    if (!in_place && !split) at += reserve(s, stored);
  }
  if (opened && w->arena)
    for (size_t i = 0; i < k.n; i++) {
      if (k.e[i].used) continue;
      if (ckpt_is_mtp(k.e[i].name)) st->skipped_mtp++;
      else if (ckpt_is_vision(k.e[i].name)) st->skipped_vision++;
      else problem(&c, "%s: tensor '%s' is in the checkpoint but plan '%s' has no tensor it maps to "
                   "(a mismatch between the plan and the checkpoint; docs/checkpoints.md)",
                   k.s->names[k.e[i].shard], k.e[i].name, p->name);
    }
  st->n_shards = k.s ? k.s->n : 0;
  st->n_tensors = k.n;
  st->file_bytes = k.s ? k.s->file_bytes : 0;
  rc = finish(&c, err, err_len);
  close_ckpt(&k, !rc);
  if (rc) {
    w->shards = NULL;
    weights_free(w);
    return rc;
  }
  w->shards = k.s;
  w->copied_bytes = st->copied_bytes;
  if (st->skipped_mtp) LOG_WARN("note: " "%s: %zu mtp.* tensors skipped (plan '%s' drafts with model.dspark.blocks = %d)", dir,
                                st->skipped_mtp, p->name, p->model.dspark_blocks);
  if (st->skipped_vision) LOG_WARN("note: " "%s: %zu vision tensors skipped (no vision stage yet)", dir, st->skipped_vision);
  return 0;
}

/* ---- the plan ----------------------------------------------------------------------- */

int ckpt_plan(const char *dir, const char *plan_path, struct plan *p, struct weights_problems *pr, char *err,
              size_t err_len) {
  char path[4096];
  struct ckpt_config cfg;
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_CONFIG);
  int rc = ckpt_config_read(path, &cfg, err, err_len);
  if (rc) return rc;
  struct plan imported;
  rc = ckpt_config_plan(&cfg, "imported", &imported, err, err_len);
  if (rc || !plan_path) {
    if (!rc) *p = imported;
    return rc;
  }
  struct plan_diags d = {0};
  rc = plan_load(plan_path, p, &d);
  if (rc) {
    snprintf(err, err_len, "%s: the plan did not load%s%s", plan_path, d.n ? ": " : "", d.n ? d.d[0].msg : "");
    plan_diags_free(&d);
    plan_free(&imported);
    return rc;
  }
  char **msgs;
  size_t n = ckpt_plan_compare(p, &imported, &msgs);
  struct ctx c = {.dir = dir, .pr = pr};
  for (size_t i = 0; i < n; i++) problem(&c, "plan %s vs checkpoint: %s", plan_path, msgs[i]);
  ckpt_msgs_free(msgs, n);
  plan_free(&imported);
  rc = finish(&c, err, err_len);
  if (rc) plan_free(p);
  return rc;
}

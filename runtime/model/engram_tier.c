/* engram_tier.c: the Engram tables' tier (engram_tier.h): the tables file of
 * synthetic weights (write once, open and check), a checkpoint's tables left
 * in its shards, the gather over either layout, the prefetch's page hint,
 * and eviction for cold measurements. */
#define _DEFAULT_SOURCE /* madvise */
#include "runtime/model/engram_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/check.h"
#include "base/log.h"
#include "ops/engram.h"
#include "ops/formats.h"
#include "runtime/load/checkpoint.h"

#define TAG_KEY "cedar.engram.tables"
#define TAG_VALUE "1"

static size_t page_size(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

/* [begin, end) of the pages covering [p, p + n). */
static void page_span(const void *p, size_t n, uintptr_t *b, size_t *len) {
  size_t ps = page_size();
  uintptr_t a = (uintptr_t)p, e = a + n;
  *b = a & ~(uintptr_t)(ps - 1);
  *len = ((e + ps - 1) & ~(uintptr_t)(ps - 1)) - *b;
}

static void willneed(const uint8_t *base, size_t width, const int64_t *rows, int n) {
  for (int i = 0; i < n; i++) {
    uintptr_t b;
    size_t len;
    page_span(base + (size_t)rows[i] * width, width, &b, &len);
    (void)madvise((void *)b, len, MADV_WILLNEED); /* a hint: failure only loses the head start */
  }
}

void rt_engram_willneed(const struct rt_engram_view *v, const int64_t *rows, int n) {
  size_t hd = (size_t)v->head_dim, ns = hd / (size_t)v->block;
  if (!v->scales) {
    willneed(v->rows, hd + ns, rows, n);
    return;
  }
  willneed(v->rows, hd, rows, n);
  willneed(v->scales, ns, rows, n);
}

void rt_engram_gather(float *e, const struct rt_engram_view *v, const int64_t *rows, int n, int n_tables) {
  if (!v->scales) {
    op_engram_gather(e, v->rows, rows, n, n_tables, v->head_dim, v->block, v->n_rows);
    return;
  }
  size_t hd = (size_t)v->head_dim, ns = hd / (size_t)v->block, rb = op_engram_row_bytes(v->head_dim, v->block);
  CEDAR_ASSERT_MSG(rb == hd + ns, "engram row: head_dim %d, block %d", v->head_dim, v->block);
  /* the row as the memory tier holds it (checkpoint.c: values, then scales),
   * unpacked by the same op_fp8_unpack: the same bits by construction */
  uint8_t *row = cedar_xmalloc(rb);
  for (size_t j = 0; j < (size_t)n * n_tables; j++) {
    int64_t r = rows[j];
    CEDAR_ASSERT_MSG(r >= 0 && r < v->n_rows, "engram row %lld outside the table (%lld rows)", (long long)r,
                     (long long)v->n_rows);
    memcpy(row, v->rows + (size_t)r * hd, hd);
    memcpy(row + hd, v->scales + (size_t)r * ns, ns);
    op_fp8_unpack(e + j * hd, row, v->head_dim, v->block, OP_SCALE_E8M0);
  }
  free(row);
}

static void advise_random(const void *p, uint64_t n) {
  uintptr_t b;
  size_t len;
  page_span(p, (size_t)n, &b, &len);
  (void)madvise((void *)b, len, MADV_RANDOM);
}

/* The tables file's default path for these weights (synthetic). */
static void rt_engram_tier_default_path(char *out, size_t len, const struct weights *w) {
  const char *dir = getenv("TMPDIR");
  char fp[17];
  weights_fingerprint_hex(w->list.fingerprint, fp);
  snprintf(out, len, "%s/cedar-engram-%s-s%" PRIu64 ".safetensors", dir && *dir ? dir : "/tmp", fp, w->seed);
}

/* Write the synthetic tables of w to path (atomically: st_write). */
static int write_tables(const char *path, const struct weights *w, char *err, size_t err_len) {
  const struct weights_list *l = &w->list;
  struct st_tensor *ts = cedar_xcalloc(l->n ? l->n : 1, sizeof *ts);
  size_t n = 0;
  int rc = CEDAR_OK;
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    if (s->init != WEIGHTS_ENGRAM_ROWS) continue;
    void *buf = malloc(s->nbytes ? s->nbytes : 1);
    if (!buf) {
      rc = CEDAR_ENOMEM;
      snprintf(err, err_len, "%s: cannot allocate %" PRIu64 " bytes to write %s", path, s->nbytes, s->name);
      break;
    }
    weights_fill(buf, s, w->seed);
    ts[n] = (struct st_tensor){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .nbytes = s->nbytes, .data = buf};
    memcpy(ts[n].shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
    n++;
  }
  if (!rc) {
    char fp[17], seed[24];
    weights_fingerprint_hex(l->fingerprint, fp);
    snprintf(seed, sizeof seed, "%" PRIu64, w->seed);
    struct st_meta meta[] = {{TAG_KEY, TAG_VALUE}, {"cedar.fingerprint", fp}, {"cedar.seed", seed},
                             {"cedar.plan", l->plan_name}};
    rc = st_write(path, ts, n, meta, sizeof meta / sizeof *meta, err, err_len);
  }
  for (size_t i = 0; i < n; i++) free((void *)ts[i].data);
  free(ts);
  return rc;
}

#define FIX "; delete it to have cedar write it again, or set serving.engram.file to another path"

/* Open path and check it holds exactly w's tables (engram_tier.h). */
static int open_tables(struct rt_engram_tier *t, const char *path, const struct weights *w, char *err,
                       size_t err_len) {
  const struct weights_list *l = &w->list;
  int rc = st_open(path, &t->file, err, err_len);
  if (rc) {
    size_t k = strlen(err);
    if (k < err_len) snprintf(err + k, err_len - k, " (the Engram tables file of serving.engram.tier: mmap)" FIX);
    return rc;
  }
  char fp[17], seed[24];
  weights_fingerprint_hex(l->fingerprint, fp);
  snprintf(seed, sizeof seed, "%" PRIu64, w->seed);
  const char *tag = st_meta_get(t->file, TAG_KEY), *got_fp = st_meta_get(t->file, "cedar.fingerprint");
  const char *got_seed = st_meta_get(t->file, "cedar.seed"), *plan = st_meta_get(t->file, "cedar.plan");
  if (!tag || strcmp(tag, TAG_VALUE))
    return snprintf(err, err_len, "%s: not a cedar Engram tables file (no %s = %s in its metadata)" FIX, path, TAG_KEY,
                    TAG_VALUE), CEDAR_EFORMAT;
  if (!got_fp || strcmp(got_fp, fp))
    return snprintf(err, err_len, "%s: Engram tables of other weights (fingerprint %s, plan '%s'; these weights "
                    "need %s, plan '%s')" FIX, path, got_fp ? got_fp : "none", plan ? plan : "?", fp, l->plan_name),
           CEDAR_EFORMAT;
  if (!got_seed || strcmp(got_seed, seed))
    return snprintf(err, err_len, "%s: Engram tables of seed %s, the run uses seed %s" FIX, path,
                    got_seed ? got_seed : "none", seed), CEDAR_EFORMAT;
  size_t want = 0;
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    if (s->init != WEIGHTS_ENGRAM_ROWS) continue;
    want++;
    const struct st_tensor *x = st_find(t->file, s->name);
    if (!x)
      return snprintf(err, err_len, "%s: no tensor %s" FIX, path, s->name), CEDAR_EFORMAT;
    if (x->dtype != s->dtype || x->ndim != 2 || x->shape[0] != s->shape[0] || x->shape[1] != s->shape[1])
      return snprintf(err, err_len, "%s: %s is %s (%" PRId64 ", %" PRId64 "), the plan needs U8 (%" PRId64
                      ", %" PRId64 ")" FIX, path, s->name, st_dtype_name(x->dtype), x->shape[0],
                      x->ndim > 1 ? x->shape[1] : 0, s->shape[0], s->shape[1]), CEDAR_EFORMAT;
  }
  if (st_count(t->file) != want)
    return snprintf(err, err_len, "%s: %zu tensors, the plan's Engram tables are %zu" FIX, path, st_count(t->file),
                    want), CEDAR_EFORMAT;
  return CEDAR_OK;
}

int rt_engram_tier_open(struct rt_engram_tier *t, const struct plan *p, struct weights *w, char *err,
                        size_t err_len) {
  memset(t, 0, sizeof *t);
  t->mmap = p->serving.engram_tier == PLAN_ENGRAM_TIER_MMAP;
  const struct weights_list *l = &w->list;
  for (size_t i = 0; i < l->n; i++)
    if (l->t[i].init == WEIGHTS_ENGRAM_ROWS) t->n_tables++, t->table_bytes += l->t[i].nbytes;
  if (!t->mmap || !t->n_tables) return CEDAR_OK;
  if (p->serving.engram_file && (w->shards || w->file))
    LOG_WARN("serving.engram.file %s is not read: with %s the tables are that file's", p->serving.engram_file,
             w->shards ? "--model" : "--weights");
  if (w->shards) { /* a checkpoint: ckpt_load left each table's two tensors in the shards' mappings */
    CEDAR_ASSERT(w->engram_scales);
    t->path = cedar_xstrdup(w->shards->dir);
    for (size_t i = 0; i < l->n; i++) {
      const struct weights_spec *s = &l->t[i];
      if (s->init != WEIGHTS_ENGRAM_ROWS) continue;
      CEDAR_ASSERT(w->data[i] && w->engram_scales[i]);
      advise_random(w->data[i], (uint64_t)s->shape[0] * (uint64_t)s->row_values);
      advise_random(w->engram_scales[i], (uint64_t)s->shape[0] * (uint64_t)(s->row_values / WEIGHTS_ENGRAM_BLOCK));
    }
    return CEDAR_OK;
  }
  if (w->file) { /* loaded: weights_load left the tables in the file's mapping */
    t->path = cedar_xstrdup("the weights file");
  } else {
    char def[4096];
    rt_engram_tier_default_path(def, sizeof def, w);
    const char *path = p->serving.engram_file ? p->serving.engram_file : def;
    t->path = cedar_xstrdup(path);
    if (access(path, F_OK) && errno == ENOENT) {
      int rc = write_tables(path, w, err, err_len);
      if (rc) return rt_engram_tier_close(t), rc;
      t->wrote = true;
    }
    int rc = open_tables(t, path, w, err, err_len);
    if (rc) return rt_engram_tier_close(t), rc;
    for (size_t i = 0; i < l->n; i++)
      if (l->t[i].init == WEIGHTS_ENGRAM_ROWS) w->data[i] = st_find(t->file, l->t[i].name)->data;
  }
  for (size_t i = 0; i < l->n; i++)
    if (l->t[i].init == WEIGHTS_ENGRAM_ROWS) advise_random(w->data[i], l->t[i].nbytes);
  return CEDAR_OK;
}

void rt_engram_tier_close(struct rt_engram_tier *t) {
  st_close(t->file);
  free(t->path);
  memset(t, 0, sizeof *t);
}

static bool drop(const void *p, uint64_t n) {
  uintptr_t b;
  size_t len;
  page_span(p, (size_t)n, &b, &len);
  return madvise((void *)b, len, MADV_DONTNEED) == 0;
}

/* A checkpoint's tables, in either tier: their tensors' pages in the
 * shards' mappings, then each shard that holds one from the page cache. */
static uint64_t evict_shards(const struct ckpt_shards *s) {
  uint64_t n = 0;
  for (size_t i = 0; i < s->n; i++) {
    bool any = false;
    for (size_t j = 0; j < st_count(s->files[i]); j++) {
      const struct st_tensor *x = st_tensor_at(s->files[i], j);
      if (!ckpt_is_engram_table(x->name)) continue;
      any = true;
      if (drop(x->data, x->nbytes)) n += x->nbytes;
    }
    char path[4096];
    int fd = any && snprintf(path, sizeof path, "%s/%s", s->dir, s->names[i]) < (int)sizeof path
                 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
  }
  return n;
}

uint64_t rt_engram_tier_evict(const struct rt_engram_tier *t, const struct weights *w) {
  if (w->shards) return evict_shards(w->shards);
  if (!t->mmap) return 0;
  uint64_t n = 0;
  const struct weights_list *l = &w->list;
  for (size_t i = 0; i < l->n; i++) {
    if (l->t[i].init != WEIGHTS_ENGRAM_ROWS) continue;
    if (drop(w->data[i], l->t[i].nbytes)) n += l->t[i].nbytes;
  }
  /* the page cache too, for the file we know the path of */
  if (t->file && t->path) {
    int fd = open(t->path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      close(fd);
    }
  }
  return n;
}

/* ckpt_write.c: `cedar weights init --layout released`: a plan's synthetic
 * weights written in exactly the released DeepSeek-V4.1 layout (config.json,
 * sharded safetensors, model.safetensors.index.json), each tensor quantized
 * to its released dtype through the mapping table (ckpt_map.c), each shard
 * with per-tensor content hashes; optionally the dequantized values as a
 * cedar weights file for bit-exact comparison. See checkpoint.h.
 */
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "runtime/load/checkpoint.h"

struct out_tensor {
  struct st_tensor t;
  void *own;  /* buffer to free, or NULL when t.data is borrowed */
};

struct outs {
  struct out_tensor *v;
  size_t n, cap;
};

static struct out_tensor *push(struct outs *o, const char *name, enum st_dtype d, int nd, int64_t d0, int64_t d1) {
  if (o->n == o->cap) o->v = cedar_xrealloc(o->v, (o->cap = o->cap ? 2 * o->cap : 256) * sizeof *o->v);
  struct out_tensor *t = &o->v[o->n++];
  *t = (struct out_tensor){.t = {.name = cedar_xstrdup(name), .dtype = d, .ndim = nd, .shape = {d0, d1}}};
  t->t.nbytes = st_dtype_size(d) * (uint64_t)d0 * (uint64_t)(nd > 1 ? d1 : 1);
  t->own = t->t.nbytes ? cedar_xmalloc(t->t.nbytes) : NULL;
  t->t.data = t->own;
  return t;
}

static int64_t tiles(int64_t n) { return (n + CKPT_BLOCK - 1) / CKPT_BLOCK; }

/* The released tensors of internal tensor s (values x), and its dequantized
 * values into dq (s->nbytes) when dq is not NULL. */
static int convert(struct outs *o, const struct weights_spec *s, const struct ckpt_map_row *row, int layer,
                   const void *x, void *dq, char *err, size_t len) {
  char name[160], name2[160];
  const int64_t *sh = s->shape;
  if (row->conv != CKPT_ABSENT) ckpt_map_name(name, sizeof name, layer, row->released, 0);
  switch (row->conv) {
    case CKPT_ABSENT: return snprintf(err, len, "%s: %s", s->name, row->note), CEDAR_EINVAL;
    case CKPT_FLOAT: {
      int64_t n = (int64_t)(s->nbytes / 4);
      struct out_tensor *t = push(o, name, row->dtype, s->ndim, sh[0], sh[1]);
      if (row->dtype == ST_F32) {
        memcpy(t->own, x, s->nbytes);
        if (dq) memcpy(dq, x, s->nbytes);
        return 0;
      }
      uint8_t *b = t->own;
      for (int64_t i = 0; i < n; i++) {
        uint16_t h = ckpt_f32_to_bf16(((const float *)x)[i]);
        b[2 * i] = (uint8_t)h, b[2 * i + 1] = (uint8_t)(h >> 8);
        if (dq) ((float *)dq)[i] = ckpt_bf16_to_f32(h);
      }
      return 0;
    }
    case CKPT_FP8: {
      int64_t rows = s->ndim == 3 ? sh[0] * sh[1] : sh[0], cols = s->ndim == 3 ? sh[2] : sh[1];
      snprintf(name2, sizeof name2, "%.*sscale", (int)(strlen(name) - 6), name);
      struct out_tensor *q = push(o, name, ST_F8_E4M3, 2, rows, cols);
      struct out_tensor *sc = push(o, name2, ST_F8_E8M0, 2, tiles(rows), tiles(cols));
      q = sc - 1; /* the second push may have moved the array (realloc) */
      ckpt_fp8_quant(q->own, sc->own, x, rows, cols);
      if (dq) ckpt_fp8_dequant(dq, q->own, sc->own, rows, cols);
      return 0;
    }
    case CKPT_EXPERTS: {
      int64_t rows = sh[1], cols = sh[2];
      if (cols % CKPT_BLOCK)
        return snprintf(err, len, "%s: %" PRId64 " columns, not a multiple of %d: the released FP4 experts carry one "
                        "scale per %d columns", s->name, cols, CKPT_BLOCK, CKPT_BLOCK), CEDAR_EINVAL;
      for (int64_t e = 0; e < sh[0]; e++) {
        ckpt_map_name(name, sizeof name, layer, row->released, (int)e);
        snprintf(name2, sizeof name2, "%.*sscale", (int)(strlen(name) - 6), name);
        struct out_tensor *q = push(o, name, ST_I8, 2, rows, cols / 2);
        struct out_tensor *sc = push(o, name2, ST_F8_E8M0, 2, rows, cols / CKPT_BLOCK);
        q = sc - 1; /* the second push may have moved the array (realloc) */
        const float *xe = (const float *)x + e * rows * cols;
        ckpt_fp4_quant(q->own, sc->own, xe, rows, cols);
        if (dq) ckpt_fp4_dequant((float *)dq + e * rows * cols, q->own, sc->own, rows, cols);
      }
      return 0;
    }
    case CKPT_BIAS2: {
      ckpt_map_name(name2, sizeof name2, layer, row->released2, 0);
      push(o, name, ST_F32, 1, sh[1], 0);
      struct out_tensor *b = push(o, name2, ST_F32, 1, sh[1], 0), *a = b - 1; /* after both pushes: realloc moves */
      memcpy(a->own, x, a->t.nbytes);
      memcpy(b->own, (const float *)x + sh[1], b->t.nbytes);
      if (dq) memcpy(dq, x, s->nbytes);
      return 0;
    }
    case CKPT_ENGRAM: {
      int64_t hd = s->row_values, nsc = hd / CKPT_BLOCK;
      ckpt_map_name(name2, sizeof name2, layer, row->released2, 0);
      push(o, name, ST_F8_E4M3, 2, sh[0], hd);
      struct out_tensor *sc = push(o, name2, ST_F8_E8M0, 2, sh[0], nsc), *q = sc - 1; /* after both pushes: realloc moves */
      const uint8_t *in = x;
      for (int64_t r = 0; r < sh[0]; r++) {
        memcpy((uint8_t *)q->own + r * hd, in + r * (hd + nsc), (size_t)hd);
        memcpy((uint8_t *)sc->own + r * nsc, in + r * (hd + nsc) + hd, (size_t)nsc);
      }
      if (dq) memcpy(dq, x, s->nbytes);
      return 0;
    }
  }
  return CEDAR_EINVAL;
}

/* Write text to dir/name atomically (base/file.h: temporary, every write,
 * fsync and close checked, rename; the temporary removed on failure). */
static int write_text(const char *dir, const char *name, const char *text, char *err, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct cedar_out o;
  if (cedar_out_open(&o, path, err, len)) return CEDAR_EIO;
  cedar_out_write(&o, text, strlen(text));
  cedar_out_write(&o, "\n", 1);
  return cedar_out_commit(&o, err, len) ? CEDAR_EIO : 0;
}

static int write_shards(struct outs *o, const char *dir, uint64_t shard_bytes, char *err, size_t len) {
  size_t *shard = cedar_xcalloc(o->n + 1, sizeof *shard);
  size_t n_shards = o->n ? 1 : 0;
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < o->n; i++) {
    if (shard_bytes && cur && cur + o->v[i].t.nbytes > shard_bytes) n_shards++, cur = 0;
    cur += o->v[i].t.nbytes;
    total += o->v[i].t.nbytes;
    shard[i] = n_shards - 1;
  }
  cJSON *index = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(index, "metadata");
  cJSON_AddNumberToObject(md, "total_size", (double)total);
  cJSON *wm = cJSON_AddObjectToObject(index, "weight_map");
  struct st_tensor *ts = cedar_xcalloc(o->n + 1, sizeof *ts);
  struct st_meta *meta = cedar_xcalloc(o->n + 2, sizeof *meta);
  char (*keys)[200] = cedar_xcalloc(o->n + 1, sizeof *keys);
  char (*vals)[17] = cedar_xcalloc(o->n + 1, sizeof *vals);
  int rc = 0;
  for (size_t k = 0, i = 0; k < n_shards && !rc; k++) {
    char file[64], path[4096];
    if (shard_bytes) snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", k + 1, n_shards);
    else snprintf(file, sizeof file, "%s", CKPT_SINGLE);
    size_t nt = 0, nm = 0;
    meta[nm++] = (struct st_meta){"format", "pt"};
    for (; i < o->n && shard[i] == k; i++) {
      ts[nt++] = o->v[i].t;
      weights_hash_key(keys[i], sizeof keys[i], o->v[i].t.name);
      weights_hash_hex(vals[i], o->v[i].t.data, o->v[i].t.nbytes);
      meta[nm++] = (struct st_meta){keys[i], vals[i]};
      cJSON_AddStringToObject(wm, o->v[i].t.name, file);
    }
    snprintf(path, sizeof path, "%s/%s", dir, file);
    rc = st_write(path, ts, nt, meta, nm, err, len);
  }
  if (!rc && shard_bytes) {
    char *text = cJSON_Print(index);
    rc = write_text(dir, CKPT_INDEX, text, err, len);
    free(text);
  }
  cJSON_Delete(index);
  free(vals);
  free(keys);
  free(meta);
  free(ts);
  free(shard);
  return rc;
}

/* ---- replacing the set --------------------------------------------------------- */

/* Whether name is a checkpoint weights file: model.safetensors or
 * model-NNNNN-of-MMMMM.safetensors. */
static bool ckpt_file_name(const char *name) {
  unsigned a, b;
  int end = 0;
  if (!strcmp(name, CKPT_SINGLE)) return true;
  return sscanf(name, "model-%5u-of-%5u.safetensors%n", &a, &b, &end) == 2 && end > 0 && !name[end];
}

/* Remove stage and what is in it (files only: the writer made it). */
static void drop_stage(const char *stage) {
  DIR *d = opendir(stage);
  struct dirent *e;
  char path[4096]; /* stage: under 3400 bytes, a name under 256 */
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') snprintf(path, sizeof path, "%s/%s", stage, e->d_name), unlink(path);
  if (d) closedir(d);
  rmdir(stage);
}

/* Drop dir's staging folders left by writers that were killed (their pid no
 * longer runs on this machine). A live writer's, or one whose pid another
 * process now has, is left as it is. */
static void drop_dead_stages(const char *dir) {
  static const char prefix[] = ".cedar-ckpt.tmp.";
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[3400];
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, prefix, sizeof prefix - 1)) continue;
    char *end;
    long pid = strtol(e->d_name + sizeof prefix - 1, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) drop_stage(path);
  }
  if (d) closedir(d);
}

/* Rename stage/name to dir/name. */
static int move_in(const char *stage, const char *dir, const char *name, char *err, size_t len) {
  char from[3400], to[3400]; /* stage and dir: under 3072 bytes (ckpt_write) */
  snprintf(from, sizeof from, "%s/%s", stage, name);
  snprintf(to, sizeof to, "%s/%s", dir, name);
  if (rename(from, to)) return snprintf(err, len, "%s: cannot move in: %s", to, strerror(errno)), CEDAR_EIO;
  return 0;
}

/* Move the complete new set from stage into dir, so dir never holds two
 * checkpoints' files as one set: the old index goes first (from then on
 * the old shards are no checkpoint), every weights file of the old set that
 * the new one does not have is removed, the new weights files are renamed
 * in (each rename replaces a file whole; renames in one file system need no
 * space, so a full disk cannot stop this half way), then config.json, and
 * the new index last. A crash in between leaves a sharded set without an
 * index (refused), or one whole old or new model.safetensors beside the old
 * or new config.json; never an index over a mix of shards. Files that are
 * not a checkpoint's are kept. */
static int commit_stage(const char *stage, const char *dir, char *err, size_t len) {
  char from[3400], to[3400];
  snprintf(to, sizeof to, "%s/%s", dir, CKPT_INDEX);
  if (unlink(to) && errno != ENOENT) return snprintf(err, len, "%s: cannot remove: %s", to, strerror(errno)), CEDAR_EIO;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    struct stat st;
    snprintf(from, sizeof from, "%s/%s", stage, e->d_name);
    snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
    if (ckpt_file_name(e->d_name) && lstat(from, &st) != 0 && unlink(to) && errno != ENOENT) {
      closedir(d);
      return snprintf(err, len, "%s: cannot remove the old checkpoint's file: %s", to, strerror(errno)), CEDAR_EIO;
    }
  }
  if (d) closedir(d);
  if (!(d = opendir(stage))) return snprintf(err, len, "%s: cannot read: %s", stage, strerror(errno)), CEDAR_EIO;
  int rc = 0;
  while (!rc && (e = readdir(d)))
    if (ckpt_file_name(e->d_name)) rc = move_in(stage, dir, e->d_name, err, len);
  closedir(d);
  snprintf(from, sizeof from, "%s/%s", stage, CKPT_INDEX);
  bool index = access(from, F_OK) == 0;
  if (!rc) rc = move_in(stage, dir, CKPT_CONFIG, err, len);
  if (!rc && index) rc = move_in(stage, dir, CKPT_INDEX, err, len);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the renames reach the disk */
  if (dfd >= 0) fsync(dfd), close(dfd);
  return rc;
}

int ckpt_write(const struct weights *w, const struct plan *p, const char *dir, uint64_t shard_bytes,
               const char *dequant_path, char *err, size_t len) {
  struct ckpt_config cfg;
  int rc = ckpt_config_from_plan(p, &cfg, err, len);
  if (rc) return rc;
  if (mkdir(dir, 0755) && errno != EEXIST) return snprintf(err, len, "%s: cannot create: %s", dir, strerror(errno)), CEDAR_EIO;
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return snprintf(err, len, "%s: not a directory", dir), CEDAR_EINVAL;
  const struct weights_list *l = &w->list;
  struct weights dq = {0};
  if (dequant_path) {
    dq.data = cedar_xcalloc(l->n + 1, sizeof *dq.data);
    dq.list = *l; /* borrowed: only weights_save reads it */
  }
  void **dq_buf = cedar_xcalloc(l->n + 1, sizeof *dq_buf);
  struct outs o = {0};
  for (size_t i = 0; i < l->n && !rc; i++) {
    int layer;
    const struct ckpt_map_row *row = ckpt_map_find(l->t[i].name, &layer);
    CEDAR_ASSERT_MSG(row, "no checkpoint mapping for %s (add a row to runtime/load/ckpt_map.c)", l->t[i].name);
    if (dequant_path && posix_memalign(&dq_buf[i], WEIGHTS_ALIGN, l->t[i].nbytes ? l->t[i].nbytes : 1))
      dq_buf[i] = NULL, rc = CEDAR_ENOMEM, snprintf(err, len, "out of memory");
    if (!rc) rc = convert(&o, &l->t[i], row, layer, w->data[i], dq_buf[i], err, len);
    if (dequant_path) dq.data[i] = dq_buf[i];
  }
  /* the whole set is written beside dir's files first, then moved in (commit_stage) */
  char stage[3072] = "";
  if (!rc && snprintf(stage, sizeof stage, "%s/.cedar-ckpt.tmp.%d", dir, (int)getpid()) >= (int)sizeof stage)
    rc = (snprintf(err, len, "%s: the directory's path is too long", dir), CEDAR_EINVAL);
  if (!rc) drop_stage(stage), drop_dead_stages(dir); /* a killed writer's, of this pid or of a dead one */
  if (!rc && mkdir(stage, 0755))
    rc = (snprintf(err, len, "%s: cannot create: %s", stage, strerror(errno)), CEDAR_EIO);
  if (!rc) rc = write_shards(&o, stage, shard_bytes, err, len);
  if (!rc) {
    char *json;
    rc = ckpt_config_json(&cfg, &json);
    if (!rc) rc = write_text(stage, CKPT_CONFIG, json, err, len);
    free(json);
  }
  if (!rc) rc = commit_stage(stage, dir, err, len);
  if (stage[0] && strlen(dir) + 40 < sizeof stage) drop_stage(stage);
  if (!rc && dequant_path) rc = weights_save(&dq, dequant_path, err, len);
  for (size_t i = 0; i < o.n; i++) {
    free((char *)o.v[i].t.name);
    free(o.v[i].own);
  }
  free(o.v);
  for (size_t i = 0; i < l->n; i++) free(dq_buf[i]);
  free(dq_buf);
  free(dq.data);
  return rc;
}

int ckpt_record_hashes(const char *dir, size_t *added, char *err, size_t len) {
  char path[4096];
  *added = 0;
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX);
  struct stat st;
  if (stat(path, &st)) {
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_SINGLE);
    return weights_hash_record(path, added, err, len);
  }
  /* the shard names come from a checked load (ckpt_load), so they are plain names */
  size_t n;
  char *text = cedar_read_all(path, CEDAR_TEXT_MAX, &n, err, len); /* base/file.h: no FIFO, bounded */
  if (!text) return CEDAR_EIO;
  cJSON *idx = cJSON_ParseWithLength(text, n);
  free(text);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map"), *it;
  int rc = cJSON_IsObject(wm) ? 0 : (snprintf(err, len, "%s: no weight_map", path), CEDAR_EFORMAT);
  /* each shard once (a second pass over a shard would add nothing anyway) */
  cJSON *done = cJSON_CreateObject();
  cJSON_ArrayForEach(it, wm) {
    if (rc || !cJSON_IsString(it) || strchr(it->valuestring, '/') || cJSON_GetObjectItemCaseSensitive(done, it->valuestring))
      continue;
    cJSON_AddTrueToObject(done, it->valuestring);
    char shard[4096];
    size_t a = 0;
    snprintf(shard, sizeof shard, "%s/%s", dir, it->valuestring);
    rc = weights_hash_record(shard, &a, err, len);
    *added += a;
  }
  cJSON_Delete(done);
  cJSON_Delete(idx);
  return rc;
}

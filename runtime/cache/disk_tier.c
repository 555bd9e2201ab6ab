/* disk_tier.c: block files of the persistent prefix-cache tier (disk_tier.h). */
#include "runtime/cache/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/check.h"
#include "base/file.h"
#include "base/log.h"

/* Fixed part of the header, then n_parts records, then the header checksum. */
struct dt_head {
  char magic[8];
  uint32_t version, header_bytes;
  uint64_t fingerprint, key, parent;
  int64_t index;
  int64_t created;
  uint32_t n_parts, pad;
};
struct dt_rec {
  uint32_t layer, ratio, n_entries, entry_bytes;
  uint64_t checksum;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mkdir -p */
static int make_dirs(const char *dir) {
  char buf[4096];
  if (snprintf(buf, sizeof(buf), "%s", dir) >= (int)sizeof(buf)) return ENAMETOOLONG;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) && errno != EEXIST) return errno;
    *p = '/';
  }
  if (mkdir(buf, 0755) && errno != EEXIST) return errno;
  return 0;
}

/* Temporary files a killed writer left behind, older than a few minutes
 * (a live writer's is seconds old). */
static void remove_stale_tmp(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    if (!strstr(e->d_name, ".blk.tmp.")) continue;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (!stat(path, &st) && now - st.st_mtime > 600) unlink(path);
  }
  closedir(d);
}

int dt_init(struct dt_tier *t, const char *dir, uint64_t fingerprint, double ttl_hours, char *err, size_t err_len) {
  memset(t, 0, sizeof(*t));
  int e = make_dirs(dir);
  if (e) {
    snprintf(err, err_len, "cannot create the cache directory %s: %s", dir, strerror(e));
    return CEDAR_EIO;
  }
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
    snprintf(err, err_len, "%s is not a directory", dir);
    return CEDAR_EIO;
  }
  remove_stale_tmp(dir);
  t->dir = cedar_xstrdup(dir);
  t->fingerprint = fingerprint;
  t->ttl_s = ttl_hours * 3600.0;
  return 0;
}

void dt_free(struct dt_tier *t) {
  free(t->dir);
  memset(t, 0, sizeof(*t));
}

void dt_block_free(struct dt_block *b) {
  for (int i = 0; i < b->n_parts; i++) free(b->part[i].bytes);
  memset(b, 0, sizeof(*b));
}

static void path_of(const struct dt_tier *t, uint64_t key, char *buf, size_t len) {
  snprintf(buf, len, "%s/%016llx.blk", t->dir, (unsigned long long)key);
}

static bool write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

int dt_write(struct dt_tier *t, const struct dt_block *b, char *err, size_t err_len) {
  char path[4096], tmp[4200];
  path_of(t, b->key, path, sizeof(path));
  snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path); /* unique per writer, same directory */
  struct dt_head h;
  memset(&h, 0, sizeof(h));
  memcpy(h.magic, DT_MAGIC, 8);
  h.version = DT_VERSION;
  h.header_bytes = (uint32_t)(sizeof(h) + (size_t)b->n_parts * sizeof(struct dt_rec) + sizeof(uint64_t));
  h.fingerprint = t->fingerprint;
  h.key = b->key;
  h.parent = b->parent;
  h.index = b->index;
  h.created = (int64_t)time(NULL);
  h.n_parts = (uint32_t)b->n_parts;
  struct dt_rec rec[64];
  XXH3_state_t *hs = XXH3_createState();
  XXH3_64bits_reset(hs);
  XXH3_64bits_update(hs, &h, sizeof(h));
  for (int i = 0; i < b->n_parts; i++) {
    const struct dt_part *p = &b->part[i];
    rec[i] = (struct dt_rec){(uint32_t)p->layer, (uint32_t)p->ratio, (uint32_t)p->n_entries, (uint32_t)p->entry_bytes,
                             XXH3_64bits(p->bytes, (size_t)p->n_entries * p->entry_bytes)};
    XXH3_64bits_update(hs, &rec[i], sizeof(rec[i]));
  }
  uint64_t hsum = XXH3_64bits_digest(hs);
  XXH3_freeState(hs);
  int fd = mkstemp(tmp);
  if (fd >= 0) fchmod(fd, 0644);
  bool ok = fd >= 0 && write_all(fd, &h, sizeof(h)) && write_all(fd, rec, sizeof(rec[0]) * (size_t)b->n_parts) &&
            write_all(fd, &hsum, sizeof(hsum));
  int64_t bytes = h.header_bytes;
  for (int i = 0; ok && i < b->n_parts; i++) {
    size_t n = (size_t)b->part[i].n_entries * b->part[i].entry_bytes;
    ok = write_all(fd, b->part[i].bytes, n);
    bytes += (int64_t)n;
  }
  ok = ok && fsync(fd) == 0;
  if (fd >= 0 && close(fd)) ok = false;
  ok = ok && rename(tmp, path) == 0;
  if (ok) {
    int dfd = open(t->dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    t->stats.written++;
    t->stats.bytes_written += bytes;
    return 0;
  }
  snprintf(err, err_len, "writing %s failed: %s", path, strerror(errno));
  unlink(tmp);
  t->stats.write_failed++;
  return CEDAR_EIO;
}

/* A file that cannot be used: warn, remove it, count it in *count. */
static int drop(const char *path, const char *why, FILE *f, struct dt_block *out, int64_t *count) {
  LOG_WARN("prefix cache: %s: %s; the block is recomputed", path, why);
  if (f) fclose(f);
  dt_block_free(out);
  unlink(path);
  (*count)++;
  return CEDAR_EFORMAT;
}

static int reject(struct dt_tier *t, const char *path, const char *why, FILE *f, struct dt_block *out) {
  return drop(path, why, f, out, &t->stats.rejected);
}

int dt_read(struct dt_tier *t, uint64_t key, const struct dt_block *expect, struct dt_block *out) {
  char path[4096];
  path_of(t, key, path, sizeof(path));
  memset(out, 0, sizeof(*out));
  double t0 = now_s();
  char why[256]; /* base/file.h: a FIFO or device in the cache directory is dropped, not waited on */
  int fd = cedar_open_in(path, CEDAR_NO_CAP, NULL, why, sizeof why);
  if (fd < 0 && access(path, F_OK) == 0) return reject(t, path, cedar_file_why(why, path), NULL, out);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
  if (!f) {
    if (fd >= 0) close(fd);
    t->stats.missing++;
    return 1;
  }
  struct dt_head h;
  struct dt_rec rec[64];
  uint64_t hsum;
  if (fread(&h, sizeof(h), 1, f) != 1) return reject(t, path, "truncated header", f, out);
  if (memcmp(h.magic, DT_MAGIC, 8) || h.version != DT_VERSION) return reject(t, path, "not a cedar block file of this version", f, out);
  if (h.n_parts != (uint32_t)expect->n_parts || h.n_parts > 64) return reject(t, path, "another plan's layout", f, out);
  if (fread(rec, sizeof(rec[0]), h.n_parts, f) != h.n_parts || fread(&hsum, sizeof(hsum), 1, f) != 1)
    return reject(t, path, "truncated header", f, out);
  XXH3_state_t *hs = XXH3_createState();
  XXH3_64bits_reset(hs);
  XXH3_64bits_update(hs, &h, sizeof(h));
  XXH3_64bits_update(hs, rec, sizeof(rec[0]) * h.n_parts);
  bool head_ok = XXH3_64bits_digest(hs) == hsum;
  XXH3_freeState(hs);
  if (!head_ok) return reject(t, path, "header checksum mismatch", f, out);
  if (h.fingerprint != t->fingerprint) return reject(t, path, "made for other weights or another plan", f, out);
  if (h.key != key || h.parent != expect->parent || h.index != expect->index)
    return reject(t, path, "the block's key, parent or index differs", f, out);
  if (t->ttl_s > 0 && (double)(time(NULL) - h.created) > t->ttl_s)
    return drop(path, "older than the TTL", f, out, &t->stats.expired);
  out->key = key;
  out->parent = h.parent;
  out->index = h.index;
  out->n_parts = (int)h.n_parts;
  int64_t bytes = h.header_bytes;
  for (uint32_t i = 0; i < h.n_parts; i++) {
    const struct dt_part *e = &expect->part[i];
    if (rec[i].layer != (uint32_t)e->layer || rec[i].ratio != (uint32_t)e->ratio ||
        rec[i].n_entries != (uint32_t)e->n_entries || rec[i].entry_bytes != (uint32_t)e->entry_bytes)
      return reject(t, path, "another plan's layout", f, out);
    struct dt_part *p = &out->part[i];
    *p = *e;
    size_t n = (size_t)e->n_entries * e->entry_bytes;
    p->bytes = malloc(n ? n : 1);
    if (!p->bytes) { /* this process's problem, not the file's: keep it */
      LOG_WARN("prefix cache: %s: out of memory reading %zu bytes; the block is recomputed", path, n);
      fclose(f);
      dt_block_free(out);
      return CEDAR_ENOMEM;
    }
    if (fread(p->bytes, 1, n, f) != n) return reject(t, path, "truncated payload", f, out);
    if (XXH3_64bits(p->bytes, n) != rec[i].checksum) return reject(t, path, "payload checksum mismatch", f, out);
    bytes += (int64_t)n;
  }
  if (fgetc(f) != EOF) return reject(t, path, "trailing bytes", f, out);
  fclose(f);
  t->stats.loaded++;
  t->stats.bytes_loaded += bytes;
  t->stats.load_seconds += now_s() - t0;
  return 0;
}

bool dt_has(const struct dt_tier *t, uint64_t key) {
  char path[4096];
  path_of(t, key, path, sizeof(path));
  return access(path, F_OK) == 0;
}

bool dt_worth_loading(const struct dt_tier *t, int64_t bytes) {
  if (t->recompute_s_per_block <= 0 || t->stats.bytes_loaded <= 0) return true; /* nothing measured yet: try */
  double per_byte = t->stats.load_seconds / (double)t->stats.bytes_loaded;
  return per_byte * (double)bytes < t->recompute_s_per_block;
}

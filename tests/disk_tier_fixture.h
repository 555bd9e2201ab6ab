/* disk_tier_fixture.h: what the tests/test_disk_tier_*.c files share.
 * Fresh mkdtemp directories under /tmp and their removal; whole-file reads
 * and writes; blocks whose bytes are a function of (key, version, part)
 * and their comparison; an independent encoder of the file format
 * runtime/cache/disk_tier.h documents (forge_image: explicit little-endian
 * fields, a valid header checksum, any field chosen by the caller); the
 * checks every case uses (stats_is, expect_rejected).
 *
 * What it is not: a test by itself (no main). Functions are static inline
 * so each test compiles only what it uses.
 *
 * Tested through its users: ctest --test-dir build -R '^disk_tier_'.
 */
#ifndef CEDAR_TESTS_DISK_TIER_FIXTURE_H
#define CEDAR_TESTS_DISK_TIER_FIXTURE_H

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>
#include <xxhash.h>

#include "base/check.h"
#include "runtime/cache/disk_tier.h"
#include "tests/harness.h"

#define FP 0x0123456789abcdefull /* the plan-and-weights fingerprint of most cases */
#define HEAD_FIXED 64            /* magic 8, version 4, header bytes 4, fp, key, parent, index, created 8 each, n_parts 4, pad 4 */
#define HEAD_REC 24              /* layer, ratio, entries, entry bytes 4 each, XXH3 8 */

static inline uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
         x += 0x9e3779b97f4a7c15ull;
         x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
         x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
         return x ^ (x >> 31);
       }
       
       /* ---- directories and files ------------------------------------------------ */
       
       static inline char *dir_new(void) {
  char tmpl[] = "/tmp/cedar_dt_XXXXXX";
  if (!mkdtemp(tmpl)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    exit(1);
  }
  return cedar_xstrdup(tmpl);
}

/* Remove dir and everything under it. */
static inline void dir_remove(char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = cedar_xmalloc(strlen(dir) + strlen(e->d_name) + 2);
    sprintf(p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (!lstat(p, &st) && S_ISDIR(st.st_mode)) {
      dir_remove(p);
      continue;
    }
    unlink(p);
    free(p);
  }
  if (d) closedir(d);
  if (rmdir(dir)) fprintf(stderr, "warning: could not remove %s: %s\n", dir, strerror(errno));
  free(dir);
}

static inline void blk_path(const char *dir, uint64_t key, char *buf, size_t len) {
  snprintf(buf, len, "%s/%016" PRIx64 ".blk", dir, key);
}

static inline bool file_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static inline uint8_t *file_get(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  *n = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *p = cedar_xmalloc((size_t)len + 1);
  *n = fread(p, 1, (size_t)len, f);
  fclose(f);
  return p;
}

static inline void file_put(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

/* Entries of dir whose name contains `part`. */
static inline int dir_count(const char *dir, const char *part) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)))
    if (strstr(e->d_name, part)) n++;
  if (d) closedir(d);
  return n;
}

/* ---- blocks ---------------------------------------------------------------- */

struct shape {
  int layer, ratio, n_entries;
  size_t entry_bytes;
};

/* Fill n bytes from a seed: each 8-byte word is mix(seed + word index). */
static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = mix(seed + i);
    memcpy(p + i, &w, n - i < 8 ? n - i : 8);
  }
}

/* The layout `expect` of a block (bytes unset), as the prefix cache gives it. */
static inline void block_expect(struct dt_block *b, const struct shape *s, int n, uint64_t key, uint64_t parent,
                                int64_t index) {
  memset(b, 0, sizeof(*b));
  b->key = key;
  b->parent = parent;
  b->index = index;
  b->n_parts = n;
  for (int i = 0; i < n; i++) b->part[i] = (struct dt_part){s[i].layer, s[i].ratio, s[i].n_entries, s[i].entry_bytes, NULL};
}

/* A block whose bytes are a function of (key, version, part); when part 0
 * holds 8 bytes or more, its first 8 are the version (the crash test reads
 * it back). Free with dt_block_free. */
static inline void block_make(struct dt_block *b, const struct shape *s, int n, uint64_t key, uint64_t parent,
                              int64_t index, uint64_t version) {
  block_expect(b, s, n, key, parent, index);
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)s[i].n_entries * s[i].entry_bytes;
    b->part[i].bytes = cedar_xmalloc(bytes + 1);
    fill(b->part[i].bytes, bytes, mix(key ^ mix(version * 131 + (uint64_t)i)));
    if (i == 0 && bytes >= 8) memcpy(b->part[0].bytes, &version, 8);
  }
}

static inline bool block_same(const struct dt_block *a, const struct dt_block *b) {
  if (a->key != b->key || a->parent != b->parent || a->index != b->index || a->n_parts != b->n_parts) return false;
  for (int i = 0; i < a->n_parts; i++) {
    const struct dt_part *p = &a->part[i], *q = &b->part[i];
    if (p->layer != q->layer || p->ratio != q->ratio || p->n_entries != q->n_entries || p->entry_bytes != q->entry_bytes)
      return false;
    if (!p->bytes || !q->bytes || memcmp(p->bytes, q->bytes, (size_t)p->n_entries * p->entry_bytes)) return false;
  }
  return true;
}

/* out as dt_read must leave it after a miss: nothing to use, nothing to free. */
static inline bool block_empty(const struct dt_block *b) {
  if (b->n_parts || b->key || b->parent || b->index) return false;
  for (int i = 0; i < 64; i++)
    if (b->part[i].bytes) return false;
  return true;
}

static inline int64_t file_bytes(const struct shape *s, int n) {
  int64_t bytes = HEAD_FIXED + (int64_t)n * HEAD_REC + 8;
  for (int i = 0; i < n; i++) bytes += (int64_t)s[i].n_entries * (int64_t)s[i].entry_bytes;
  return bytes;
}

/* The small block of most cases: four parts of different entry sizes and
 * counts, one with 0 entries (a ratio above the block length). */
static const struct shape SMALL[] = {{0, 4, 2, 24}, {1, 128, 0, 16}, {2, 2, 3, 10}, {5, 1, 7, 1}};
#define N_SMALL 4
#define SMALL_KEY 0xfeedface12345678ull
#define SMALL_PARENT 0x1111222233334444ull
#define SMALL_INDEX 7

static inline void small_block(struct dt_block *b, uint64_t version) {
  block_make(b, SMALL, N_SMALL, SMALL_KEY, SMALL_PARENT, SMALL_INDEX, version);
}
static inline void small_expect(struct dt_block *b) {
  block_expect(b, SMALL, N_SMALL, SMALL_KEY, SMALL_PARENT, SMALL_INDEX);
}

/* ---- the documented format, encoded independently -------------------------- */

struct forge {
  char magic[8];
  uint32_t version;
  uint64_t fingerprint, key; /* key: the key field written, whatever the file is named */
  int64_t created;
};

static inline void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The file disk_tier.h describes for block b, with the fields of f; the
 * header checksum is valid. Returns the image (free) and its size. */
static inline uint8_t *forge_image(const struct dt_block *b, const struct forge *f, size_t *size) {
  size_t head = HEAD_FIXED + (size_t)b->n_parts * HEAD_REC + 8, n = head;
  for (int i = 0; i < b->n_parts; i++) n += (size_t)b->part[i].n_entries * b->part[i].entry_bytes;
  uint8_t *p = calloc(n + 1, 1), *q = p + HEAD_FIXED;
  memcpy(p, f->magic, 8);
  put32(p + 8, f->version);
  put32(p + 12, (uint32_t)head);
  put64(p + 16, f->fingerprint);
  put64(p + 24, f->key);
  put64(p + 32, b->parent);
  put64(p + 40, (uint64_t)b->index);
  put64(p + 48, (uint64_t)f->created);
  put32(p + 56, (uint32_t)b->n_parts); /* p + 60: 4 bytes of padding, zero */
  size_t off = head;
  for (int i = 0; i < b->n_parts; i++, q += HEAD_REC) {
    const struct dt_part *s = &b->part[i];
    size_t bytes = (size_t)s->n_entries * s->entry_bytes;
    put32(q, (uint32_t)s->layer);
    put32(q + 4, (uint32_t)s->ratio);
    put32(q + 8, (uint32_t)s->n_entries);
    put32(q + 12, (uint32_t)s->entry_bytes);
    put64(q + 16, XXH3_64bits(s->bytes, bytes));
    memcpy(p + off, s->bytes, bytes);
    off += bytes;
  }
  put64(q, XXH3_64bits(p, head - 8));
  *size = n;
  return p;
}

static inline struct forge forge_default(uint64_t key, int64_t created) {
  struct forge f = {{0}, DT_VERSION, FP, key, created};
  memcpy(f.magic, DT_MAGIC, 8);
  return f;
}

/* ---- checks shared by the cases ---------------------------------------------- */

static inline void stats_is(const struct dt_tier *t, int64_t written, int64_t write_failed, int64_t loaded,
                            int64_t missing, int64_t rejected, int64_t expired, const char *where) {
  EXPECT_EQ(t->stats.written, written, "%s", where);
  EXPECT_EQ(t->stats.write_failed, write_failed, "%s", where);
  EXPECT_EQ(t->stats.loaded, loaded, "%s", where);
  EXPECT_EQ(t->stats.missing, missing, "%s", where);
  EXPECT_EQ(t->stats.rejected, rejected, "%s", where);
  EXPECT_EQ(t->stats.expired, expired, "%s", where);
}

/* dt_read of want->key must be a miss that removes the file and leaves out
 * empty (it starts filled with garbage, so dt_read must clear it). */
static inline void expect_rejected(struct dt_tier *t, const struct dt_block *want, const char *what, long arg) {
  char path[4096];
  struct dt_block out;
  memset(&out, 0x5a, sizeof out);
  blk_path(t->dir, want->key, path, sizeof path);
  int rc = dt_read(t, want->key, want, &out);
  EXPECT_EQ(rc, CEDAR_EFORMAT, "%s %ld", what, arg);
  EXPECT(block_empty(&out), "%s %ld: a rejected read left a block in out", what, arg);
  EXPECT(!file_exists(path), "%s %ld: the rejected file was not removed", what, arg);
  if (rc == 0) dt_block_free(&out);
}

static inline void init_or_die(struct dt_tier *t, const char *dir, uint64_t fp, double ttl_hours) {
  char err[512] = "";
  if (dt_init(t, dir, fp, ttl_hours, err, sizeof err)) {
    fprintf(stderr, "dt_init(%s): %s\n", dir, err);
    exit(1);
  }
}

static inline void write_or_fail(struct dt_tier *t, const struct dt_block *b, const char *where) {
  char err[512] = "";
  int rc = dt_write(t, b, err, sizeof err);
  EXPECT_EQ(rc, 0, "%s: %s", where, err);
}

#endif

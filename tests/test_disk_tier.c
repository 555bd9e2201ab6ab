/* test_disk_tier.c: the persistent tier of the global prefix cache
 * (runtime/disk_tier.h), on real files, one fresh mkdtemp directory under
 * /tmp per case (removed at the end):
 *
 *  - dt_init creates the directory and refuses a path that is a file;
 *  - dt_write then dt_read round-trips blocks byte for byte (parts of
 *    different entry sizes and counts, a part with 0 entries, 64 parts), a
 *    rewrite replaces the block, a missing key is 1 (`missing`);
 *  - the file format is the one the header documents: an independent encoder
 *    here (forge_image, explicit little-endian fields) reproduces dt_write's
 *    file byte for byte, and then forges files with valid checksums that
 *    differ in one field (magic, version, key, created) to reach each check
 *    behind the header checksum;
 *  - every damaged or foreign file is a miss (CEDAR_EFORMAT, out left empty),
 *    never a wrong block and never a crash, and the file is removed:
 *    truncation at every byte offset, every single-bit flip of a small file
 *    and a dense sample of a larger one, trailing bytes, wrong magic or
 *    version, another fingerprint, another layout than `expect` (layer,
 *    ratio, entries, entry bytes, one part more or less), another parent,
 *    index or key, a file older than the TTL (forged `created`; no sleeping;
 *    dt_write stamps the wall clock);
 *  - write failures (the directory gone, a directory in the file's place)
 *    are CEDAR_EIO, counted, and leave no temporary file;
 *  - leftover temporary files are never read as blocks and do not break
 *    later writes;
 *  - crash safety (issue 6 "Fault tests"): a forked child rewrites and adds
 *    blocks in a loop and is SIGKILLed at seeded random moments; after each
 *    kill a fresh reader finds every block file whole (the header promises
 *    "either the old state or the whole new file": no file is rejected, no
 *    key that existed is lost, no key goes back to an older version) and
 *    equal to a version the child wrote; temporary files left by a kill
 *    mid-write are counted and printed;
 *  - the stats counters after each step (expired files count in `expired`,
 *    not in `rejected`; bytes are whole file sizes);
 *  - dt_worth_loading: true when nothing is measured, else measured load
 *    seconds per byte x bytes against recompute_s_per_block (a tie recomputes).
 *
 * Not tested here: fsync durability (needs power loss, not SIGKILL: the page
 * cache survives a killed process), the warning text, the prefix cache's use
 * of the tier (test_prefix_cache.c, tests/cli/serve_crash.sh).
 * Run: ctest --test-dir build -R '^disk_tier$', or build/tests/test_disk_tier
 * from the repository root (CEDAR_LOG=warn shows the rejection warnings,
 * silenced by default here because there are thousands).
 */
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
#include "runtime/disk_tier.h"
#include "tests/harness.h"

#define FP 0x0123456789abcdefull /* the plan-and-weights fingerprint of most cases */
#define HEAD_FIXED 64            /* magic 8, version 4, header bytes 4, fp, key, parent, index, created 8 each, n_parts 4, pad 4 */
#define HEAD_REC 24              /* layer, ratio, entries, entry bytes 4 each, XXH3 8 */

static uint64_t mix(uint64_t x) { /* splitmix64's finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* ---- directories and files ------------------------------------------------ */

static char *dir_new(void) {
  char tmpl[] = "/tmp/cedar_dt_XXXXXX";
  if (!mkdtemp(tmpl)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    exit(1);
  }
  return cedar_xstrdup(tmpl);
}

/* Remove dir and everything under it. */
static void dir_remove(char *dir) {
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

static void blk_path(const char *dir, uint64_t key, char *buf, size_t len) {
  snprintf(buf, len, "%s/%016" PRIx64 ".blk", dir, key);
}

static bool file_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static uint8_t *file_get(const char *path, size_t *n) {
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

static void file_put(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
}

/* Entries of dir whose name contains `part`. */
static int dir_count(const char *dir, const char *part) {
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
static void fill(uint8_t *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = mix(seed + i);
    memcpy(p + i, &w, n - i < 8 ? n - i : 8);
  }
}

/* The layout `expect` of a block (bytes unset), as the prefix cache gives it. */
static void block_expect(struct dt_block *b, const struct shape *s, int n, uint64_t key, uint64_t parent,
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
static void block_make(struct dt_block *b, const struct shape *s, int n, uint64_t key, uint64_t parent, int64_t index,
                       uint64_t version) {
  block_expect(b, s, n, key, parent, index);
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)s[i].n_entries * s[i].entry_bytes;
    b->part[i].bytes = cedar_xmalloc(bytes + 1);
    fill(b->part[i].bytes, bytes, mix(key ^ mix(version * 131 + (uint64_t)i)));
    if (i == 0 && bytes >= 8) memcpy(b->part[0].bytes, &version, 8);
  }
}

static bool block_same(const struct dt_block *a, const struct dt_block *b) {
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
static bool block_empty(const struct dt_block *b) {
  if (b->n_parts || b->key || b->parent || b->index) return false;
  for (int i = 0; i < 64; i++)
    if (b->part[i].bytes) return false;
  return true;
}

static int64_t file_bytes(const struct shape *s, int n) {
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

static void small_block(struct dt_block *b, uint64_t version) {
  block_make(b, SMALL, N_SMALL, SMALL_KEY, SMALL_PARENT, SMALL_INDEX, version);
}
static void small_expect(struct dt_block *b) { block_expect(b, SMALL, N_SMALL, SMALL_KEY, SMALL_PARENT, SMALL_INDEX); }

/* ---- the documented format, encoded independently -------------------------- */

struct forge {
  char magic[8];
  uint32_t version;
  uint64_t fingerprint, key; /* key: the key field written, whatever the file is named */
  int64_t created;
};

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The file disk_tier.h describes for block b, with the fields of f; the
 * header checksum is valid. Returns the image (free) and its size. */
static uint8_t *forge_image(const struct dt_block *b, const struct forge *f, size_t *size) {
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

static struct forge forge_default(uint64_t key, int64_t created) {
  struct forge f = {{0}, DT_VERSION, FP, key, created};
  memcpy(f.magic, DT_MAGIC, 8);
  return f;
}

/* ---- checks shared by the cases ---------------------------------------------- */

static void stats_is(const struct dt_tier *t, int64_t written, int64_t write_failed, int64_t loaded, int64_t missing,
                     int64_t rejected, int64_t expired, const char *where) {
  EXPECT_EQ(t->stats.written, written, "%s", where);
  EXPECT_EQ(t->stats.write_failed, write_failed, "%s", where);
  EXPECT_EQ(t->stats.loaded, loaded, "%s", where);
  EXPECT_EQ(t->stats.missing, missing, "%s", where);
  EXPECT_EQ(t->stats.rejected, rejected, "%s", where);
  EXPECT_EQ(t->stats.expired, expired, "%s", where);
}

/* dt_read of want->key must be a miss that removes the file and leaves out
 * empty (it starts filled with garbage, so dt_read must clear it). */
static void expect_rejected(struct dt_tier *t, const struct dt_block *want, const char *what, long arg) {
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

static void init_or_die(struct dt_tier *t, const char *dir, uint64_t fp, double ttl_hours) {
  char err[512] = "";
  if (dt_init(t, dir, fp, ttl_hours, err, sizeof err)) {
    fprintf(stderr, "dt_init(%s): %s\n", dir, err);
    exit(1);
  }
}

static void write_or_fail(struct dt_tier *t, const struct dt_block *b, const char *where) {
  char err[512] = "";
  int rc = dt_write(t, b, err, sizeof err);
  EXPECT_EQ(rc, 0, "%s: %s", where, err);
}

/* ---- cases ----------------------------------------------------------------- */

static void test_init(void) {
  char *root = dir_new(), dir[4096], file[4096], err[512];
  struct dt_tier t;
  snprintf(dir, sizeof dir, "%s/tier", root);
  EXPECT_EQ(dt_init(&t, dir, FP, 72, err, sizeof err), 0, "a new directory: %s", err);
  struct stat st;
  EXPECT(stat(dir, &st) == 0 && S_ISDIR(st.st_mode), "dt_init did not create %s", dir);
  EXPECT(t.dir && !strcmp(t.dir, dir), "t.dir = %s", t.dir ? t.dir : "(null)");
  EXPECT(t.fingerprint == FP && t.ttl_s == 72 * 3600.0, "fingerprint or ttl_s not kept (ttl_s %g)", t.ttl_s);
  stats_is(&t, 0, 0, 0, 0, 0, 0, "after init");
  dt_free(&t);
  EXPECT_EQ(dt_init(&t, dir, FP, 72, err, sizeof err), 0, "an existing directory: %s", err);
  dt_free(&t);
  snprintf(file, sizeof file, "%s/plain", root);
  file_put(file, "x", 1);
  err[0] = 0;
  EXPECT_EQ(dt_init(&t, file, FP, 72, err, sizeof err), CEDAR_EIO, "a path that is a file");
  EXPECT(err[0], "no message for a path that is a file");
  EXPECT(!t.dir, "a refused tier keeps a directory");
  dt_free(&t); /* harmless after a refusal */
  dir_remove(root);
}

/* Write, read back byte for byte, rewrite, miss; counters and sizes. */
static void test_roundtrip(void) {
  char *dir = dir_new(), path[4096];
  struct dt_tier w, r;
  struct dt_block b, want, out;
  init_or_die(&w, dir, FP, 72);
  small_block(&b, 1);
  write_or_fail(&w, &b, "small block");
  blk_path(dir, SMALL_KEY, path, sizeof path);
  size_t size;
  uint8_t *img = file_get(path, &size);
  EXPECT_EQ(size, file_bytes(SMALL, N_SMALL), "the file's size");
  EXPECT_EQ(w.stats.bytes_written, size, "bytes_written is the file's size");
  stats_is(&w, 1, 0, 0, 0, 0, 0, "writer after one write");
  EXPECT_EQ(dir_count(dir, ""), 3, "., .. and the block: no temporary file left"); /* "" matches every name */
  /* the format as documented: an independent encoder gives the same bytes */
  struct forge f = forge_default(SMALL_KEY, img ? (int64_t)get64(img + 48) : 0);
  size_t fsize;
  uint8_t *fimg = forge_image(&b, &f, &fsize);
  EXPECT(img && fsize == size && !memcmp(fimg, img, size), "dt_write's file differs from the documented format");
  free(fimg);
  free(img);
  init_or_die(&r, dir, FP, 72); /* a fresh reader: as after a restart */
  small_expect(&want);
  EXPECT_EQ(dt_read(&r, SMALL_KEY, &want, &out), 0, "read back");
  EXPECT(block_same(&out, &b), "the block read back differs from the one written");
  dt_block_free(&out);
  stats_is(&r, 0, 0, 1, 0, 0, 0, "reader after one load");
  EXPECT_EQ(r.stats.bytes_loaded, size, "bytes_loaded is the file's size");
  EXPECT(r.stats.load_seconds >= 0, "load_seconds %g", r.stats.load_seconds);
  double ls = r.stats.load_seconds;
  /* a rewrite replaces the block; a load keeps the file */
  dt_block_free(&b);
  small_block(&b, 2);
  write_or_fail(&w, &b, "rewrite");
  EXPECT_EQ(dt_read(&r, SMALL_KEY, &want, &out), 0, "read the rewrite");
  EXPECT(block_same(&out, &b), "the rewritten block read back differs");
  dt_block_free(&out);
  stats_is(&w, 2, 0, 0, 0, 0, 0, "writer after the rewrite");
  EXPECT_EQ(w.stats.bytes_written, 2 * (int64_t)size, "bytes_written after the rewrite");
  EXPECT_EQ(r.stats.bytes_loaded, 2 * (int64_t)size, "bytes_loaded after two loads");
  EXPECT(r.stats.load_seconds >= ls, "load_seconds went down");
  /* a missing key */
  ls = r.stats.load_seconds;
  memset(&out, 0x5a, sizeof out);
  struct dt_block other = want;
  other.key = SMALL_KEY + 1;
  EXPECT_EQ(dt_read(&r, other.key, &other, &out), 1, "a missing key");
  EXPECT(block_empty(&out), "a missing key left something in out");
  stats_is(&r, 0, 0, 2, 1, 0, 0, "reader after a missing key");
  EXPECT(r.stats.load_seconds == ls && r.stats.bytes_loaded == 2 * (int64_t)size, "a miss counted as a load");
  EXPECT(file_exists(path), "the block file went away");
  dt_block_free(&b);
  dt_free(&w);
  dt_free(&r);
  dir_remove(dir);
}

/* 64 parts (the most a block holds), sizes 0 .. 63 entries of 1 .. 97 bytes. */
static void test_roundtrip_64(void) {
  char *dir = dir_new();
  struct shape s[64];
  for (int i = 0; i < 64; i++) s[i] = (struct shape){i, 1 << (i % 8), (i * 7) % 64, (size_t)(1 + (i * 13) % 97)};
  struct dt_tier t;
  struct dt_block b, want, out;
  init_or_die(&t, dir, FP, 72);
  block_make(&b, s, 64, 42, 41, 1, 3);
  block_expect(&want, s, 64, 42, 41, 1);
  write_or_fail(&t, &b, "64 parts");
  EXPECT_EQ(dt_read(&t, 42, &want, &out), 0, "64 parts read back");
  EXPECT(block_same(&out, &b), "64 parts: the block read back differs");
  EXPECT_EQ(t.stats.bytes_loaded, file_bytes(s, 64), "64 parts: bytes_loaded");
  dt_block_free(&out);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* Every prefix of a good file, and every single-bit flip, is rejected. */
static void test_truncate_and_flip(void) {
  char *dir = dir_new(), path[4096];
  struct dt_tier t;
  struct dt_block b, want;
  init_or_die(&t, dir, FP, 72);
  small_block(&b, 5);
  small_expect(&want);
  write_or_fail(&t, &b, "small block");
  blk_path(dir, SMALL_KEY, path, sizeof path);
  size_t size;
  uint8_t *img = file_get(path, &size), *bad = cedar_xmalloc(size + 1);
  int64_t n = 0;
  for (size_t cut = 0; cut < size; cut++, n++) {
    file_put(path, img, cut);
    expect_rejected(&t, &want, "truncated at byte", (long)cut);
  }
  for (size_t i = 0; i < size; i++)
    for (int bit = 0; bit < 8; bit++, n++) {
      memcpy(bad, img, size);
      bad[i] ^= (uint8_t)(1u << bit);
      file_put(path, bad, size);
      expect_rejected(&t, &want, "bit flipped at byte*8+bit", (long)(i * 8 + (size_t)bit));
    }
  stats_is(&t, 1, 0, 0, 0, n, 0, "after truncations and flips");
  /* and the good image still loads: the rejections were not of the file as such */
  file_put(path, img, size);
  struct dt_block out;
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 0, "the good image");
  dt_block_free(&out);
  free(bad);
  free(img);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* A larger file (about 60 KB): every bit of the header, a dense seeded
 * sample of payload bits (the first and last byte of every part included). */
static void test_flip_large(void) {
  static const struct shape s[] = {{3, 4, 64, 584}, {9, 128, 2, 584}, {11, 2, 128, 96}, {12, 1, 0, 584}, {13, 2, 128, 77}};
  char *dir = dir_new(), path[4096];
  struct dt_tier t;
  struct dt_block b, want;
  init_or_die(&t, dir, FP, 72);
  block_make(&b, s, 5, 77, 76, 3, 9);
  block_expect(&want, s, 5, 77, 76, 3);
  write_or_fail(&t, &b, "large block");
  blk_path(dir, 77, path, sizeof path);
  size_t size, head = HEAD_FIXED + 5 * HEAD_REC + 8;
  uint8_t *img = file_get(path, &size), *bad = cedar_xmalloc(size + 1);
  uint64_t seed = 2024;
  int64_t n = 0;
  size_t part_edge[2 * 5], ne = 0, off = head;
  for (int i = 0; i < 5; i++) {
    size_t bytes = (size_t)s[i].n_entries * s[i].entry_bytes;
    if (bytes) part_edge[ne++] = off, part_edge[ne++] = off + bytes - 1;
    off += bytes;
  }
  for (size_t k = 0; k < head * 8 + ne + 400; k++, n++) {
    size_t byte = k < head * 8 ? k / 8 : k < head * 8 + ne ? part_edge[k - head * 8]
                                                          : head + (size_t)(h_uniform(&seed) * (double)(size - head));
    memcpy(bad, img, size);
    bad[byte] ^= (uint8_t)(1u << (k < head * 8 ? k % 8 : (size_t)(h_uniform(&seed) * 8)));
    file_put(path, bad, size);
    expect_rejected(&t, &want, "large file, bit flipped at byte", (long)byte);
  }
  stats_is(&t, 1, 0, 0, 0, n, 0, "large file after flips");
  free(bad);
  free(img);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* Trailing bytes; forged files with a valid header checksum and one field
 * wrong: magic, version, the key field (the file named for another key). */
static void test_forged(void) {
  char *dir = dir_new(), path[4096];
  struct dt_tier t;
  struct dt_block b, want;
  init_or_die(&t, dir, FP, 72);
  small_block(&b, 6);
  small_expect(&want);
  blk_path(dir, SMALL_KEY, path, sizeof path);
  int64_t now = (int64_t)time(NULL), n = 0;
  size_t size;
  struct forge f = forge_default(SMALL_KEY, now);
  uint8_t *img = forge_image(&b, &f, &size), *longer = calloc(size + 1000, 1);
  memcpy(longer, img, size);
  size_t extra[] = {1, 7, 1000};
  for (int i = 0; i < 3; i++, n++) {
    file_put(path, longer, size + extra[i]);
    expect_rejected(&t, &want, "trailing bytes:", (long)extra[i]);
  }
  file_put(path, img, size); /* the forged file as such is good */
  struct dt_block out;
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 0, "a forged good file");
  EXPECT(block_same(&out, &b), "a forged good file read back differs");
  dt_block_free(&out);
  free(img);
  struct forge bad[] = {f, f, f, f, f};
  memcpy(bad[0].magic, "CEDARBLJ", 8);
  memcpy(bad[1].magic, "cedarblk", 8);
  bad[2].version = DT_VERSION + 1;
  bad[3].version = DT_VERSION - 1;
  bad[4].key = SMALL_KEY ^ 1;
  for (int i = 0; i < 5; i++, n++) {
    img = forge_image(&b, &bad[i], &size);
    file_put(path, img, size);
    free(img);
    expect_rejected(&t, &want, "forged: magic, magic, version+1, version-1, key; case", i);
  }
  stats_is(&t, 0, 0, 1, 0, n, 0, "after forged files");
  free(longer);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* Another layout than `expect`: field f of part i moved by d. */
static void layout_case(struct dt_block *want, int i, int f, int d) {
  struct dt_part *p = &want->part[i];
  if (f == 0) p->layer += d;
  if (f == 1) p->ratio += d;
  if (f == 2) p->n_entries += d;
  if (f == 3) p->entry_bytes = (size_t)((int64_t)p->entry_bytes + d);
}

/* Files written for another fingerprint, layout, parent, index or key. */
static void test_identity(void) {
  char *dir = dir_new(), path[4096], path2[4096];
  struct dt_tier t, other;
  struct dt_block b, want;
  init_or_die(&t, dir, FP, 72);
  init_or_die(&other, dir, FP ^ 0x10, 72);
  small_block(&b, 8);
  blk_path(dir, SMALL_KEY, path, sizeof path);
  int64_t n = 0, writes = 0;
  small_expect(&want);
  write_or_fail(&other, &b, "other fingerprint");
  expect_rejected(&t, &want, "another fingerprint", 0), n++;
  for (int i = 0; i < N_SMALL; i++) /* every field of every part, one up and one down */
    for (int f = 0; f < 4; f++)
      for (int d = -1; d <= 1; d += 2) {
        small_expect(&want);
        layout_case(&want, i, f, d);
        if (want.part[i].n_entries < 0 || want.part[i].ratio < 1 || want.part[i].layer < 0) continue;
        write_or_fail(&t, &b, "layout case"), writes++;
        expect_rejected(&t, &want, "expect differs in one layout field: part*8+field*2+(d>0)", i * 8 + f * 2 + (d > 0)), n++;
      }
  int parts[] = {N_SMALL - 1, N_SMALL + 1, 0};
  for (int i = 0; i < 3; i++, n++) {
    write_or_fail(&t, &b, "n_parts case"), writes++;
    small_expect(&want);
    want.n_parts = parts[i];
    if (parts[i] > N_SMALL) want.part[N_SMALL] = (struct dt_part){6, 2, 1, 8, NULL};
    expect_rejected(&t, &want, "expect has n_parts", (long)parts[i]);
  }
  for (int i = 0; i < 4; i++, n++) {
    write_or_fail(&t, &b, "parent / index case"), writes++;
    small_expect(&want);
    if (i == 0) want.parent ^= 1;
    if (i == 1) want.parent = 0;
    if (i == 2) want.index++;
    if (i == 3) want.index = -SMALL_INDEX;
    expect_rejected(&t, &want, "expect differs in parent, parent, index, index; case", i);
  }
  /* a good file under another key's name */
  write_or_fail(&t, &b, "renamed case"), writes++;
  blk_path(dir, SMALL_KEY + 2, path2, sizeof path2);
  EXPECT(rename(path, path2) == 0, "rename");
  small_expect(&want);
  want.key = SMALL_KEY + 2;
  expect_rejected(&t, &want, "a file named for another key", 0), n++;
  stats_is(&t, writes, 0, 0, 0, n, 0, "after identity cases");
  EXPECT(n >= 30, "only %" PRId64 " identity cases ran", n);
  dt_block_free(&b);
  dt_free(&t);
  dt_free(&other);
  dir_remove(dir);
}

/* Expiry: forged `created` fields against the TTL (no sleeping). */
static void ttl_case(struct dt_tier *t, const struct dt_block *b, int64_t created, bool loads, const char *what) {
  char path[4096];
  struct dt_block want, out;
  struct forge f = forge_default(SMALL_KEY, created);
  size_t size;
  uint8_t *img = forge_image(b, &f, &size);
  blk_path(t->dir, SMALL_KEY, path, sizeof path);
  file_put(path, img, size);
  free(img);
  small_expect(&want);
  if (!loads) {
    expect_rejected(t, &want, what, 0);
    return;
  }
  EXPECT_EQ(dt_read(t, SMALL_KEY, &want, &out), 0, "%s", what);
  EXPECT(block_same(&out, b), "%s: the block read back differs", what);
  dt_block_free(&out);
}

static void test_ttl(void) {
  char *dir = dir_new(), path[4096];
  struct dt_tier t;
  struct dt_block b;
  init_or_die(&t, dir, FP, 1.0); /* one hour */
  small_block(&b, 11);
  int64_t before = (int64_t)time(NULL);
  write_or_fail(&t, &b, "ttl: a written file");
  int64_t after = (int64_t)time(NULL);
  blk_path(dir, SMALL_KEY, path, sizeof path);
  size_t size;
  uint8_t *img = file_get(path, &size);
  int64_t created = img && size >= 56 ? (int64_t)get64(img + 48) : -1;
  EXPECT(created >= before && created <= after, "dt_write stamped created = %" PRId64 ", not in [%" PRId64 ", %" PRId64 "]",
         created, before, after);
  free(img);
  int64_t now = (int64_t)time(NULL);
  /* margins of minutes: the test never runs near a second boundary's worth of doubt */
  ttl_case(&t, &b, now - 7200, false, "two hours old, TTL one hour");
  stats_is(&t, 1, 0, 0, 0, 0, 1, "after one expired file");
  ttl_case(&t, &b, now - 3000, true, "50 minutes old, TTL one hour");
  t.ttl_s = 60; /* the field is public: set after init */
  ttl_case(&t, &b, now - 600, false, "10 minutes old, ttl_s set to 60 after init");
  stats_is(&t, 1, 0, 1, 0, 0, 2, "after two expired files");
  /* current behaviour (disk_tier.c:173): ttl <= 0 means no expiry */
  t.ttl_s = 0;
  ttl_case(&t, &b, 1, true, "from 1970 with ttl 0 (no expiry)");
  stats_is(&t, 1, 0, 2, 0, 0, 2, "after the TTL cases");
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* A write that cannot complete is CEDAR_EIO, counted, leaves no temporary
 * file; a directory where a block file should be is a miss, not a crash. */
static void test_write_failure(void) {
  char *dir = dir_new(), path[4096], err[512] = "";
  struct dt_tier t;
  struct dt_block b, want, out;
  init_or_die(&t, dir, FP, 72);
  small_block(&b, 12);
  small_expect(&want);
  EXPECT(rmdir(dir) == 0, "rmdir %s", dir);
  EXPECT_EQ(dt_write(&t, &b, err, sizeof err), CEDAR_EIO, "the directory is gone");
  EXPECT(err[0], "no message when the directory is gone");
  stats_is(&t, 0, 1, 0, 0, 0, 0, "after a write into a missing directory");
  EXPECT_EQ(t.stats.bytes_written, 0, "a failed write counted bytes");
  EXPECT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
  blk_path(dir, SMALL_KEY, path, sizeof path);
  EXPECT(mkdir(path, 0755) == 0, "mkdir %s", path);
  err[0] = 0;
  EXPECT_EQ(dt_write(&t, &b, err, sizeof err), CEDAR_EIO, "a directory in the block file's place");
  EXPECT(err[0], "no message when the rename fails");
  EXPECT_EQ(dir_count(dir, ".tmp."), 0, "a failed write left a temporary file");
  stats_is(&t, 0, 2, 0, 0, 0, 0, "after two failed writes");
  memset(&out, 0x5a, sizeof out);
  int rc = dt_read(&t, SMALL_KEY, &want, &out);
  EXPECT(rc == CEDAR_EFORMAT || rc == 1, "a directory as the block file: rc %d", rc);
  EXPECT(block_empty(&out), "a directory as the block file left something in out");
  if (!rc) dt_block_free(&out);
  rmdir(path);
  write_or_fail(&t, &b, "after the failures"); /* the tier still works */
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 0, "read after the failures");
  EXPECT(block_same(&out, &b), "read after the failures differs");
  dt_block_free(&out);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* Temporary files (one named with our pid, and another holding a whole
 * valid image) are never read as blocks and do not stop a write. */
static void test_tmp_leftovers(void) {
  char *dir = dir_new(), path[4096], tmp[4200];
  struct dt_tier t;
  struct dt_block b, old, want, out;
  init_or_die(&t, dir, FP, 72);
  small_block(&b, 13);
  small_block(&old, 14);
  small_expect(&want);
  blk_path(dir, SMALL_KEY, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  file_put(tmp, "half a block", 12);
  size_t size;
  struct forge f = forge_default(SMALL_KEY, (int64_t)time(NULL));
  uint8_t *img = forge_image(&old, &f, &size);
  snprintf(tmp, sizeof tmp, "%s.tmp.1", path);
  file_put(tmp, img, size);
  free(img);
  memset(&out, 0x5a, sizeof out);
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 1, "only temporary files for the key: a miss");
  EXPECT(block_empty(&out), "a miss left something in out");
  EXPECT_EQ(dir_count(dir, ".tmp."), 2, "dt_read touched the temporary files");
  write_or_fail(&t, &b, "over our own pid's leftover");
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 0, "read after writing over leftovers");
  EXPECT(block_same(&out, &b), "the block read is not the one written (a temporary file was read?)");
  dt_block_free(&out);
  /* writers use unique (mkstemp) names: neither leftover is reused or read;
   * dt_init removes them once they are 10 minutes old */
  EXPECT_EQ(dir_count(dir, ".tmp."), 2, "leftover temporary files are left alone by a write");
  stats_is(&t, 1, 0, 1, 1, 0, 0, "after leftovers");
  dt_block_free(&b);
  dt_block_free(&old);
  dt_free(&t);
  dir_remove(dir);
}

/* ---- crash safety ------------------------------------------------------------ */

#define CRASH_KILLS 200
#define CRASH_KEYS 32
#define CRASH_MAX_DELAY_NS 3000000 /* 0-3 ms after the fork */
/* About 14 KB a block, so a write is more than a few system calls. */
static const struct shape CRASH[] = {{0, 4, 16, 512}, {1, 128, 1, 512}, {2, 2, 32, 100}, {3, 1, 0, 8}};
#define N_CRASH 4

static uint64_t crash_key(int k) { return mix(0xc0ffeeull + (uint64_t)k); }

/* Keys in use grow from 8 to CRASH_KEYS over the runs: new keys, and old
 * keys rewritten. The i-th write of run r has version (r << 32) | i and goes
 * to key crash_pick(version). */
static int crash_keys_in_run(int run) { return 8 + run * (CRASH_KEYS - 8) / CRASH_KILLS; }
static int crash_pick(uint64_t version) { return (int)(mix(version) % (uint64_t)crash_keys_in_run((int)(version >> 32))); }

static void crash_expect(struct dt_block *b, int k) {
  block_expect(b, CRASH, N_CRASH, crash_key(k), k ? crash_key(k - 1) : FP, k);
}
static void crash_block(struct dt_block *b, int k, uint64_t version) {
  block_make(b, CRASH, N_CRASH, crash_key(k), k ? crash_key(k - 1) : FP, k, version);
}

/* The writer: runs until killed; _exit so nothing of the parent's runs. */
static void crash_child(const char *dir, int run) {
  struct dt_tier t;
  char err[512];
  if (dt_init(&t, dir, FP, 72, err, sizeof err)) _exit(3);
  for (uint64_t i = 0; i < (1u << 20); i++) {
    uint64_t version = ((uint64_t)run << 32) | i;
    struct dt_block b;
    crash_block(&b, crash_pick(version), version);
    if (dt_write(&t, &b, err, sizeof err)) _exit(4);
    dt_block_free(&b);
  }
  _exit(0);
}

struct crash_state {
  bool seen[CRASH_KEYS];
  uint64_t last[CRASH_KEYS]; /* the version read after the previous kill */
  int64_t mid_write, blocks, versions, leftovers_checked;
};

static int crash_index(uint64_t key) {
  for (int k = 0; k < CRASH_KEYS; k++)
    if (crash_key(k) == key) return k;
  return -1;
}

/* One block file after kill `run`: whole, a version the child could have
 * written for its key, not older than the one read after the last kill. */
static void crash_check_block(struct dt_tier *r, struct crash_state *cs, int k, int run) {
  struct dt_block want, out, ref;
  crash_expect(&want, k);
  int rc = dt_read(r, crash_key(k), &want, &out);
  EXPECT_EQ(rc, 0, "kill %d, key %d: a block file after SIGKILL is not whole", run, k);
  if (rc) return;
  uint64_t v;
  memcpy(&v, out.part[0].bytes, 8);
  bool possible = (int)(v >> 32) <= run && crash_pick(v) == k;
  EXPECT(possible, "kill %d, key %d: version %" PRIx64 " is not one the child wrote for this key", run, k, v);
  if (possible) {
    crash_block(&ref, k, v);
    EXPECT(block_same(&out, &ref), "kill %d, key %d: the block differs from version %" PRIx64, run, k, v);
    dt_block_free(&ref);
  }
  EXPECT(!cs->seen[k] || v >= cs->last[k], "kill %d, key %d: version went back from %" PRIx64 " to %" PRIx64, run, k,
         cs->last[k], v);
  if (!cs->seen[k] || v != cs->last[k]) cs->versions++;
  cs->seen[k] = true;
  cs->last[k] = v;
  cs->blocks++;
  dt_block_free(&out);
}

/* Names in dir (without . and ..), malloc'd; *n of them. */
static char **dir_names(const char *dir, int *n) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int cap = 64;
  char **names = cedar_xmalloc(sizeof(char *) * (size_t)cap);
  *n = 0;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (*n == cap) names = realloc(names, sizeof(char *) * (size_t)(cap *= 2));
    names[(*n)++] = cedar_xstrdup(e->d_name);
  }
  if (d) closedir(d);
  return names;
}

/* After kill `run` of child `pid`: a fresh reader checks every file. */
static void crash_verify(const char *dir, int run, pid_t pid, struct crash_state *cs) {
  struct dt_tier r;
  init_or_die(&r, dir, FP, 72);
  int n;
  char **names = dir_names(dir, &n);
  bool found[CRASH_KEYS] = {0};
  int tmp_key[CRASH_KILLS + 8], n_tmp = 0;
  for (int i = 0; i < n; i++) {
    const char *s = names[i];
    char *end;
    uint64_t key = strtoull(s, &end, 16);
    int k = end == s + 16 ? crash_index(key) : -1;
    if (k >= 0 && !strcmp(end, ".blk")) {
      found[k] = true;
      crash_check_block(&r, cs, k, run);
    } else if (k >= 0 && !strncmp(end, ".blk.tmp.", 9)) {
      if (strtol(end + 9, NULL, 10) == (long)pid) cs->mid_write++;
      if (n_tmp < CRASH_KILLS + 8) tmp_key[n_tmp++] = k;
    } else {
      EXPECT(0, "kill %d: an unexpected file %s", run, s);
    }
    free(names[i]);
  }
  free(names);
  for (int k = 0; k < CRASH_KEYS; k++)
    EXPECT(found[k] || !cs->seen[k], "kill %d, key %d: a block file that existed is gone", run, k);
  for (int i = 0; i < n_tmp; i++) { /* a key with only a temporary file is a miss */
    if (found[tmp_key[i]]) continue;
    struct dt_block want, out;
    crash_expect(&want, tmp_key[i]);
    int rc = dt_read(&r, crash_key(tmp_key[i]), &want, &out);
    EXPECT_EQ(rc, 1, "kill %d, key %d: only a temporary file, yet not a miss", run, tmp_key[i]);
    if (!rc) dt_block_free(&out);
    cs->leftovers_checked++;
  }
  EXPECT_EQ(r.stats.rejected + r.stats.expired, 0, "kill %d: files rejected", run);
  dt_free(&r);
}

/* The writer after a restart: every key written over the leftovers, read back. */
static void crash_final_writes(const char *dir) {
  struct dt_tier t;
  init_or_die(&t, dir, FP, 72);
  int tmp_before = dir_count(dir, ".tmp.");
  for (int k = 0; k < CRASH_KEYS; k++) {
    struct dt_block b, want, out;
    crash_block(&b, k, (uint64_t)CRASH_KILLS << 32 | (uint64_t)k);
    write_or_fail(&t, &b, "a write after the kills");
    crash_expect(&want, k);
    EXPECT_EQ(dt_read(&t, crash_key(k), &want, &out), 0, "key %d after the kills", k);
    EXPECT(block_same(&out, &b), "key %d after the kills: the block read is not the one written", k);
    dt_block_free(&out);
    dt_block_free(&b);
  }
  EXPECT_EQ(dir_count(dir, ".tmp."), tmp_before, "the writes after the kills left temporary files");
  stats_is(&t, CRASH_KEYS, 0, CRASH_KEYS, 0, 0, 0, "writer after the kills");
  dt_free(&t);
}

/* Fork a writer, SIGKILL it after a seeded random 0-3 ms, check, repeat. */
static void test_crash(void) {
  char *dir = dir_new();
  struct crash_state cs;
  memset(&cs, 0, sizeof cs);
  uint64_t seed = 0xdeadbeef;
  int killed = 0;
  fflush(NULL); /* nothing buffered is written twice */
  for (int run = 0; run < CRASH_KILLS; run++) {
    pid_t pid = fork();
    if (pid < 0) {
      EXPECT(0, "fork: %s", strerror(errno));
      break;
    }
    if (pid == 0) crash_child(dir, run);
    struct timespec d = {0, (long)(h_uniform(&seed) * CRASH_MAX_DELAY_NS)};
    nanosleep(&d, NULL);
    kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    bool ok = (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) || (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    EXPECT(ok, "kill %d: the writer failed on its own (status %#x: 3 = dt_init, 4 = dt_write)", run, st);
    killed += WIFSIGNALED(st);
    crash_verify(dir, run, pid, &cs);
  }
  printf("crash: %d writers killed, %" PRId64 " of them mid-write (a temporary file left); %" PRId64
         " block files checked, %" PRId64 " distinct versions seen, %" PRId64 " keys with only a temporary file\n",
         killed, cs.mid_write, cs.blocks, cs.versions, cs.leftovers_checked);
  crash_final_writes(dir);
  dir_remove(dir);
}

/* ---- dt_worth_loading ------------------------------------------------------------ */

static void test_worth_loading(void) {
  struct dt_tier t;
  memset(&t, 0, sizeof t);
  EXPECT(dt_worth_loading(&t, 1 << 20), "nothing measured: load");
  t.recompute_s_per_block = 0.5;
  EXPECT(dt_worth_loading(&t, (int64_t)1 << 40), "recompute measured, loading not: load");
  t.recompute_s_per_block = 0;
  t.stats.bytes_loaded = 1 << 20;
  t.stats.load_seconds = 1.0;
  EXPECT(dt_worth_loading(&t, (int64_t)1 << 40), "loading measured, recompute not: load");
  t.recompute_s_per_block = -1;
  EXPECT(dt_worth_loading(&t, (int64_t)1 << 40), "a negative recompute cost is unknown: load");
  /* 2^-20 s a byte, 0.5 s a block: break-even at 2^19 bytes; powers of two
   * keep every product exact, so the tie is a tie */
  t.recompute_s_per_block = 0.5;
  EXPECT(dt_worth_loading(&t, (1 << 19) - 1), "just below break-even: load");
  EXPECT(!dt_worth_loading(&t, 1 << 19), "a tie: recompute");
  EXPECT(!dt_worth_loading(&t, (1 << 19) + 1), "just above break-even: recompute");
  t.stats.load_seconds = 2.0; /* slower loads halve the break-even */
  EXPECT(dt_worth_loading(&t, (1 << 18) - 1), "slower loads, below: load");
  EXPECT(!dt_worth_loading(&t, 1 << 18), "slower loads, at the new break-even: recompute");
  t.stats.bytes_loaded = 1 << 22; /* more bytes in the same time: faster */
  EXPECT(dt_worth_loading(&t, (1 << 20) - 1), "faster loads, below: load");
  EXPECT(!dt_worth_loading(&t, 1 << 20), "faster loads, at the new break-even: recompute");
  /* from real loads */
  char *dir = dir_new();
  struct dt_block b, want, out;
  init_or_die(&t, dir, FP, 72);
  small_block(&b, 21);
  small_expect(&want);
  write_or_fail(&t, &b, "worth_loading");
  EXPECT_EQ(dt_read(&t, SMALL_KEY, &want, &out), 0, "worth_loading: a load");
  dt_block_free(&out);
  t.recompute_s_per_block = 1e9;
  EXPECT(dt_worth_loading(&t, 1 << 20), "a measured load against a recompute of 1e9 s: load");
  t.recompute_s_per_block = 1e-300;
  EXPECT(t.stats.load_seconds <= 0 || !dt_worth_loading(&t, 1 << 20),
         "a measured load (%g s) against a recompute of 1e-300 s: recompute", t.stats.load_seconds);
  dt_block_free(&b);
  dt_free(&t);
  dir_remove(dir);
}

/* dt_init removes temporary files older than 10 minutes (a killed writer's)
 * and keeps younger ones (a live writer's); it creates missing parents. */
static void test_stale_tmp(void) {
  char *dir = dir_new(), path[4096], old_tmp[4200], new_tmp[4200], nested[4200];
  blk_path(dir, SMALL_KEY, path, sizeof path);
  snprintf(old_tmp, sizeof old_tmp, "%s.tmp.AAAAAA", path);
  snprintf(new_tmp, sizeof new_tmp, "%s.tmp.BBBBBB", path);
  file_put(old_tmp, "killed", 6);
  file_put(new_tmp, "writing", 7);
  struct utimbuf ago = {time(NULL) - 1200, time(NULL) - 1200};
  EXPECT_EQ(utime(old_tmp, &ago), 0, "set an old mtime");
  struct dt_tier t;
  init_or_die(&t, dir, FP, 72);
  EXPECT(access(old_tmp, F_OK) != 0, "a 20-minute-old temporary file was not removed");
  EXPECT(access(new_tmp, F_OK) == 0, "a fresh temporary file was removed");
  dt_free(&t);
  snprintf(nested, sizeof nested, "%s/a/b/c", dir);
  init_or_die(&t, nested, FP, 72);
  struct stat st;
  EXPECT(stat(nested, &st) == 0 && S_ISDIR(st.st_mode), "missing parents were not created");
  dt_free(&t);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s/a'", dir);
  EXPECT_EQ(system(cmd), 0, "cleanup");
  unlink(new_tmp);
  dir_remove(dir);
}

int main(void) {
  setenv("CEDAR_LOG", "error", 0); /* thousands of rejections each warn; CEDAR_LOG=warn shows them */
  test_init();
  test_roundtrip();
  test_roundtrip_64();
  test_truncate_and_flip();
  test_flip_large();
  test_forged();
  test_identity();
  test_ttl();
  test_write_failure();
  test_tmp_leftovers();
  test_stale_tmp();
  test_worth_loading();
  test_crash();
  return h_report("disk_tier");
}

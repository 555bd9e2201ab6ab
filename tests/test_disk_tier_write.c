/* test_disk_tier_write.c: writing and reading the persistent tier of the
 * global prefix cache (runtime/cache/disk_tier.h), on real files, one fresh
 * mkdtemp directory under /tmp per case (removed at the end):
 *
 *  - dt_init creates the directory (and missing parents) and refuses a path
 *    that is a file;
 *  - dt_write then dt_read round-trips blocks byte for byte (parts of
 *    different entry sizes and counts, a part with 0 entries, 64 parts), a
 *    rewrite replaces the block, a missing key is 1 (`missing`);
 *  - the file format is the one the header documents: an independent encoder
 *    (forge_image, tests/disk_tier_fixture.h) reproduces dt_write's file
 *    byte for byte;
 *  - write failures (the directory gone, a directory in the file's place)
 *    are CEDAR_EIO, counted, and leave no temporary file;
 *  - leftover temporary files are never read as blocks and do not break
 *    later writes; dt_init removes those older than 10 minutes and keeps
 *    younger ones;
 *  - the stats counters after each step (bytes are whole file sizes);
 *  - dt_worth_loading: true when nothing is measured, else measured load
 *    seconds per byte x bytes against recompute_s_per_block (a tie
 *    recomputes).
 *
 * Not tested here: damaged or foreign files (test_disk_tier_reject.c),
 * SIGKILL mid-write (test_disk_tier_crash.c), fsync durability, the
 * warning text, the prefix cache's use of the tier (tests/cli/serve_crash.sh).
 * Run: ctest --test-dir build -R '^disk_tier_write$', or
 * build/tests/test_disk_tier_write from the repository root.
 */
#include "tests/disk_tier_fixture.h"

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
  test_write_failure();
  test_tmp_leftovers();
  test_stale_tmp();
  test_worth_loading();
  return h_report("disk_tier_write");
}

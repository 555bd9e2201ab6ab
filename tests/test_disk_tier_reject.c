/* test_disk_tier_reject.c: the persistent tier of the global prefix cache
 * (runtime/cache/disk_tier.h) given damaged, foreign or expired files, on real
 * files, one fresh mkdtemp directory under /tmp per case (removed at the
 * end):
 *
 *  - every damaged or foreign file is a miss (CEDAR_EFORMAT, out left empty),
 *    never a wrong block and never a crash, and the file is removed:
 *    truncation at every byte offset, every single-bit flip of a small file
 *    and a dense sample of a larger one, trailing bytes;
 *  - files forged with valid checksums (forge_image,
 *    tests/disk_tier_fixture.h) that differ in one field reach each check
 *    behind the header checksum: wrong magic or version, another
 *    fingerprint, another layout than `expect` (layer, ratio, entries, entry
 *    bytes, one part more or less), another parent, index or key;
 *  - a file older than the TTL (forged `created`; no sleeping; dt_write
 *    stamps the wall clock) is a miss counted in `expired`, not in
 *    `rejected`; a TTL of 0 means no expiry;
 *  - the stats counters after each step.
 *
 * Not tested here: good files (test_disk_tier_write.c), SIGKILL mid-write
 * (test_disk_tier_crash.c), the warning text.
 * Run: ctest --test-dir build -R '^disk_tier_reject$', or
 * build/tests/test_disk_tier_reject from the repository root
 * (CEDAR_LOG=warn shows the rejection warnings, silenced by default here
 * because there are thousands).
 */
#include "tests/disk_tier_fixture.h"

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

int main(void) {
  setenv("CEDAR_LOG", "error", 0); /* thousands of rejections each warn; CEDAR_LOG=warn shows them */
  test_truncate_and_flip();
  test_flip_large();
  test_forged();
  test_identity();
  test_ttl();
  return h_report("disk_tier_reject");
}

/* test_disk_tier_crash.c: crash safety of the persistent tier of the global
 * prefix cache (runtime/cache/disk_tier.h; issue 6 "Fault tests"), on real files
 * in a fresh mkdtemp directory under /tmp (removed at the end).
 *
 *  - a forked child rewrites and adds blocks in a loop and is SIGKILLed at
 *    seeded random moments; after each kill a fresh reader finds every block
 *    file whole (the header promises "either the old state or the whole new
 *    file": no file is rejected, no key that existed is lost, no key goes
 *    back to an older version) and equal to a version the child wrote; a key
 *    with only a temporary file is a miss; temporary files left by a kill
 *    mid-write are counted and printed;
 *  - after the kills a restarted writer writes every key over the leftovers
 *    and reads each back; the stats counters agree.
 *
 * Not tested here: fsync durability (needs power loss, not SIGKILL: the page
 * cache survives a killed process), damaged files
 * (test_disk_tier_reject.c), the prefix cache's use of the tier
 * (tests/cli/serve_crash.sh).
 * Run: ctest --test-dir build -R '^disk_tier_crash$', or
 * build/tests/test_disk_tier_crash from the repository root.
 */
#include "tests/disk_tier_fixture.h"

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

int main(void) {
  setenv("CEDAR_LOG", "error", 0); /* thousands of rejections each warn; CEDAR_LOG=warn shows them */
  test_crash();
  return h_report("disk_tier_crash");
}

/* test_prefix_cache_keys.c: pc_init and the block keys of the global prefix
 * cache (runtime/cache/prefix_cache.h), with synthetic state
 * (tests/prefix_cache_fixture.h): no weights, no forward.
 *
 *  - pc_init: page and block sizes that do not divide are CEDAR_EINVAL with
 *    a message; pages per block per source, the source list in layer order,
 *    block bytes, the capacity as given, a snapshot capacity of -1 meaning
 *    swa_pool_fraction of host memory, the TTL from the plan;
 *  - keys: block k's key is XXH3_64 of its ids seeded with block k-1's key
 *    (block 0: the fingerprint), recomputed here independently; changing a
 *    token in block j changes keys j.. and none before; another fingerprint
 *    changes every key; pc_prefix_key separates lengths, partial blocks and
 *    trailing zero ids, and ignores tokens past n.
 *
 * Not tested here: insert, lookup and attach (test_prefix_cache_attach.c),
 * eviction (test_prefix_cache_lru.c), snapshots (test_prefix_cache_snap.c),
 * the hit paths that run the model (runtime/serve.c), the disk tier.
 * Run: ctest --test-dir build -R '^prefix_cache_keys$', or
 * build/tests/test_prefix_cache_keys from the repository root.
 */
#include "tests/prefix_cache_fixture.h"

/* ---- pc_init ---------------------------------------------------------------- */

static void test_init(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  char err[256] = "";
  static const int bad[][2] = {{4, 6}, {4, 7}, {8, 12}, {2, 0}, {4, 2}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    plan.serving.page_tokens = bad[i][0], plan.serving.prefix_block_tokens = bad[i][1];
    err[0] = 0;
    EXPECT_EQ(pc_init(&cache, &plan, pools, SEED_A, 0, 0, err, sizeof err), CEDAR_EINVAL, "page %d block %d", bad[i][0],
              bad[i][1]);
    EXPECT(err[0] != 0, "page %d block %d: an error message", bad[i][0], bad[i][1]);
  }
  plan.serving.page_tokens = 4, plan.serving.prefix_block_tokens = 8;
  cache_init(3, -1, SEED_A);
  int n_src = 0;
  for (int l = 0; l < plan.n_layers; l++) {
    bool src = plan_is_kv_source(&plan.layer[l]);
    EXPECT_EQ(ppb(l), src ? 2 : 0, "L%d pages per block (8-token blocks of 4-token pages)", l);
    if (!src) continue;
    EXPECT_EQ(cache.sources[n_src], l, "source list in layer order");
    n_src++;
  }
  EXPECT_EQ(cache.n_sources, n_src, "every KV source is in the unit");
  EXPECT(n_src == 2, "tiny has one encoder and one decoder source (%d)", n_src);
  EXPECT_EQ(cache.block_bytes, block_bytes(), "block bytes = pages of every source");
  EXPECT_EQ(cache.capacity_bytes, 3 * block_bytes(), "capacity as given");
  int64_t host = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
  EXPECT_EQ(cache.snap_capacity_bytes, (int64_t)(plan.serving.swa_pool_fraction * host),
            "snap capacity -1: swa_pool_fraction of host memory");
  EXPECT(cache.snap_ttl_s == plan.serving.swa_pool_ttl_s && cache.snap_ttl_s > 0, "TTL from the plan");
  pc_free(&cache);
  teardown("init");
}

/* ---- keys ----------------------------------------------------------------- */

static void test_keys(void) {
  if (!setup("tests/oracle/plans/tiny.yaml", 4, 8)) return;
  cache_init(0, SNAP_BIG, SEED_A);
  const int B = cache.block, NB = 6;
  int64_t n = NB * B + 3;
  int32_t tok[6 * 8 + 3], t2[6 * 8 + 3];
  uint64_t keys[8], k2[8];
  fill_tokens(tok, n, 1);
  EXPECT_EQ(pc_keys(&cache, tok, n, keys), NB, "full blocks of %" PRId64 " tokens", n);
  EXPECT_EQ(pc_keys(&cache, tok, B - 1, k2), 0, "no full block");
  /* the documented chain, recomputed */
  uint64_t h = SEED_A;
  for (int k = 0; k < NB; k++) {
    h = XXH3_64bits_withSeed(tok + k * B, sizeof(int32_t) * (size_t)B, h);
    EXPECT(keys[k] == h, "block %d: key = XXH3_64(ids, seed = previous key)", k);
  }
  /* a key depends on every earlier token and on no later one */
  for (int j = 0; j < NB; j++) {
    memcpy(t2, tok, sizeof tok);
    t2[j * B + (j * 3) % B] = (t2[j * B + (j * 3) % B] + 1) % plan.model.vocab;
    pc_keys(&cache, t2, n, k2);
    for (int k = 0; k < NB; k++)
      EXPECT((k2[k] == keys[k]) == (k < j), "a token of block %d changed: key %d %s", j, k,
             k < j ? "changed too" : "did not change");
  }
  memcpy(t2, tok, sizeof tok);
  t2[n - 1] ^= 1; /* past the last full block */
  pc_keys(&cache, t2, n, k2);
  EXPECT(memcmp(k2, keys, sizeof(uint64_t) * NB) == 0, "a token after the last full block changes no key");
  EXPECT_EQ(pc_keys(&cache, tok, 2 * B, k2), 2, "shorter prompt");
  EXPECT(k2[0] == keys[0] && k2[1] == keys[1], "keys of a prefix are the prefix of the keys");
  /* another fingerprint: every key differs */
  struct pc_cache other = cache;
  other.seed = SEED_B;
  pc_keys(&other, tok, n, k2);
  for (int k = 0; k < NB; k++) EXPECT(k2[k] != keys[k], "block %d: another fingerprint, another key", k);

  /* prefix keys: length, partial block, zero ids, later tokens */
  uint64_t pk[6 * 8 + 4];
  for (int64_t m = 0; m <= n; m++) pk[m] = pc_prefix_key(&cache, tok, m);
  int dup = 0;
  for (int64_t a = 0; a <= n; a++)
    for (int64_t b = a + 1; b <= n; b++) dup += pk[a] == pk[b];
  EXPECT(dup == 0, "pc_prefix_key: %d equal pairs among the %" PRId64 " prefixes of one prompt", dup, n + 1);
  for (int k = 1; k <= NB; k++) EXPECT(pk[k * B] != keys[k - 1], "prefix key of %d blocks is not the block key", k);
  memcpy(t2, tok, sizeof tok);
  t2[2 * B + 1] = (t2[2 * B + 1] + 1) % plan.model.vocab;
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 3) != pk[2 * B + 3], "a token of the partial block changes the prefix key");
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 1) == pk[2 * B + 1], "a token past n does not");
  memcpy(t2, tok, sizeof tok);
  t2[2 * B + 3] = 0, t2[2 * B + 4] = 0;
  EXPECT(pc_prefix_key(&cache, t2, 2 * B + 3) != pc_prefix_key(&cache, t2, 2 * B + 4) &&
             pc_prefix_key(&cache, t2, 2 * B + 4) != pc_prefix_key(&cache, t2, 2 * B + 5),
         "trailing zero ids: the length is in the key");
  EXPECT(pc_prefix_key(&other, tok, 2 * B + 3) != pk[2 * B + 3] && pc_prefix_key(&other, tok, 5) != pk[5],
         "another fingerprint, another prefix key");
  pc_free(&cache);
  teardown("keys");
}

int main(void) {
  test_init();
  test_keys();
  return h_report("prefix_cache_keys");
}

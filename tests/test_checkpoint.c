/* test_checkpoint.c: released-layout checkpoints (runtime/load/checkpoint.h,
 * runtime/load/ckpt_config.h) and per-tensor content hashes (issue 18 row 16).
 *
 *  - config.json: the release's nesting (text_config), a flat config and
 *    colibri's short names give the same fields; a missing field and two
 *    spellings that disagree are refused, naming the field;
 *  - plan <-> config round trip: tests/plans/ckpt-small.yaml -> config ->
 *    plan equals the plan (no mismatch from ckpt_plan_compare) and the YAML
 *    of a second import is the same text; flash's config has the released
 *    layer lists (kv 2, 8, 14, 20; index ... 36; 43 compress ratios with the
 *    MTP blocks);
 *  - codecs against hand-worked values: BF16 round to nearest even, E2M1
 *    nibble order (even column in the low nibble), FP8 tile scales, and
 *    the dequantized error bound of each;
 *  - write -> load: every internal tensor of a checkpoint written by
 *    ckpt_write equals, bit for bit, the dequantized file written beside it
 *    (ckpt_write's own dequantization, a separate code path from the
 *    loader's conversion and lookup), the shards are >1 and are mapped;
 *  - refusals, each naming the file or tensor and the reason: a truncated
 *    shard, bad data_offsets, a wrong dtype, a wrong shape, a tensor missing
 *    from the shard the index names, a tensor missing altogether, a foreign
 *    file as a shard, a shard name leaving the directory, a flipped byte
 *    (content hash), an unexpected tensor, a plan unlike the checkpoint;
 *  - mtp.* and vision tensors are skipped and counted; a checkpoint without
 *    hashes loads, and ckpt_record_hashes adds them (then damage is caught);
 *  - a cedar weights file: weights_save writes a hash per tensor, a flipped
 *    byte is refused naming the tensor (before issue 18 row 16 it loaded),
 *    a file without hashes loads and weights_hash_record adds them.
 * Run from the repo root: ./build/tests/test_checkpoint
 */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "ops/formats.h"
#include "runtime/load/checkpoint.h"
#include "tests/harness.h"

static char err[4096];
static char tmp[] = "/tmp/cedar_test_checkpoint_XXXXXX";
static char ref_dir[512], dq_path[512];

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  CEDAR_ASSERT_MSG(system(cmd) == 0, "%s", cmd);
}

/* A fresh copy of the reference checkpoint, named `name`. */
static const char *copy(const char *name) {
  static char dir[600];
  snprintf(dir, sizeof dir, "%s/%s", tmp, name);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, ref_dir, dir);
  CEDAR_ASSERT_MSG(system(cmd) == 0, "%s", cmd);
  return dir;
}

static bool contains(const struct weights_problems *pr, const char *a, const char *b) {
  for (size_t i = 0; i < pr->n; i++)
    if (strstr(pr->msg[i], a) && (!b || strstr(pr->msg[i], b))) return true;
  return false;
}

/* Load dir against p; expect a refusal whose problems name a and b. */
static void expect_refused(const char *what, const struct plan *p, const char *dir, const char *a, const char *b) {
  struct weights w;
  struct weights_problems pr = {0};
  int rc = ckpt_load(&w, p, dir, true, &pr, NULL, err, sizeof err);
  EXPECT(rc != 0, "%s: loaded", what);
  if (rc) EXPECT(contains(&pr, a, b), "%s: no problem naming '%s' and '%s'; got: %s", what, a, b ? b : "", err);
  if (!rc) weights_free(&w);
  weights_problems_free(&pr);
}

/* Patch `len` bytes at the first occurrence of `find` in file path (the
 * header is text) with `repl` (same length). */
static void patch(const char *path, const char *find, const char *repl) {
  FILE *f = fopen(path, "r+b");
  CEDAR_ASSERT(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  char *at = NULL;
  for (size_t i = 8; i + strlen(find) <= n && !at; i++)
    if (!memcmp(buf + i, find, strlen(find))) at = buf + i;
  CEDAR_ASSERT_MSG(at && strlen(find) == strlen(repl), "patch: '%s' not in %s", find, path);
  fseek(f, at - buf, SEEK_SET);
  fwrite(repl, 1, strlen(repl), f);
  fclose(f);
}

/* Flip one bit of byte `at` of tensor `name`'s data in file path. */
static void flip(const char *path, const char *name, long at) {
  st_file_t *f;
  CEDAR_ASSERT_MSG(st_open(path, &f, err, sizeof err) == 0, "%s", err);
  const struct st_tensor *t = st_find(f, name);
  CEDAR_ASSERT_MSG(t && (uint64_t)at < t->nbytes, "%s not in %s", name, path);
  long off = (long)t->offset;
  st_close(f);
  FILE *fp = fopen(path, "r+b");
  uint64_t hlen;
  CEDAR_ASSERT(fp && fread(&hlen, 8, 1, fp) == 1);
  fseek(fp, 8 + (long)hlen + off + at, SEEK_SET);
  int c = fgetc(fp);
  fseek(fp, 8 + (long)hlen + off + at, SEEK_SET);
  fputc(c ^ 0x10, fp);
  fclose(fp);
}

/* Remove the line holding `key` from the (pretty-printed) index. */
static void drop_line(const char *path, const char *key) {
  FILE *f = fopen(path, "rb");
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *at = strstr(buf, key), *end = at ? strchr(at, '\n') : NULL;
  CEDAR_ASSERT_MSG(at && end, "%s not in %s", key, path);
  while (at > buf && at[-1] != '\n') at--;
  memmove(at, end + 1, strlen(end + 1) + 1);
  f = fopen(path, "wb");
  fputs(buf, f);
  fclose(f);
}

/* The shard file holding released tensor `name` (from the index). */
static void shard_of(const char *dir, const char *name, char *out, size_t len) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX);
  FILE *f = fopen(path, "rb");
  CEDAR_ASSERT(f);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char key[200];
  snprintf(key, sizeof key, "\"%s\":", name);
  char *at = strstr(buf, key);
  CEDAR_ASSERT_MSG(at, "%s not in the index", name);
  at = strchr(at + strlen(key), '"') + 1;
  snprintf(out, len, "%s/%.*s", dir, (int)(strchr(at, '"') - at), at);
}

/* Rewrite a shard without tensor `drop` (NULL: keep all) and, when
 * strip_hashes, without its content hashes; extra tensors appended. */
static void rewrite(const char *path, const char *drop, bool strip_hashes, const struct st_tensor *extra, size_t n_extra) {
  st_file_t *f;
  CEDAR_ASSERT_MSG(st_open(path, &f, err, sizeof err) == 0, "%s", err);
  size_t n = st_count(f), k = 0, m = 0;
  struct st_tensor *ts = calloc(n + n_extra + 1, sizeof *ts);
  struct st_meta *meta = calloc(st_meta_count(f) + 1, sizeof *meta);
  for (size_t i = 0; i < n; i++)
    if (!drop || strcmp(st_tensor_at(f, i)->name, drop)) ts[k++] = *st_tensor_at(f, i);
  for (size_t i = 0; i < n_extra; i++) ts[k++] = extra[i];
  for (size_t i = 0; i < st_meta_count(f); i++)
    if (!strip_hashes || strncmp(st_meta_at(f, i)->key, WEIGHTS_HASH_PREFIX, strlen(WEIGHTS_HASH_PREFIX)))
      meta[m++] = *st_meta_at(f, i);
  CEDAR_ASSERT_MSG(st_write(path, ts, k, meta, m, err, sizeof err) == 0, "%s", err);
  free(ts);
  free(meta);
  st_close(f);
}

/* ---- config.json ------------------------------------------------------------ */

static const char cfg_nested[] =
    "{\"model_type\":\"deepseek_v41\",\"image_token_id\":510,\"text_config\":{\"vocab_size\":512,\"hidden_size\":256,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"head_dim\":128,\"qk_rope_head_dim\":32,\"q_lora_rank\":128,"
    "\"o_lora_rank\":128,\"o_groups\":2,\"rms_norm_eps\":1e-20,\"rope_theta\":10000,\"compress_rope_theta\":160000,"
    "\"rope_scaling\":{\"factor\":16,\"beta_fast\":32,\"beta_slow\":1,\"original_max_position_embeddings\":65536},"
    "\"n_routed_experts\":8,\"n_shared_experts\":1,\"num_experts_per_tok\":2,\"moe_intermediate_size\":256,"
    "\"scoring_func\":\"sqrtsoftplus\",\"norm_topk_prob\":true,\"routed_scaling_factor\":1.5,\"sliding_window\":128,"
    "\"compress_ratios\":[0,2,1,1],\"kv_source_layer_ids\":[1,2],\"index_source_layer_ids\":[1,2,3],"
    "\"index_n_heads\":4,\"index_head_dim\":64,\"index_topk\":512,\"candidate_source_layer_id\":2,"
    "\"candidate_topk_blocks\":2048,\"candidate_block_size\":8,\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,"
    "\"swiglu_limit\":10}}";

/* The same in colibri's short names, flat. */
static const char cfg_short[] =
    "{\"image_token_id\":510,\"vocab_size\":512,\"dim\":256,\"n_layers\":4,\"n_heads\":4,\"head_dim\":128,"
    "\"rope_head_dim\":32,\"q_lora_rank\":128,\"o_lora_rank\":128,\"o_groups\":2,\"norm_eps\":1e-20,"
    "\"rope_theta\":10000,\"compress_rope_theta\":160000,\"rope_factor\":16,\"beta_fast\":32,\"beta_slow\":1,"
    "\"original_seq_len\":65536,\"n_routed_experts\":8,\"n_shared_experts\":1,\"n_activated_experts\":2,"
    "\"moe_inter_dim\":256,\"score_func\":\"sqrtsoftplus\",\"norm_topk_prob\":true,\"route_scale\":1.5,"
    "\"window_size\":128,\"compress_ratios\":[0,2,1,1],\"kv_source_layers\":[1,2],\"index_source_layers\":[1,2,3],"
    "\"index_n_heads\":4,\"index_head_dim\":64,\"index_topk\":512,\"candidate_source_layer\":2,"
    "\"candidate_topk_blocks\":2048,\"candidate_block_size\":8,\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-6,"
    "\"swiglu_limit\":10}";

static void test_config(void) {
  struct ckpt_config a, b;
  EXPECT(ckpt_config_parse("nested", cfg_nested, strlen(cfg_nested), &a, err, sizeof err) == 0, "nested: %s", err);
  EXPECT(ckpt_config_parse("short", cfg_short, strlen(cfg_short), &b, err, sizeof err) == 0, "short: %s", err);
  EXPECT(!memcmp(&a, &b, sizeof a), "the nested official config and the flat short-name one differ");
  EXPECT_EQ(a.hidden, 256, "hidden");
  EXPECT_EQ(a.yarn_original_len, 65536, "rope_scaling.original_max_position_embeddings");
  EXPECT_EQ(a.cand_source, 2, "candidate source");
  EXPECT(a.norm_eps == 1e-20, "eps %g", a.norm_eps);
  /* the plan it implies loads, and has the modes the lists say */
  struct plan p;
  EXPECT(ckpt_config_plan(&a, "t", &p, err, sizeof err) == 0, "plan: %s", err);
  EXPECT_EQ(p.layer[0].mode, PLAN_SWA_ONLY, "L0");
  EXPECT_EQ(p.layer[1].mode, PLAN_FULL, "L1");
  EXPECT_EQ(p.layer[2].mode, PLAN_FULL, "L2");
  EXPECT_EQ(p.layer[2].cand, PLAN_CAND_BUILD, "L2 builds the pool");
  EXPECT_EQ(p.layer[3].mode, PLAN_REINDEX, "L3");
  EXPECT_EQ(p.layer[3].cand, PLAN_CAND_READ, "L3 reads the pool");
  EXPECT_EQ(p.layer[3].kv_src, 2, "L3 kv");
  EXPECT_EQ(p.layer[1].region, PLAN_ENCODER, "L1 encoder");
  EXPECT_EQ(p.layer[2].region, PLAN_DECODER, "the decoder starts at the first ratio-1 layer");
  EXPECT(p.model.idx_k_norm && !p.model.q_head_norm && p.model.hc_pairing == PLAN_PAIRING_V41 &&
             p.model.hc_merge == PLAN_MERGE_CARRIED,
         "vendor semantics");
  plan_free(&p);

  /* a short name that disagrees with the official one; a missing field */
  char bad[sizeof cfg_nested + 512];
  snprintf(bad, sizeof bad, "%.*s,\"dim\":512}}", (int)strlen(cfg_nested) - 2, cfg_nested);
  EXPECT(ckpt_config_parse("bad", bad, strlen(bad), &a, err, sizeof err) != 0 && strstr(err, "hidden_size") &&
             strstr(err, "dim"), "disagreeing spellings: %s", err);
  const char *miss = strstr(cfg_nested, "\"head_dim\"");
  snprintf(bad, sizeof bad, "%.*s%s", (int)(miss - cfg_nested), cfg_nested, strstr(miss, ",") + 1);
  EXPECT(ckpt_config_parse("miss", bad, strlen(bad), &a, err, sizeof err) != 0 && strstr(err, "`head_dim`"),
         "missing head_dim: %s", err);
  EXPECT(ckpt_config_parse("junk", "[1,2]", 5, &a, err, sizeof err) != 0, "a JSON array accepted");
  /* a KV source on a window-only layer */
  snprintf(bad, sizeof bad, "%s", cfg_nested);
  char *kv = strstr(bad, "\"kv_source_layer_ids\":[1,2]");
  memcpy(kv, "\"kv_source_layer_ids\":[0,2]", 27);
  EXPECT(ckpt_config_parse("kv0", bad, strlen(bad), &a, err, sizeof err) == 0, "%s", err);
  EXPECT(ckpt_config_plan(&a, "t", &p, err, sizeof err) != 0 && strstr(err, "layer 0"), "kv source L0: %s", err);
  /* Engram rows that the primes do not give */
  snprintf(bad, sizeof bad, "%.*s,\"engram_layer_ids\":[0],\"engram_num_embeddings\":[999],\"engram_max_ngram_size\":4,"
           "\"engram_vocab_size\":1000,\"engram_n_heads\":2,\"engram_head_dim\":32,\"engram_pad_token_id\":2,"
           "\"engram_compressed_vocab_size\":512}}", (int)strlen(cfg_nested) - 2, cfg_nested);
  EXPECT(ckpt_config_parse("rows", bad, strlen(bad), &a, err, sizeof err) == 0, "%s", err);
  EXPECT(ckpt_config_plan(&a, "t", &p, err, sizeof err) != 0 && strstr(err, "engram_num_embeddings[0] = 999"),
         "Engram rows: %s", err);
}

static void test_roundtrip(void) {
  struct plan p, q, r;
  if (!h_load_plan("tests/plans/ckpt-small.yaml", &p)) return;
  struct ckpt_config c, c2;
  char *json, *y1, *y2;
  EXPECT(ckpt_config_from_plan(&p, &c, err, sizeof err) == 0, "from plan: %s", err);
  EXPECT(ckpt_config_json(&c, &json) == 0, "json");
  EXPECT(ckpt_config_parse("rt", json, strlen(json), &c2, err, sizeof err) == 0, "reparse: %s", err);
  EXPECT(ckpt_config_plan(&c2, "rt", &q, err, sizeof err) == 0, "import: %s", err);
  char **msgs;
  size_t n = ckpt_plan_compare(&p, &q, &msgs);
  EXPECT_EQ(n, 0, "ckpt-small -> config -> plan mismatches (first: %s)", n ? msgs[0] : "");
  ckpt_msgs_free(msgs, n);
  /* import -> config -> import: the same YAML text */
  struct ckpt_config c3, c4;
  char *json2;
  EXPECT(ckpt_config_from_plan(&q, &c3, err, sizeof err) == 0, "%s", err);
  EXPECT(ckpt_config_json(&c3, &json2) == 0, "json");
  EXPECT(ckpt_config_parse("rt2", json2, strlen(json2), &c4, err, sizeof err) == 0, "%s", err);
  EXPECT(ckpt_config_plan_yaml(&c2, "rt", &y1, err, sizeof err) == 0 && ckpt_config_plan_yaml(&c4, "rt", &y2, err, sizeof err) == 0,
         "yaml");
  EXPECT(!strcmp(y1, y2), "import(config(import(C))) differs from import(C)");
  free(y1), free(y2), free(json), free(json2);
  plan_free(&q);
  /* a plan with a different width mismatches, named */
  if (h_load_plan("plans/v41-mini.yaml", &r)) {
    n = ckpt_plan_compare(&r, &p, &msgs);
    bool named = false;
    for (size_t i = 0; i < n; i++) named |= strstr(msgs[i], "model.n_layers: plan 40, checkpoint 6") != NULL;
    EXPECT(n > 5 && named, "v41-mini vs ckpt-small: %zu mismatches, n_layers named %d", n, named);
    ckpt_msgs_free(msgs, n);
    plan_free(&r);
  }
  plan_free(&p);
  /* flash: the released lists */
  if (h_load_plan("plans/v41-flash.yaml", &p)) {
    EXPECT(ckpt_config_from_plan(&p, &c, err, sizeof err) == 0, "flash: %s", err);
    EXPECT_EQ(c.kv_sources.n, 4, "flash kv sources");
    EXPECT_EQ(c.kv_sources.v[3], 20, "flash last kv source");
    EXPECT_EQ(c.index_sources.n, 8, "flash index sources");
    EXPECT_EQ(c.index_sources.v[7], 36, "flash last index source");
    EXPECT_EQ(c.ratios.n, 43, "compress_ratios with the 3 MTP blocks");
    EXPECT_EQ(c.cand_source, 20, "flash candidate source");
    EXPECT_EQ(c.engram_rows.v[0], 384006168, "flash Engram rows L1");
    EXPECT_EQ(c.engram_rows.v[1], 384016682, "flash Engram rows L14");
    plan_free(&p);
  }
}

/* ---- codecs ----------------------------------------------------------------- */

static void test_codecs(void) {
  EXPECT_EQ(ckpt_f32_to_bf16(1.0f), 0x3f80, "bf16(1)");
  EXPECT_EQ(ckpt_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80, "a tie rounds to even (down)");
  EXPECT_EQ(ckpt_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-7f), 0x3f82, "a tie rounds to even (up)");
  EXPECT(ckpt_bf16_to_f32(0xc000) == -2.0f, "bf16 -2");
  /* FP4: one row of 32, values 0.5 * k: amax 6 -> scale 2^0; even column in the low nibble */
  float x[64], y[64];
  uint8_t q[32], s[2];
  for (int i = 0; i < 32; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i % 8) * 0.5f * (i % 8 < 5 ? 1.0f : 0.0f);
  x[31] = 6.0f;
  ckpt_fp4_quant(q, s, x, 1, 32);
  EXPECT_EQ(s[0], 127, "FP4 row scale 2^0 for amax 6");
  EXPECT_EQ(q[1] & 15, op_e2m1_encode(x[2]), "column 2 in the low nibble of byte 1");
  EXPECT_EQ(q[1] >> 4, op_e2m1_encode(x[3]), "column 3 in the high nibble of byte 1");
  ckpt_fp4_dequant(y, q, s, 1, 32);
  for (int i = 0; i < 32; i++) EXPECT(y[i] == x[i], "FP4 exact value %d: %g vs %g", i, y[i], x[i]);
  /* FP8 tiles: a 40 x 40 matrix has 2 x 2 tiles; each element within half an
   * E4M3 ulp (2^-4 relative) of its value, or 2^-10 of the tile scale near 0 */
  static float a[40 * 40], b[40 * 40];
  uint8_t qa[40 * 40], sa[4];
  uint64_t seed = 7;
  h_fill(a, 40 * 40, &seed, -3, 3);
  a[39 * 40 + 39] = 100;  /* the last tile's amax */
  ckpt_fp8_quant(qa, sa, a, 40, 40);
  EXPECT_EQ(sa[3], 127 - 2, "tile (1,1): 2^ceil(log2(100/448)) = 2^-2");
  ckpt_fp8_dequant(b, qa, sa, 40, 40);
  for (int i = 0; i < 40 * 40; i++) {
    float sc = op_e8m0_decode(sa[(i / 40 / 32) * 2 + (i % 40) / 32]);
    EXPECT(fabsf(b[i] - a[i]) <= fmaxf(fabsf(a[i]) * 0x1p-4f, sc * 0x1p-10f), "FP8 %d: %g vs %g", i, b[i], a[i]);
  }
}

/* ---- write -> load ------------------------------------------------------------ */

static void test_write_load(const struct plan *p) {
  struct weights syn, got, dq;
  EXPECT(weights_synth(&syn, p, 5, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  EXPECT(ckpt_write(&syn, p, ref_dir, 2u << 20, dq_path, err, sizeof err) == 0, "write: %s", err);
  weights_free(&syn);
  struct ckpt_load_stats st;
  int rc = ckpt_load(&got, p, ref_dir, true, NULL, &st, err, sizeof err);
  EXPECT(rc == 0, "load: %s", err);
  EXPECT(weights_load(&dq, p, dq_path, NULL, err, sizeof err) == 0, "dequantized file: %s", err);
  if (rc) return;
  EXPECT(st.n_shards > 1, "%zu shards", st.n_shards);
  EXPECT_EQ(st.hashed, st.n_tensors, "every tensor's hash verified");
  EXPECT(st.in_place_bytes > 0 || st.copied_bytes > 0, "F32 tensors used in place or copied");
  size_t same = 0;
  for (size_t i = 0; i < got.list.n; i++) {
    const struct weights_spec *s = &got.list.t[i];
    const void *d = weights_get(&dq, s->name, NULL);
    bool eq = d && !memcmp(got.data[i], d, s->nbytes);
    same += eq;
    EXPECT(eq, "%s: the loaded tensor differs from the writer's dequantized values", s->name);
    EXPECT((uintptr_t)got.data[i] % WEIGHTS_ALIGN == 0, "%s aligned", s->name);
  }
  EXPECT_EQ(same, got.list.n, "tensors equal bit for bit");
  weights_free(&got);
  weights_free(&dq);
}

static void test_refusals(const struct plan *p) {
  char shard[800], path[800];
  const char *d;

  d = copy("truncated");
  shard_of(d, "layers.1.attn.wq_b.weight", shard, sizeof shard);
  EXPECT(truncate(shard, 4096) == 0, "truncate");
  expect_refused("truncated", p, d, strrchr(shard, '/') + 1, NULL);

  d = copy("offsets");
  shard_of(d, "norm.weight", shard, sizeof shard);
  patch(shard, "\"data_offsets\":[0,", "\"data_offsets\":[1,");
  expect_refused("bad data_offsets", p, d, "data_offsets", NULL);

  d = copy("dtype");
  shard_of(d, "layers.1.attn.q_norm.weight", shard, sizeof shard);
  patch(shard, "\"layers.1.attn.q_norm.weight\":{\"dtype\":\"BF16\"", "\"layers.1.attn.q_norm.weight\":{\"dtype\":\"F16\" ");
  expect_refused("wrong dtype", p, d, "layers.1.attn.q_norm.weight", "dtype F16");

  d = copy("dtype8");
  shard_of(d, "layers.1.attn.wq_b.weight", shard, sizeof shard);
  patch(shard, "\"layers.1.attn.wq_b.weight\":{\"dtype\":\"F8_E4M3\"", "\"layers.1.attn.wq_b.weight\":{\"dtype\":\"F8_E5M2\"");
  expect_refused("FP8 of the wrong kind", p, d, "layers.1.attn.wq_b.weight", "F8_E5M2");

  d = copy("shape");
  shard_of(d, "layers.2.attn.wkv.scale", shard, sizeof shard);
  patch(shard, "\"layers.2.attn.wkv.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[4,8]",
        "\"layers.2.attn.wkv.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[8,4]");
  expect_refused("wrong scale shape", p, d, "layers.2.attn.wkv.scale", "shape [8, 4]");

  d = copy("not_in_shard");
  shard_of(d, "layers.3.ffn.experts.5.w2.scale", shard, sizeof shard);
  rewrite(shard, "layers.3.ffn.experts.5.w2.scale", false, NULL, 0);
  expect_refused("in the index, not the shard", p, d, "layers.3.ffn.experts.5.w2.scale", "no such tensor");

  d = copy("missing");
  shard_of(d, "layers.3.ffn.experts.5.w2.scale", shard, sizeof shard);
  rewrite(shard, "layers.3.ffn.experts.5.w2.scale", false, NULL, 0);
  snprintf(path, sizeof path, "%s/%s", d, CKPT_INDEX);
  drop_line(path, "\"layers.3.ffn.experts.5.w2.scale\"");
  expect_refused("missing", p, d, "layers.3.ffn.experts.5.w2.scale", "missing");

  d = copy("foreign");
  shard_of(d, "embed.weight", shard, sizeof shard);
  sh("cp '%s/config.json' '%s'", d, shard);
  expect_refused("foreign file", p, d, strrchr(shard, '/') + 1, NULL);

  d = copy("traversal");
  snprintf(path, sizeof path, "%s/%s", d, CKPT_INDEX);
  shard_of(d, "norm.weight", shard, sizeof shard);
  char from[200], to[200];
  snprintf(from, sizeof from, "\"norm.weight\":\t\"%s\"", strrchr(shard, '/') + 1);
  snprintf(to, sizeof to, "\"norm.weight\":\t\"../%s\"", strrchr(shard, '/') + 4);
  patch(path, from, to);
  expect_refused("path traversal", p, d, "norm.weight", "not a plain");

  d = copy("flipped");
  shard_of(d, "layers.0.engram.wkv.weight", shard, sizeof shard);
  flip(shard, "layers.0.engram.wkv.weight", 17);
  expect_refused("flipped byte", p, d, "layers.0.engram.wkv.weight", "content hash");

  d = copy("extra");
  shard_of(d, "norm.weight", shard, sizeof shard);
  float v[4] = {1, 2, 3, 4};
  struct st_tensor ex[] = {{.name = "layers.0.attn.bogus.weight", .dtype = ST_F32, .ndim = 1, .shape = {4}, .nbytes = 16, .data = v}};
  rewrite(shard, NULL, false, ex, 1);
  expect_refused("extra tensor not in the index", p, d, "layers.0.attn.bogus.weight", "not in");

  /* a plan unlike the checkpoint: every mismatch named */
  struct plan q;
  struct weights_problems pr = {0};
  EXPECT(ckpt_plan(ref_dir, "plans/v41-mini.yaml", &q, &pr, err, sizeof err) != 0, "v41-mini accepted for ckpt-small");
  EXPECT(contains(&pr, "model.n_layers", "checkpoint 6"), "mismatches not named: %s", err);
  weights_problems_free(&pr);
  EXPECT(ckpt_plan(ref_dir, "tests/plans/ckpt-small-v4.yaml", &q, &pr, err, sizeof err) != 0,
         "V4 options accepted for ckpt-small");
  EXPECT(contains(&pr, "model.mhc.pairing", NULL) && contains(&pr, "model.mhc.merge", NULL) &&
             contains(&pr, "model.indexer.k_norm", NULL),
         "mismatches not named: %s", err);
  weights_problems_free(&pr);
  EXPECT(ckpt_plan(ref_dir, "tests/plans/ckpt-small.yaml", &q, &pr, err, sizeof err) == 0, "ckpt-small: %s", err);
  plan_free(&q);
  weights_problems_free(&pr);
}

/* mtp.* tensors of a block past the plan's drafter (mtp.7: the plan has 3)
 * and vision tensors in an extra shard (listed in the index): skipped and
 * counted; a checkpoint without hashes loads, and recording adds them. */
static void test_skips_and_hashes(const struct plan *p) {
  const char *d = copy("skips");
  char path[800], shard[800];
  float v[8] = {0};
  struct st_tensor ex[] = {
      {.name = "mtp.7.attn_norm.weight", .dtype = ST_F32, .ndim = 1, .shape = {8}, .nbytes = 32, .data = v},
      {.name = "mtp.7.markov_head.embed.weight", .dtype = ST_F32, .ndim = 1, .shape = {8}, .nbytes = 32, .data = v},
      {.name = "vision.patch_embed.weight", .dtype = ST_F32, .ndim = 1, .shape = {8}, .nbytes = 32, .data = v},
      {.name = "image_newline", .dtype = ST_F32, .ndim = 1, .shape = {8}, .nbytes = 32, .data = v}};
  snprintf(shard, sizeof shard, "%s/model-extra.safetensors", d);
  EXPECT(st_write(shard, ex, 4, NULL, 0, err, sizeof err) == 0, "%s", err);
  snprintf(path, sizeof path, "%s/%s", d, CKPT_INDEX);
  {
    FILE *f = fopen(path, "rb");
    static char buf[1 << 20], out[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *at = strstr(buf, "\"weight_map\":\t{") + strlen("\"weight_map\":\t{");
    snprintf(out, sizeof out, "%.*s\"mtp.7.attn_norm.weight\":\"model-extra.safetensors\","
             "\"mtp.7.markov_head.embed.weight\":\"model-extra.safetensors\","
             "\"vision.patch_embed.weight\":\"model-extra.safetensors\",\"image_newline\":\"model-extra.safetensors\",%s",
             (int)(at - buf), buf, at);
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
  }
  struct weights w;
  struct ckpt_load_stats st;
  EXPECT(ckpt_load(&w, p, d, true, NULL, &st, err, sizeof err) == 0, "with mtp and vision: %s", err);
  EXPECT_EQ(st.skipped_mtp, 2, "mtp.* skipped");
  EXPECT_EQ(st.skipped_vision, 2, "vision skipped");
  EXPECT_EQ(st.unhashed, 4, "the extra shard has no hashes");
  weights_free(&w);

  /* strip every hash: it loads; record them; then a flipped byte is caught */
  d = copy("nohash");
  shard_of(d, "norm.weight", shard, sizeof shard);
  rewrite(shard, NULL, true, NULL, 0);
  EXPECT(ckpt_load(&w, p, d, true, NULL, &st, err, sizeof err) == 0, "without hashes: %s", err);
  EXPECT(st.unhashed > 0, "unhashed %zu", st.unhashed);
  weights_free(&w);
  size_t added;
  EXPECT(ckpt_record_hashes(d, &added, err, sizeof err) == 0, "record: %s", err);
  EXPECT_EQ(added, st.unhashed, "hashes recorded");
  EXPECT(ckpt_load(&w, p, d, true, NULL, &st, err, sizeof err) == 0, "after recording: %s", err);
  EXPECT_EQ(st.unhashed, 0, "none left unhashed");
  weights_free(&w);
}

/* Issue 18 row 16 on a cedar weights file. */
static void test_weights_file_hash(const struct plan *p) {
  struct weights w, got;
  char path[600];
  snprintf(path, sizeof path, "%s/w.safetensors", tmp);
  EXPECT(weights_synth(&w, p, 3, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  EXPECT(weights_save(&w, path, err, sizeof err) == 0, "%s", err);
  weights_free(&w);
  st_file_t *f;
  CEDAR_ASSERT(st_open(path, &f, err, sizeof err) == 0);
  const struct st_tensor *t = st_find(f, "layers.2.attn.wq_a");
  EXPECT(t && st_meta_get(f, "cedar.hash.layers.2.attn.wq_a"), "weights_save wrote no content hash");
  st_close(f);
  flip(path, "layers.2.attn.wq_a", 100);
  struct weights_problems pr = {0};
  EXPECT(weights_load(&got, p, path, &pr, err, sizeof err) != 0, "a flipped byte in layers.2.attn.wq_a loaded");
  EXPECT(contains(&pr, "layers.2.attn.wq_a", "content hash"), "the refusal does not name the tensor: %s", err);
  weights_problems_free(&pr);
  /* without hashes (rewritten) it loads; recording adds one per tensor */
  rewrite(path, NULL, true, NULL, 0);
  EXPECT(weights_load(&got, p, path, NULL, err, sizeof err) == 0, "no hashes: %s", err);
  size_t n = got.list.n, added;
  weights_free(&got);
  EXPECT(weights_hash_record(path, &added, err, sizeof err) == 0, "%s", err);
  EXPECT_EQ(added, n, "recorded");
  EXPECT(weights_hash_record(path, &added, err, sizeof err) == 0 && added == 0, "recording twice adds nothing");
}

int main(void) {
  CEDAR_ASSERT(mkdtemp(tmp));
  snprintf(ref_dir, sizeof ref_dir, "%s/ref", tmp);
  snprintf(dq_path, sizeof dq_path, "%s/dq.safetensors", tmp);
  test_config();
  test_roundtrip();
  test_codecs();
  struct plan p;
  if (h_load_plan("tests/plans/ckpt-small.yaml", &p)) {
    test_write_load(&p);
    test_refusals(&p);
    test_skips_and_hashes(&p);
    test_weights_file_hash(&p);
    plan_free(&p);
  }
  sh("rm -rf '%s'%s", tmp, "");
  return h_report("checkpoint");
}

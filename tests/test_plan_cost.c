/* test_plan_cost.c: plan accounting (scheduler/plan_cost.c) against SPEC's
 * figures, exactly.
 *
 * The flash plan is built by hand here, mirroring SPEC 2.1/2.2 with the same
 * derivation loop as SPEC's pseudo-code, and also loaded from
 * plans/v41-flash.yaml: both must give every figure of SPEC 4.5, 4.6, 6.2, 6.4
 * and 6.6. Then the accounting is generalized: another window, an added
 * decoder source, a ratio-4 source, CED off, odd prompt lengths, and bad
 * queries.
 *
 * Not tested here: the printing (tests/cli/plan_cost.sh does that).
 * Run: ctest --test-dir build -R plan_cost, or build/tests/test_plan_cost
 * from the repository root.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "scheduler/plan.h"
#include "scheduler/plan_cost.h"

static int failures;

#define EXPECT_I64(got, want)                                                        \
  do {                                                                              \
    int64_t _g = (int64_t)(got), _w = (int64_t)(want);                              \
    if (_g != _w) {                                                                 \
      fprintf(stderr, "%s:%d: %s = %" PRId64 ", want %" PRId64 "\n", __FILE__,     \
              __LINE__, #got, _g, _w);                                              \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

#define EXPECT_REAL(got, want)                                                      \
  do {                                                                              \
    double _g = (got), _w = (want);                                                 \
    /* exact-integer or short-fraction rates: 1e-9 relative is rounding only */     \
    if (!(_g - _w <= 1e-9 * (_w < 0 ? -_w : _w) && _w - _g <= 1e-9 * (_w < 0 ? -_w : _w))) { \
      fprintf(stderr, "%s:%d: %s = %.12g, want %.12g\n", __FILE__, __LINE__, #got, \
              _g, _w);                                                              \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

/* ---- hand-built plans -------------------------------------------------- */

static bool in_list(int x, const int *list, int n) {
  for (int i = 0; i < n; i++)
    if (list[i] == x) return true;
  return false;
}

/* SPEC 2.1's derivation, for any layer count and source lists: layers below
 * n_swa are SWA-only; encoder layers have ratio enc_ratio, decoder layers
 * dec_ratio; the first decoder index source builds the candidate pool and
 * the decoder reindex layers read it. */
static void build_plan(struct plan *p, int n_layers, int n_enc, int n_swa, const int *kv, int n_kv,
                       const int *ix, int n_ix, int enc_ratio, int dec_ratio) {
  memset(p, 0, sizeof *p);
  struct plan_model *m = &p->model;
  m->n_layers = n_layers, m->hidden = 5120, m->heads = 64, m->head_dim = 512;
  m->idx_heads = 32, m->idx_head_dim = 128, m->topk = 512, m->window = 128;
  m->cand_block = 8, m->cand_top_blocks = 2048;
  m->main_kv = (struct plan_format){PLAN_E2M1, PLAN_SCALE_E4M3, 16, PLAN_RULE_AUTO, -1, false};
  m->indexer_k = (struct plan_format){PLAN_E2M1, PLAN_SCALE_E8M0, 32, PLAN_RULE_AUTO, -1, false};
  m->swa = (struct plan_format){PLAN_E4M3, PLAN_SCALE_E8M0, 32, PLAN_RULE_AUTO, -1, false}; /* Appendix V #21 */
  p->serving.ced = true;
  p->serving.replay_encoder = p->serving.replay_decoder = 128;
  p->n_layers = n_layers;
  int kv_src = -1, topk_src = -1, pool = -1;
  for (int i = 0; i < n_layers; i++) {
    struct plan_layer *l = &p->layer[i];
    l->index = i;
    l->region = i < n_enc ? PLAN_ENCODER : PLAN_DECODER;
    l->kv_src = l->topk_src = l->pool_src = -1;
    if (i < n_swa) continue; /* mode SWA_ONLY, ratio 0 */
    l->ratio = i < n_enc ? enc_ratio : dec_ratio;
    if (in_list(i, kv, n_kv)) kv_src = i;
    if (in_list(i, ix, n_ix)) topk_src = i;
    l->mode = in_list(i, kv, n_kv) ? PLAN_FULL : in_list(i, ix, n_ix) ? PLAN_REINDEX : PLAN_REUSE;
    l->kv_src = kv_src;
    l->topk_src = topk_src;
    if (l->region == PLAN_DECODER && plan_is_index_source(l)) {
      if (pool < 0) pool = i, l->cand = PLAN_CAND_BUILD;
      else if (l->mode == PLAN_REINDEX) l->cand = PLAN_CAND_READ, l->pool_src = pool;
    }
  }
}

static const int flash_kv[] = {2, 8, 14, 20};
static const int flash_ix[] = {2, 8, 14, 20, 24, 28, 32, 36};

static void build_flash(struct plan *p) { build_plan(p, 40, 20, 2, flash_kv, 4, flash_ix, 8, 2, 1); }

static struct plan_cost *cost_of(const struct plan *p, int64_t tokens, int64_t prompt, int64_t hit,
                                 bool swa_miss) {
  static struct plan_cost c; /* large: keep it off the stack */
  struct plan_cost_query q;
  plan_cost_query_init(&q);
  q.tokens = tokens;
  q.prompt = prompt;
  q.has_hit = hit >= 0;
  q.hit = hit;
  q.swa_miss = swa_miss;
  int rc = plan_cost_compute(p, &q, &c);
  if (rc != CEDAR_OK) {
    fprintf(stderr, "plan_cost_compute failed: %s\n", c.error);
    exit(1);
  }
  return &c;
}

/* ---- SPEC figures --------------------------------------------------------- */

static void test_formats(void) {
  struct plan_format main_kv = {PLAN_E2M1, PLAN_SCALE_E4M3, 16, PLAN_RULE_AUTO, -1, false};
  struct plan_format idx = {PLAN_E2M1, PLAN_SCALE_E8M0, 32, PLAN_RULE_AUTO, -1, false};
  struct plan_format swa = {PLAN_E4M3, PLAN_SCALE_F32, 512, PLAN_RULE_AUTO, -1, false};
  struct plan_format bf16 = {PLAN_BF16, PLAN_SCALE_NONE, 0, PLAN_RULE_AUTO, -1, false};
  EXPECT_I64(plan_format_bytes(&main_kv, 512), 288); /* SPEC 4.2 */
  EXPECT_I64(plan_format_payload_bytes(&main_kv, 512), 256);
  EXPECT_I64(plan_format_bytes(&idx, 128), 68); /* SPEC 4.3 */
  EXPECT_I64(plan_format_payload_bytes(&swa, 512), 512); /* SPEC 4.4 */
  EXPECT_I64(plan_format_bytes(&swa, 512), 516);
  EXPECT_I64(plan_format_bytes(&swa, 513), 513 + 8); /* a short last block still has a scale */
  EXPECT_I64(plan_format_bytes(&bf16, 512), 1024);
  EXPECT_I64(plan_format_payload_bytes(&main_kv, 7), 4); /* an odd nibble count rounds up */
  struct plan_format f32 = {PLAN_F32, PLAN_SCALE_NONE, 0, PLAN_RULE_AUTO, -1, false};
  EXPECT_I64(plan_format_bytes(&f32, 3), 12);
}

/* SPEC 4.5, 4.6, 5.2, 6.1, 6.2 at the defaults (N = 10^6, n = 1024). */
static void expect_flash_defaults(const struct plan *p) {
  struct plan_cost *c = cost_of(p, 1000000, 1024, -1, false);
  EXPECT_I64(c->n_layers, 40);
  EXPECT_I64(c->n_encoder, 20);
  EXPECT_I64(c->n_decoder, 20);
  EXPECT_I64(c->n_csa, 38);
  EXPECT_I64(c->n_index_sources, 8);
  EXPECT_I64(c->n_sources, 4);
  static const int readers[] = {6, 6, 6, 20};
  for (int k = 0; k < c->n_sources && k < 4; k++) {
    EXPECT_I64(c->src[k].layer, flash_kv[k]);
    EXPECT_I64(c->src[k].main_bytes, 288);
    EXPECT_I64(c->src[k].indexer_bytes, 68);
    EXPECT_I64(c->src[k].entry_bytes, 356);
    EXPECT_I64(c->src[k].entries, k < 3 ? 500000 : 1000000);
    EXPECT_I64(c->src[k].readers, readers[k]);
    EXPECT_I64(c->src[k].tail_bytes, k < 3 ? 4096 : 0);
    EXPECT_I64(c->src[k].cold_entries, k < 3 ? 512 : 1024); /* SPEC 6.1 state table */
  }
  EXPECT_REAL(c->bytes_per_token, 890);
  EXPECT_I64(c->entries, 2500000);
  EXPECT_I64(c->bytes, 890000000);
  EXPECT_I64(c->baseline_entries, 29000000);
  EXPECT_I64(c->baseline_bytes, 29000000LL * 356);
  EXPECT_REAL(c->baseline_bytes_per_token, 18 * 178 + 20 * 356);
  EXPECT_I64(c->swa_payload_per_layer, 65536);
  EXPECT_I64(c->swa_payload_bytes, 2621440);
  EXPECT_I64(c->swa_scale_bytes, 40 * 128 * 16); /* Appendix V #21: one E8M0 scale per 32 (528-B entries) */
  EXPECT_I64(c->tail_bytes, 12288);
  EXPECT_I64(c->n_tail_sources, 3);
  EXPECT_I64(c->cold.token_layers, 23040);
  EXPECT_I64(c->cold.dense_token_layers, 40960);
  EXPECT_I64(c->cold.decoder.begin, 896);
  EXPECT_I64(c->cold.encoder_positions, 1024);
  EXPECT_I64(c->cold.new_entries, 3 * 512 + 1024);
  EXPECT_I64(c->cold.new_bytes, (3 * 512 + 1024) * 356);
  /* SPEC 4.6: query at p = N; L20 scans N+1, L2/8/14 floor((N+1)/2), reindex 16384 each. */
  EXPECT_I64(c->idx_position, 1000000);
  EXPECT_I64(c->n_indexers, 8);
  EXPECT_I64(c->idx_full_key_dots, 3 * 500000 + 1000001);
  EXPECT_I64(c->idx_reindex_key_dots, 4 * 16384);
  EXPECT_I64(c->idx_key_dots, 3 * 500000 + 1000001 + 4 * 16384);
  EXPECT_I64(c->idx_per_layer_key_dots, 18 * 500000 + 20 * 1000001);
}

/* SPEC 6.6: hit 4096, prompt 4100, encoder SWA miss; and the SWA-hit variant. */
static void expect_flash_hit(const struct plan *p) {
  struct plan_cost *c = cost_of(p, 1000000, 4100, 4096, true);
  const struct plan_cost_prefill *h = &c->hit;
  EXPECT_I64(h->encoder_replay.begin, 3968);
  EXPECT_I64(h->encoder_replay.end, 4096);
  EXPECT_I64(h->encoder_positions, 132);
  EXPECT_I64(h->decoder.begin, 3972);
  EXPECT_I64(h->decoder.end, 4100);
  EXPECT_I64(h->decoder_prefix, 124);
  EXPECT_I64(h->decoder_suffix, 4);
  EXPECT_I64(h->decoder_positions, 128);
  EXPECT_I64(h->new_entries, 10);
  EXPECT_I64(h->new_bytes, 3560);
  EXPECT_I64(h->new_bytes, 4 * (int64_t)c->bytes_per_token);
  EXPECT_I64(h->token_layers, 5200);
  EXPECT_I64(h->dense_token_layers, 160);
  EXPECT_I64(c->src[0].hit_entries, 2);
  EXPECT_I64(c->src[3].hit_entries, 4);
  EXPECT_I64(c->src[3].hit_bytes, 1424);

  c = cost_of(p, 1000000, 4100, 4096, false); /* snapshot at c: no encoder replay */
  EXPECT_I64(c->hit.encoder_positions, 4);
  EXPECT_I64(c->hit.token_layers, 20 * 4 + 20 * 128);

  c = cost_of(p, 1000000, 100, 60, true); /* replay starts at 0 near the beginning */
  EXPECT_I64(c->hit.encoder_replay.begin, 0);
  EXPECT_I64(c->hit.encoder_positions, 100);
  EXPECT_I64(c->hit.decoder.begin, 0);
  EXPECT_I64(c->hit.decoder_prefix, 60);
  EXPECT_I64(c->hit.token_layers, 40 * 100);
  EXPECT_I64(c->cold.token_layers, 40 * 100); /* SPEC 6.2: n <= 128 saves nothing */
}

/* SPEC 6.4 and odd prompts: a ratio-2 group counts only once complete. */
static void expect_flash_odd(const struct plan *p) {
  static const int64_t ns[] = {1, 2, 3, 1023, 1025, 1026, 4097, 999999};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
    int64_t n = ns[i];
    struct plan_cost *c = cost_of(p, n, n, -1, false);
    EXPECT_I64(c->entries, 3 * (n / 2) + n);
    EXPECT_I64(c->bytes, 356 * (3 * (n / 2) + n));
    EXPECT_I64(c->cold.new_bytes, 356 * (3 * (n / 2) + n));
  }
  struct plan_cost *c = cost_of(p, 1025, 1025, -1, false);
  EXPECT_I64(c->src[0].entries, 512);
  c = cost_of(p, 1026, 1026, -1, false);
  EXPECT_I64(c->src[0].entries, 513);
  c = cost_of(p, 1000000, 1025, 1024, false); /* odd hit boundary: no new encoder group */
  EXPECT_I64(c->hit.new_entries, 1);
  c = cost_of(p, 1000000, 1026, 1025, false); /* ...and the group completes one later */
  EXPECT_I64(c->hit.new_entries, 3 + 1);
  c = cost_of(p, 0, 1, -1, false); /* empty context: the query at p = 0 */
  EXPECT_I64(c->entries, 0);
  EXPECT_I64(c->idx_key_dots, 1 + 4); /* only L20's own entry: L20 and 4 reindex layers */
}

static void expect_flash(const struct plan *p) {
  expect_flash_defaults(p);
  expect_flash_hit(p);
  expect_flash_odd(p);
}

/* ---- generalizations ---------------------------------------------------- */

static void test_window(void) {
  static struct plan p;
  build_flash(&p);
  p.model.window = 64;
  p.serving.replay_encoder = p.serving.replay_decoder = -1; /* unset: follow the window */
  struct plan_cost *c = cost_of(&p, 1000000, 1024, 1000, true);
  EXPECT_I64(c->swa_payload_bytes, 40 * 64 * 512);
  EXPECT_I64(c->cold.token_layers, 20 * 1024 + 20 * 64);
  EXPECT_I64(c->hit.encoder_replay.begin, 1000 - 64);
  EXPECT_I64(c->hit.decoder.begin, 1024 - 64);
  EXPECT_REAL(c->bytes_per_token, 890); /* global KV does not depend on the window */
}

/* A second decoder source at L30 (L30..39 read it; L32/L36 still rescore in
 * L20's pool, which now caps their scan of L30's entries). */
static void test_added_source(void) {
  static struct plan p;
  static const int kv[] = {2, 8, 14, 20, 30};
  static const int ix[] = {2, 8, 14, 20, 24, 28, 30, 32, 36};
  build_plan(&p, 40, 20, 2, kv, 5, ix, 9, 2, 1);
  struct plan_cost *c = cost_of(&p, 1024, 1024, -1, false);
  EXPECT_I64(c->n_sources, 5);
  EXPECT_I64(c->src[3].entries, 1024);
  EXPECT_I64(c->src[4].entries, 1024);
  EXPECT_I64(c->src[0].entries, 512);
  EXPECT_I64(c->src[3].readers, 10);
  EXPECT_I64(c->src[4].readers, 10);
  EXPECT_REAL(c->bytes_per_token, 890 + 356);
  EXPECT_I64(c->entries, 3 * 512 + 2 * 1024);
  c = cost_of(&p, 1000000, 4100, 4096, true);
  EXPECT_I64(c->hit.new_entries, 3 * 2 + 2 * 4);
  EXPECT_I64(c->hit.new_bytes, 14 * 356);
  EXPECT_I64(c->tail_bytes, 12288); /* ratio-1 sources have no tail */
  EXPECT_I64(c->idx_key_dots, 3 * 500000 + 2 * 1000001 + 4 * 16384);
}

/* Ratio-4 encoder sources, and the baseline with a different ratio. */
static void test_ratio4(void) {
  static struct plan p;
  build_plan(&p, 40, 20, 2, flash_kv, 4, flash_ix, 8, 4, 1);
  struct plan_cost *c = cost_of(&p, 1000, 1000, -1, false);
  EXPECT_I64(c->src[0].entries, 250);
  EXPECT_REAL(c->bytes_per_token, 3 * 89.0 + 356);
  EXPECT_I64(c->tail_bytes, 3 * (3 * 1024 * 4));
  EXPECT_I64(c->idx_full_key_dots, 3 * (1001 / 4) + 1001);
  EXPECT_I64(c->baseline_entries, 18 * 250 + 20 * 1000);
  c = cost_of(&p, 1000, 1003, 1001, false); /* groups [1000,1004) incomplete: nothing new */
  EXPECT_I64(c->hit.new_entries, 2);
}

static void test_ced_off(void) {
  static struct plan p;
  build_flash(&p);
  p.serving.ced = false;
  struct plan_cost *c = cost_of(&p, 1000000, 4100, 4096, true);
  EXPECT_I64(c->cold.token_layers, 40 * 4100);
  EXPECT_I64(c->cold.token_layers, c->cold.dense_token_layers);
  EXPECT_I64(c->hit.token_layers, 40 * (128 + 4)); /* every layer replays and runs the suffix */
  EXPECT_I64(c->hit.decoder.begin, 3968);
  EXPECT_I64(c->hit.new_bytes, 3560); /* global growth does not depend on CED */
  c = cost_of(&p, 1000000, 4100, 4096, false);
  EXPECT_I64(c->hit.token_layers, 160);
}

static void test_bad_queries(void) {
  static struct plan p;
  static struct plan_cost c;
  build_flash(&p);
  struct plan_cost_query q;
  char msg[200];
  plan_cost_query_init(&q);
  EXPECT_I64(plan_cost_query_check(&q, msg, sizeof msg), CEDAR_OK);
  q.has_hit = true, q.prompt = 4100, q.hit = 4101;
  EXPECT_I64(plan_cost_compute(&p, &q, &c), CEDAR_EINVAL);
  if (!strstr(c.error, "--hit")) fprintf(stderr, "message lacks the flag: %s\n", c.error), failures++;
  q.hit = -1;
  EXPECT_I64(plan_cost_query_check(&q, msg, sizeof msg), CEDAR_EINVAL);
  q.hit = 0, q.prompt = 0;
  EXPECT_I64(plan_cost_query_check(&q, msg, sizeof msg), CEDAR_EINVAL);
  plan_cost_query_init(&q);
  q.swa_miss = true;
  EXPECT_I64(plan_cost_query_check(&q, msg, sizeof msg), CEDAR_EINVAL);
  plan_cost_query_init(&q);
  q.tokens = PLAN_COST_MAX_TOKENS + 1;
  EXPECT_I64(plan_cost_compute(&p, &q, &c), CEDAR_EINVAL);
  q.tokens = PLAN_COST_MAX_TOKENS;
  EXPECT_I64(plan_cost_compute(&p, &q, &c), CEDAR_OK); /* the limit itself fits for flash */
  EXPECT_I64(c.baseline_entries, 29 * PLAN_COST_MAX_TOKENS);
  plan_cost_query_init(&q);
  p.model.head_dim = p.model.window = 1 << 30; /* 40 SWA rings of 2^60 bytes */
  EXPECT_I64(plan_cost_compute(&p, &q, &c), CEDAR_EINVAL);
  if (!strstr(c.error, "64-bit")) fprintf(stderr, "overflow message: %s\n", c.error), failures++;
  build_flash(&p);
  plan_cost_query_init(&q);
  p.layer[5].kv_src = 4; /* a reuse layer, not a source */
  EXPECT_I64(plan_cost_compute(&p, &q, &c), CEDAR_EINVAL);
}

/* ---- the real plan file ---------------------------------------------------- */

static void test_flash_file(void) {
  const char *path = "plans/v41-flash.yaml";
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "%s: missing (run from the repository root)\n", path);
    failures++;
    return;
  }
  static struct plan p;
  struct plan_diags diags = {0};
  if (plan_load(path, &p, &diags) != CEDAR_OK) {
    plan_diags_print(&diags, stderr);
    plan_diags_free(&diags);
    failures++;
    return;
  }
  plan_diags_free(&diags);
  expect_flash(&p);
  plan_free(&p);
}

int main(void) {
  static struct plan flash;
  test_formats();
  build_flash(&flash);
  expect_flash(&flash);
  test_window();
  test_added_source();
  test_ratio4();
  test_ced_off();
  test_bad_queries();
  test_flash_file();
  if (failures) {
    fprintf(stderr, "test_plan_cost: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_plan_cost: ok\n");
  return 0;
}

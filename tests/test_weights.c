/* test_weights.c: a plan's weights (runtime/load/weights.h, docs/weights.md).
 *
 *  - the list for plans/v41-mini.yaml and plans/v41-flash.yaml has exactly
 *    the tensors docs/weights.md implies, counted by class from the plan's
 *    layer table here (not from the library), with a few shapes and the
 *    Engram row counts from primes found here by trial division;
 *  - synthesis is deterministic (same seed, same bytes; another seed,
 *    different bytes) and per tensor (tests/plans/small.yaml, 6 layers, and
 *    v41-mini, 40 layers, give identical bytes for every tensor both name);
 *  - values are finite and inside the documented ranges (weights.c's
 *    header), with the RMS a uniform fill implies; Engram rows decode;
 *  - save -> check -> load round trip, 64-byte aligned pointers, lookups;
 *  - rejections, each with its message: a missing tensor, an extra one, a
 *    wrong shape, a wrong dtype, no fingerprint, a fingerprint of another
 *    plan (shapes equal, rope_dim differs; and small's weights against
 *    mini), a truncated file; a plan too big; an Engram width the rows
 *    cannot take.
 * Run from the repo root: ./build/tests/test_weights
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "ops/formats.h"
#include "ops/qweight.h"
#include "runtime/load/checkpoint.h"
#include "base/check.h"
#include "runtime/load/weights.h"
#include "tests/harness.h"

static char err[2048];
static char tmpdir[] = "/tmp/cedar_test_weights_XXXXXX";

static bool load(const char *path, struct plan *p) {
  return h_load_plan(path, p);
}

/* A 6-layer plan at tiny widths (tests/plans/small.yaml's schedule), with the
 * two knobs the rejection tests turn. */
static bool load_tiny(struct plan *p, int rope_dim, int engram_head_dim) {
  char y[1024];
  snprintf(y, sizeof y,
           "extends: tests/plans/small.yaml\n"
           "name: tiny\n"
           "model:\n"
           "  hidden: 64\n"
           "  attention: {heads: 2, head_dim: 32, rope_dim: %d, q_rank: 32, o_groups: 2, o_rank: 16}\n"
           "  indexer: {heads: 2, head_dim: 32, rope_dim: 16}\n"
           "  moe: {routed_experts: 4, active_experts: 2, inter_dim: 32, shared_inter_dim: 32}\n"
           "  engram: {heads: 1, head_dim: %d, table_base: 100}\n"
           "formats:\n"
           "  swa: {block: 32}\n",
           rope_dim, engram_head_dim);
  struct plan_diags d = {0};
  int rc = plan_load_string("tiny.yaml", y, strlen(y), p, &d);
  if (rc) plan_diags_print(&d, stderr);
  plan_diags_free(&d);
  EXPECT(rc == 0, "the tiny plan does not load");
  return rc == 0;
}

static size_t count_suffix(const struct weights_list *l, const char *suffix) {
  size_t n = 0, k = strlen(suffix);
  for (size_t i = 0; i < l->n; i++) {
    size_t m = strlen(l->t[i].name);
    n += m >= k && !strcmp(l->t[i].name + m - k, suffix);
  }
  return n;
}

static const struct weights_spec *find_at(const struct weights_list *l, int layer, const char *name) {
  char full[WEIGHTS_NAME_MAX];
  snprintf(full, sizeof full, "layers.%d.%s", layer, name);
  return weights_list_find(l, full);
}

static bool shape_is(const struct weights_spec *s, int ndim, int64_t a, int64_t b, int64_t c) {
  int64_t want[3] = {a, b, c};
  if (!s || s->ndim != ndim) return false;
  for (int i = 0; i < ndim; i++)
    if (s->shape[i] != want[i]) return false;
  return true;
}

/* ---- the list ----------------------------------------------------------- */

static const char *const common[] = {
    "attn_norm", "ffn_norm", "hc_attn.fn", "hc_attn.scale", "hc_attn.base", "hc_ffn.fn", "hc_ffn.scale",
    "hc_ffn.base", "attn.wq_a", "attn.q_norm", "attn.wq_b", "attn.wkv", "attn.kv_norm", "attn.wo_a", "attn.wo_b",
    "ffn.gate", "ffn.bias", "ffn.experts.w_gate", "ffn.experts.w_up", "ffn.experts.w_down"};
#define N_COMMON (sizeof common / sizeof common[0])

static bool is_prime(int64_t n) {
  if (n < 2) return false;
  for (int64_t d = 2; d * d <= n; d++)
    if (n % d == 0) return false;
  return true;
}

/* Rows of Engram module m by SPEC's prime rule, computed here. */
static int64_t engram_rows(const struct plan_model *m, int module) {
  int per = m->engram_n_orders * m->engram_heads;
  int64_t c = m->engram_table_base - 1, rows = 0;
  for (int k = 0; k < (module + 1) * per; k++) {
    do c++;
    while (!is_prime(c));
    if (k >= module * per) rows += c;
  }
  return rows;
}

static void test_list(const char *path) {
  struct plan p;
  if (!load(path, &p)) return;
  const struct plan_model *m = &p.model;
  struct weights_list l;
  int rc = weights_list_init(&l, &p, err, sizeof err);
  EXPECT(rc == 0, "%s: weights_list_init: %s", path, err);
  if (rc) {
    plan_free(&p);
    return;
  }

  /* Expected counts from the plan's layer table. */
  size_t idx = 0, kv = 0, gate = 0, engram = 0;
  bool shared = m->n_shared > 0;
  for (int i = 0; i < p.n_layers; i++) {
    const struct plan_layer *L = &p.layer[i];
    idx += L->mode == PLAN_FULL || L->mode == PLAN_REINDEX;
    kv += L->mode == PLAN_FULL;
    gate += L->mode == PLAN_FULL && L->ratio > 1;
    engram += L->engram;
  }
  size_t per_layer = N_COMMON + (m->sink ? 1 : 0) + (shared ? 3 : 0);
  size_t model_wide = 3 + (m->hc_merge == PLAN_MERGE_LEARNED ? 3 : 0);
  size_t blocks = m->dspark_blocks > 0 ? (size_t)m->dspark_blocks : 0; /* the drafter: blocks + 6 extras */
  size_t want = model_wide + per_layer * ((size_t)p.n_layers + blocks) + 2 * idx + kv * (3 + (m->idx_k_norm ? 1 : 0)) +
                gate + 4 * engram + (blocks ? 6 : 0);
  EXPECT(l.n == want, "%s: %zu tensors, want %zu", path, l.n, want);
  EXPECT(count_suffix(&l, ".attn.indexer.wq_b") == idx && count_suffix(&l, ".attn.indexer.weights_proj") == idx,
         "%s: indexer queries on %zu layers", path, idx);
  EXPECT(count_suffix(&l, ".attn.compressor.wkv") == kv && count_suffix(&l, ".attn.indexer.wk") == kv &&
             count_suffix(&l, ".attn.compressor.norm") == kv,
         "%s: compressors on %zu layers", path, kv);
  EXPECT(count_suffix(&l, ".attn.compressor.wgate") == gate, "%s: %zu gates", path, gate);
  EXPECT(count_suffix(&l, ".attn.indexer.k_norm") == (m->idx_k_norm ? kv : 0), "%s: k_norm", path);
  EXPECT(count_suffix(&l, ".engram.table") == engram && count_suffix(&l, ".engram.wkv") == engram, "%s: engram",
         path);
  EXPECT(count_suffix(&l, ".ffn.shared.w_down") == (shared ? (size_t)p.n_layers + blocks : 0), "%s: shared", path);
  if (blocks) { /* Appendix V #24's drafter at the plan's widths */
    char nm[WEIGHTS_NAME_MAX];
    int last = m->dspark_blocks - 1;
    snprintf(nm, sizeof nm, "mtp.%d.ffn.experts.w_gate", last);
    EXPECT(shape_is(weights_list_find(&l, nm), 3, m->dspark_experts, m->moe_inter, m->hidden), "%s: %s", path, nm);
    EXPECT(shape_is(weights_list_find(&l, "mtp.0.main_proj"), 2, m->hidden,
                    (int64_t)m->dspark_n_targets * m->hidden, 0), "%s: main_proj", path);
    snprintf(nm, sizeof nm, "mtp.%d.markov_head.head", last);
    EXPECT(shape_is(weights_list_find(&l, nm), 2, m->vocab, m->dspark_markov_rank, 0), "%s: %s", path, nm);
    snprintf(nm, sizeof nm, "mtp.%d.confidence_head.proj", last);
    EXPECT(shape_is(weights_list_find(&l, nm), 2, 1, (int64_t)m->hidden + m->dspark_markov_rank, 0), "%s: %s", path, nm);
  }
  for (int i = 0; i < p.n_layers; i++)
    for (size_t k = 0; k < N_COMMON; k++) EXPECT(find_at(&l, i, common[k]), "%s: layer %d has no %s", path, i, common[k]);
  EXPECT(weights_list_find(&l, "embed") && weights_list_find(&l, "lm_head") && weights_list_find(&l, "norm"),
         "%s: model-wide tensors", path);

  /* Shapes by docs/weights.md's formulas, at the first KV source. */
  int src = 0;
  while (src < p.n_layers - 1 && p.layer[src].mode != PLAN_FULL) src++;
  int d = m->hidden, H = m->heads, dh = m->head_dim, G = m->o_groups, hc = m->hc_streams;
  EXPECT(shape_is(find_at(&l, src, "attn.wo_a"), 3, G, m->o_rank, H * dh / G), "%s: wo_a", path);
  EXPECT(shape_is(find_at(&l, src, "attn.wo_b"), 2, d, (int64_t)G * m->o_rank, 0), "%s: wo_b", path);
  EXPECT(shape_is(find_at(&l, src, "hc_attn.fn"), 2, (2 + hc) * hc, (int64_t)hc * d, 0), "%s: hc fn", path);
  EXPECT(shape_is(find_at(&l, src, "ffn.experts.w_down"), 3, m->n_routed, d, m->moe_inter), "%s: w_down", path);
  EXPECT(shape_is(find_at(&l, src, "attn.indexer.wk"), 2, m->idx_head_dim, dh, 0), "%s: indexer.wk", path);
  if (m->hc_merge == PLAN_MERGE_LEARNED)
    EXPECT(shape_is(weights_list_find(&l, "head.hc.fn"), 2, hc, (int64_t)hc * d, 0), "%s: head.hc.fn", path);
  else
    EXPECT(!weights_list_find(&l, "head.hc.fn"), "%s: head.hc.fn without merge: learned", path);
  int module = 0;
  for (int i = 0; i < p.n_layers; i++) {
    if (!p.layer[i].engram) continue;
    int64_t de = (int64_t)m->engram_n_orders * m->engram_heads * m->engram_head_dim;
    int64_t rb = m->engram_head_dim + m->engram_head_dim / 32;
    const struct weights_spec *t = find_at(&l, i, "engram.table");
    EXPECT(shape_is(t, 2, engram_rows(m, module), rb, 0) && t->dtype == ST_U8, "%s: layer %d engram.table", path, i);
    EXPECT(shape_is(find_at(&l, i, "engram.wkv"), 2, (int64_t)(hc + 1) * d, de, 0), "%s: engram.wkv", path);
    module++;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < l.n; i++) total += l.t[i].nbytes;
  EXPECT(total == l.total_bytes, "%s: total bytes", path);
  printf("%s: %zu tensors, %llu bytes (Engram tables %llu)\n", path, l.n, (unsigned long long)l.total_bytes,
         (unsigned long long)l.engram_bytes);
  weights_list_free(&l);
  plan_free(&p);
}

/* The facts the brief states for the two shipped plans, literally. */
static void test_list_literal(void) {
  struct plan p;
  struct weights_list l;
  if (!load("plans/v41-mini.yaml", &p)) return;
  EXPECT(weights_list_init(&l, &p, err, sizeof err) == 0, "%s", err);
  EXPECT(count_suffix(&l, ".attn.compressor.wkv") == 4 && count_suffix(&l, ".attn.compressor.wgate") == 3 &&
             count_suffix(&l, ".attn.indexer.wq_b") == 8 && count_suffix(&l, ".engram.table") == 2 && l.n == 1084,
         "mini: 4 compressors, 3 gates, 8 indexer queries, 2 Engram tables, 1084 tensors (4 k_norm, no head.hc; "
         "1006 of the 40 layers and model-wide, 78 of the DSpark drafter: 3 blocks of 24 + 6)");
  EXPECT(count_suffix(&l, ".attn.indexer.k_norm") == 4 && !weights_list_find(&l, "head.hc.fn"),
         "mini (pairing v41, k_norm on): attn.indexer.k_norm at the 4 sources, no head.hc.*");
  EXPECT(shape_is(weights_list_find(&l, "layers.1.engram.table"), 2, 1009 + 1013 + 1019 + 1021 + 1031 + 1033, 33, 0),
         "mini: the first Engram table has the 6 primes above 999 as rows");
  weights_list_free(&l);
  plan_free(&p);
  if (!load("plans/v41-flash.yaml", &p)) return;
  EXPECT(weights_list_init(&l, &p, err, sizeof err) == 0, "%s", err);
  EXPECT(shape_is(weights_list_find(&l, "layers.0.ffn.experts.w_gate"), 3, 384, 2304, 5120), "flash experts");
  EXPECT(l.total_bytes > 2000000000000ull && l.engram_bytes > 200000000000ull, "flash: > 2 TB, Engram > 200 GB");
  weights_list_free(&l);
  plan_free(&p);
}

/* ---- values ------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

/* The documented bound of a linear weight (weights.c): sqrt(3 / in) times
 * 1/8 for residual-branch outputs, 1/2 for the router. */
static double linear_bound(const struct weights_spec *s, int hc, int d) {
  double in = (double)s->shape[s->ndim - 1];
  if (ends_with(s->name, ".fn")) return 0.1 * sqrt(3.0 / ((double)hc * d));
  if (!strcmp(s->name, "embed") || ends_with(s->name, "markov_head.embed")) return sqrt(3.0);
  if (ends_with(s->name, "ffn.bias")) return 0.01;
  double g = ends_with(s->name, "attn.wo_b") || ends_with(s->name, "w_down") || ends_with(s->name, "engram.wkv")
                 ? 0.125
                 : ends_with(s->name, "ffn.gate") ? 0.5 : 1.0;
  return g * sqrt(3.0 / in);
}

static void check_base(const float *x, const struct weights_spec *s, int hc) {
  for (int64_t i = 0; i < s->shape[0]; i++) {
    double want = 0;
    if (i < hc) want = -log(hc - 1.0);
    else if (i >= 2 * hc && (i - 2 * hc) / hc == (i - 2 * hc) % hc) want = log(9.0 * (hc - 1));
    EXPECT(fabs(x[i] - want) <= 0.01 + 1e-6, "%s[%lld] = %g, want %g +- 0.01", s->name, (long long)i, x[i], want);
  }
}

static void check_engram_rows(const uint8_t *t, const struct weights_spec *s) {
  int hd = (int)(s->shape[1] * 32 / 33);
  float *v = malloc(sizeof *v * (size_t)hd);
  double sq = 0, bound = sqrt(3.0) * (1 + 1.0 / 16); /* E4M3 rounds to 3 mantissa bits: <= 2^-4 relative */
  bool ok = true;
  for (int64_t r = 0; r < s->shape[0]; r++) {
    op_fp8_unpack(v, t + r * s->shape[1], hd, 32, OP_SCALE_E8M0);
    for (int j = 0; j < hd; j++) ok &= isfinite(v[j]) && fabs(v[j]) <= bound, sq += (double)v[j] * v[j];
  }
  double rms = sqrt(sq / ((double)s->shape[0] * hd));
  EXPECT(ok, "%s: a decoded value is not finite or beyond %g", s->name, bound);
  EXPECT(fabs(rms - 1) < 0.05, "%s: rows decode to RMS %g, want ~1", s->name, rms);
  free(v);
}

/* Every value finite and in its documented range; big uniform tensors have
 * RMS a / sqrt(3) within 3% (a tensor filled at the wrong scale fails). */
static void check_range(const float *x, const struct weights_spec *s, uint64_t n, int hc, int d);
static void check_ranges(const struct weights *w, const struct plan *p) {
  int hc = p->model.hc_streams, d = p->model.hidden;
  for (size_t i = 0; i < w->list.n; i++) {
    const struct weights_spec *s = &w->list.t[i];
    if (s->dtype == ST_U8) {
      check_engram_rows(w->data[i], s);
      continue;
    }
    /* The generator's draws are checked below; the tensor holds them passed
     * through its stored format (weights.h, "held formats"), exactly. */
    uint64_t n = s->nbytes / 4;
    float *x = malloc(s->nbytes + 4), *st = malloc(s->nbytes + 4);
    weights_fill(x, s, w->seed);
    memcpy(st, x, s->nbytes);
    weights_store_values(st, s, (int64_t)(n / (uint64_t)s->shape[s->ndim - 1]));
    EXPECT(!memcmp(st, w->data[i], s->nbytes), "%s: not the generator's values in its stored format (%s)", s->name,
           op_wfmt_name(weights_stored_fmt(s)));
    free(st);
    check_range(x, s, n, hc, d);
    free(x);
  }
}

/* One tensor's generator values: finite and in their documented range. */
static void check_range(const float *x, const struct weights_spec *s, uint64_t n, int hc, int d) {
  if (!h_finite(x, n, s->name)) return;
  if (ends_with(s->name, ".sink") || ends_with(s->name, ".scale")) {
    float want = ends_with(s->name, ".sink") ? 0.0f : 1.0f;
    for (uint64_t k = 0; k < n; k++) EXPECT(x[k] == want, "%s[%llu] = %g, want %g", s->name, (unsigned long long)k, x[k], want);
    return;
  }
  if (ends_with(s->name, ".base")) {
    check_base(x, s, hc);
    return;
  }
  bool norm = ends_with(s->name, "norm") || ends_with(s->name, "q_w") || ends_with(s->name, "k_w");
  double a = norm ? 0.02 : linear_bound(s, hc, d), c = norm ? 1 : 0, sq = 0;
  uint64_t bad = 0;
  for (uint64_t k = 0; k < n; k++) bad += !(fabs(x[k] - c) < a), sq += (x[k] - c) * (double)(x[k] - c);
  EXPECT(!bad, "%s: %llu values outside %g +- %g", s->name, (unsigned long long)bad, c, a);
  double rms = sqrt(sq / (double)n), want = a / sqrt(3.0);
  if (n >= 4096) EXPECT(fabs(rms / want - 1) < 0.03, "%s: RMS %g, want %g", s->name, rms, want);
}

/* The generator as weights.h documents it, written out here: element i is
 * draw i of splitmix64 started at XXH3_64(name, seed), its top 24 bits k
 * mapped to a * (k - 2^23 + 0.5) / 2^23. */
static float documented_draw(const char *name, uint64_t seed, uint64_t i, float a) {
  uint64_t z = XXH3_64bits_withSeed(name, strlen(name), seed) + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return a * (((float)((int64_t)(z >> 40) - (1 << 23)) + 0.5f) / 8388608.0f);
}

static void check_generator(const struct weights *w, uint64_t seed) {
  static const struct {
    const char *name;
    float add, a;
  } cases[] = {{"embed", 0, 1.7320508f}, {"layers.5.attn_norm", 1, 0.02f}, {"layers.0.ffn.bias", 0, 0.01f}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const struct weights_spec *s;
    const float *x = weights_get(w, cases[c].name, &s);
    if (!x) continue;
    for (uint64_t i = 0; i < s->nbytes / 4; i += 7) {
      float want = cases[c].add + documented_draw(cases[c].name, seed, i, cases[c].a);
      if (weights_stored_fmt(s) == OP_W_BF16) want = ckpt_bf16_to_f32(ckpt_f32_to_bf16(want)); /* stored values */
      if (x[i] != want) {
        EXPECT(0, "%s[%llu] = %.9g, the documented generator gives %.9g", cases[c].name, (unsigned long long)i, x[i],
               want);
        break;
      }
    }
  }
}

static void test_synth(void) {
  struct plan mini, small;
  if (!load("plans/v41-mini.yaml", &mini) || !load("tests/plans/small.yaml", &small)) return;
  struct weights a, b;
  EXPECT(weights_synth(&a, &mini, 1, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  check_ranges(&a, &mini);
  check_generator(&a, 1);
  for (size_t i = 0; i < a.list.n; i++)
    EXPECT((uintptr_t)a.data[i] % WEIGHTS_ALIGN == 0, "%s not aligned", a.list.t[i].name);

  EXPECT(weights_synth(&b, &mini, 1, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  for (size_t i = 0; i < a.list.n; i++)
    EXPECT(!memcmp(a.data[i], b.data[i], a.list.t[i].nbytes), "seed 1 twice: %s differs", a.list.t[i].name);
  weights_free(&b);

  EXPECT(weights_synth(&b, &mini, 2, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  for (size_t i = 0; i < a.list.n; i++) {
    const char *name = a.list.t[i].name;
    bool fixed = ends_with(name, ".sink") || ends_with(name, ".scale");
    EXPECT(fixed == !memcmp(a.data[i], b.data[i], a.list.t[i].nbytes), "seeds 1 and 2: %s %s", name,
           fixed ? "differs (it is a constant)" : "is the same");
  }
  weights_free(&b);

  /* Per tensor: small (6 layers, other modes) shares every tensor it names
   * with mini bit for bit. */
  EXPECT(weights_synth(&b, &small, 1, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  size_t same = 0;
  for (size_t i = 0; i < b.list.n; i++) {
    const struct weights_spec *sb = &b.list.t[i], *sa;
    const void *da = weights_get(&a, sb->name, &sa);
    if (!da || sa->nbytes != sb->nbytes) continue;
    same++;
    EXPECT(!memcmp(da, b.data[i], sb->nbytes), "%s differs between small and mini", sb->name);
  }
  EXPECT(same >= 3 + 24 * 6, "only %zu tensors in common between small and mini", same);
  weights_free(&b);
  weights_free(&a);
  plan_free(&small);
  plan_free(&mini);
}

/* ---- files -------------------------------------------------------------- */

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmpdir, name); }

/* Write w's tensors with one change: drop `skip`, replace it by `repl`, add
 * `extra`; meta = NULL writes no metadata. */
static void write_variant(const struct weights *w, const char *path, const char *skip, const struct st_tensor *repl,
                          const struct st_tensor *extra, bool meta) {
  struct st_tensor *ts = calloc(w->list.n + 1, sizeof *ts);
  size_t n = 0;
  for (size_t i = 0; i < w->list.n; i++) {
    const struct weights_spec *s = &w->list.t[i];
    if (skip && !strcmp(s->name, skip)) {
      if (repl) ts[n++] = *repl;
      continue;
    }
    ts[n] = (struct st_tensor){.name = s->name, .dtype = s->dtype, .ndim = s->ndim, .nbytes = s->nbytes, .data = w->data[i]};
    memcpy(ts[n++].shape, s->shape, sizeof s->shape);
  }
  if (extra) ts[n++] = *extra;
  char fp[17];
  weights_fingerprint_hex(w->list.fingerprint, fp);
  struct st_meta m[] = {{"cedar.fingerprint", fp}, {"cedar.plan", w->list.plan_name}};
  EXPECT(st_write(path, ts, n, m, meta ? 2 : 0, err, sizeof err) == 0, "write %s: %s", path, err);
  free(ts);
}

/* Load path against p: it must fail with `status`, and the problems (or the
 * error) must contain every needle. */
static void expect_rejected(const struct plan *p, const char *path, int status, size_t n_problems,
                            const char *const *needles, const char *what) {
  struct weights w;
  struct weights_problems pr = {0};
  err[0] = 0;
  int rc = weights_load(&w, p, path, &pr, err, sizeof err);
  EXPECT(rc == status, "%s: load returned %d (%s), want %d", what, rc, cedar_status_str(rc), status);
  if (n_problems) EXPECT(pr.n == n_problems, "%s: %zu problems, want %zu", what, pr.n, n_problems);
  for (; *needles; needles++) {
    bool found = strstr(err, *needles) != NULL;
    for (size_t i = 0; i < pr.n; i++) found |= strstr(pr.msg[i], *needles) != NULL;
    EXPECT(found, "%s: no message mentions '%s' (error: %s)", what, *needles, err);
  }
  if (!rc) weights_free(&w);
  weights_problems_free(&pr);
}

static void test_roundtrip(void) {
  struct plan mini;
  if (!load("plans/v41-mini.yaml", &mini)) return;
  struct weights a, b;
  char path[256];
  path_of(path, sizeof path, "mini.safetensors");
  EXPECT(weights_synth(&a, &mini, 7, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  EXPECT(weights_save(&a, path, err, sizeof err) == 0, "save: %s", err);
  struct weights_problems pr = {0};
  int rc = weights_load(&b, &mini, path, &pr, err, sizeof err);
  EXPECT(rc == 0 && pr.n == 0, "load: %s", err);
  if (rc) return;
  EXPECT(b.synthetic && b.seed == 7, "cedar.seed read back");
  EXPECT(b.list.fingerprint == a.list.fingerprint && !strcmp(st_meta_get(b.file, "cedar.plan"), "v41-mini"),
         "metadata");
  for (size_t i = 0; i < a.list.n; i++) {
    const struct weights_spec *s = &a.list.t[i];
    EXPECT((uintptr_t)b.data[i] % WEIGHTS_ALIGN == 0, "%s: loaded pointer not aligned", s->name);
    EXPECT(!memcmp(a.data[i], b.data[i], s->nbytes), "%s: round trip changed the bytes", s->name);
  }
  printf("mini: %llu of %llu bytes copied to aligned memory on load\n", (unsigned long long)b.copied_bytes,
         (unsigned long long)b.list.total_bytes);
  const struct weights_spec *s;
  EXPECT(weights_f32(&b, "layers.3.attn.wq_a") == weights_get(&b, "layers.3.attn.wq_a", &s) && s &&
             !strcmp(s->name, "layers.3.attn.wq_a"),
         "lookup by name");
  EXPECT(!weights_f32(&b, "layers.1.engram.table") && weights_get(&b, "layers.1.engram.table", NULL),
         "weights_f32 refuses a U8 tensor");
  EXPECT(!weights_get(&b, "layers.40.attn.wq_a", &s) && !s, "an unknown name");
  weights_free(&b);

  /* The same file serves a plan with the same tensors (no candidate pool). */
  struct plan nopool;
  if (load("plans/alt-no-pool.yaml", &nopool)) {
    EXPECT(weights_load(&b, &nopool, path, NULL, err, sizeof err) == 0, "alt-no-pool: %s", err);
    weights_free(&b);
    plan_free(&nopool);
  }
  /* Small's weights against mini: the fingerprint names the other plan. */
  struct plan small;
  if (load("tests/plans/small.yaml", &small)) {
    struct weights c;
    char spath[256];
    path_of(spath, sizeof spath, "small.safetensors");
    EXPECT(weights_synth(&c, &small, 7, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
    EXPECT(weights_save(&c, spath, err, sizeof err) == 0, "%s", err);
    weights_free(&c);
    expect_rejected(&mini, spath, CEDAR_EFORMAT, 0,
                    (const char *[]){"cedar.fingerprint", "plan 'small'", "layers.39.attn.wq_a: missing", NULL},
                    "small against mini");
    plan_free(&small);
  }
  weights_free(&a);
  plan_free(&mini);
  unlink(path);
}

static void test_rejections(void) {
  struct plan tiny, other, bad;
  if (!load_tiny(&tiny, 16, 32) || !load_tiny(&other, 8, 32)) return;
  struct weights w;
  char path[256];
  EXPECT(weights_synth(&w, &tiny, 3, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == 0, "%s", err);
  path_of(path, sizeof path, "tiny.safetensors");

  write_variant(&w, path, NULL, NULL, NULL, true);
  struct weights ok;
  EXPECT(weights_load(&ok, &tiny, path, NULL, err, sizeof err) == 0, "tiny loads: %s", err);
  weights_free(&ok);
  expect_rejected(&other, path, CEDAR_EFORMAT, 1,
                  (const char *[]){"cedar.fingerprint", "plan 'tiny'", NULL}, "fingerprint only (rope_dim differs)");

  write_variant(&w, path, "layers.1.attn.compressor.wgate", NULL, NULL, true);
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 1, (const char *[]){"layers.1.attn.compressor.wgate: missing", NULL},
                  "missing");

  float four[4] = {1, 2, 3, 4};
  struct st_tensor extra = {.name = "layers.0.attn.bogus", .dtype = ST_F32, .ndim = 1, .shape = {4}, .nbytes = 16, .data = four};
  write_variant(&w, path, NULL, NULL, &extra, true);
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 1, (const char *[]){"layers.0.attn.bogus: unexpected", NULL}, "extra");

  float *buf = calloc(32 * 63, sizeof *buf);
  struct st_tensor shape = {.name = "layers.0.attn.wq_a", .dtype = ST_F32, .ndim = 2, .shape = {32, 63},
                            .nbytes = 32 * 63 * 4, .data = buf};
  write_variant(&w, path, "layers.0.attn.wq_a", &shape, NULL, true);
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 1,
                  (const char *[]){"layers.0.attn.wq_a: shape (32, 63) in the file, plan 'tiny' needs (32, 64)", NULL},
                  "shape");

  struct st_tensor dtype = {.name = "layers.0.attn.sink", .dtype = ST_I32, .ndim = 1, .shape = {2}, .nbytes = 8, .data = buf};
  write_variant(&w, path, "layers.0.attn.sink", &dtype, NULL, true);
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 1,
                  (const char *[]){"layers.0.attn.sink: dtype I32 in the file, plan 'tiny' needs F32", NULL}, "dtype");
  free(buf);

  write_variant(&w, path, NULL, NULL, NULL, false);
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 1, (const char *[]){"no cedar.fingerprint", NULL}, "no metadata");

  /* Truncated: cut the valid file short, at the end and in the middle. */
  write_variant(&w, path, NULL, NULL, NULL, true);
  long size = 0;
  FILE *f = fopen(path, "rb");
  if (f) fseek(f, 0, SEEK_END), size = ftell(f), fclose(f);
  EXPECT(size > 0 && truncate(path, size - 1) == 0, "truncate");
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 0, (const char *[]){path, NULL}, "truncated by a byte");
  EXPECT(truncate(path, size / 2) == 0, "truncate");
  expect_rejected(&tiny, path, CEDAR_EFORMAT, 0, (const char *[]){path, NULL}, "truncated by half");
  unlink(path);
  expect_rejected(&tiny, path, CEDAR_EIO, 0, (const char *[]){path, NULL}, "no file");
  weights_free(&w);

  /* Plans the weights refuse: too big, an Engram width rows cannot take. */
  struct plan flash;
  if (load("plans/v41-flash.yaml", &flash)) {
    EXPECT(weights_synth(&w, &flash, 1, WEIGHTS_DEFAULT_MAX_BYTES, err, sizeof err) == CEDAR_EINVAL &&
               strstr(err, "v41-flash") && strstr(err, "TiB") && strstr(err, "--max-bytes") && !w.list.t,
           "flash is refused with its size: %s", err);
    plan_free(&flash);
  }
  /* An Engram width rows cannot take is refused by the plan checker already
   * (tests/plans/bad/engram_width.yaml); weights_list_init keeps its own
   * check for plans built in memory. */
  {
    struct plan_diags d = {0};
    const char *y = "extends: tests/plans/small.yaml\nmodel:\n  engram: {head_dim: 48}\n";
    EXPECT(plan_load_string("bad.yaml", y, strlen(y), &bad, &d) != 0 && d.n &&
               strstr(d.d[0].msg, "cannot be stored as Engram rows"),
           "an Engram head_dim of 48 is refused by the plan");
    plan_diags_free(&d);
  }
  plan_free(&other);
  plan_free(&tiny);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_list("plans/v41-mini.yaml");
  test_list("plans/v41-flash.yaml");
  test_list("tests/plans/small.yaml");
  test_list("plans/alt-two-dec-sources.yaml");
  test_list_literal();
  test_synth();
  test_roundtrip();
  test_rejections();
  rmdir(tmpdir);
  return h_report("weights");
}

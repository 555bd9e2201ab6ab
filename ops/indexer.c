/* indexer.c: lightning indexer, Top-K, candidate pool and reindex (see
 * indexer.h for the math, the ranking rule and the parameters).
 *
 * What it is: the CPU reference, in plain loops. Three layers of code:
 *   1. scoring: keys are dequantized a tile of 64 at a time, transposed so
 *      that each key is one lane; score_tile scores every lane with the fixed
 *      order of indexer.h (a sequential dot per head, heads summed in order),
 *      and every path scores through it, so their scores are equal bit for
 *      bit. The lanes are independent, so the compiler vectorizes across keys
 *      (about 34 GFLOP/s at -O3 with SSE2 at flash widths on this machine,
 *      45-64 with AVX-512, where a reduction split into lanes inside one key
 *      reached 8);
 *   2. selection: a bounded heap of indices ranked by (score desc, index asc),
 *      used for Top-K over entries and for Top-blocks over block scores;
 *   3. the chunk entry points: a full scan that scores 8 queries against each
 *      tile so a key is dequantized once per 8 queries, and reindex, which
 *      gathers the pool's keys first and scores only them.
 *
 * What it is not: threaded (parallelism comes from the task graph) or tied
 * to an instruction set (portable C11: no intrinsics, the compiler's
 * vectorizer does the SIMD; score_tile is compiled for SSE2, AVX2 and
 * AVX-512 from one body, ops/isa.h, with the same bits at every level).
 *
 * Test: ctest --test-dir build -R ops_indexer --output-on-failure
 */
#include "ops/indexer.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "ops/isa.h"
#include "base/check.h"

#define KTILE 64 /* keys per tile, the kernel's lanes: (idx_w, 64) floats = 32 KiB at flash width */
#define HBLK 4   /* heads per pass over a tile: 4 x 64 running sums */
#define IBLK 4   /* steps of a dot product per pass: an unroll only, the order stays i = 0, 1, ... */
#define QTILE 8  /* queries scored against each tile in op_indexer_topk */

/* ---- dequantizing a tile of keys --------------------------------------- */

/* A tile holds up to KTILE keys TRANSPOSED: tile[i * KTILE + lane] is element
 * i of the key in that lane, so the scoring loop below runs over lanes. */

/* E2M1 code -> value, as op_e2m1_decode (bit 3 the sign: 0x8 is -0.0f). */
static const float e2m1_value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0 code -> 2^(code - 127), as op_e8m0_decode but built from the float's
 * bits: the code is the biased exponent of a normal float; 0x00 is 2^-127,
 * the subnormal with only its top mantissa bit set; 0xFF is NaN. */
static float e8m0_value(uint8_t code) {
  if (code == 0xFF) return NAN;
  uint32_t bits = code ? (uint32_t)code << 23 : 0x00400000u;
  float s;
  memcpy(&s, &bits, sizeof s);
  return s;
}

/* Each block first scales the 16 E2M1 values by its E8M0 scale (the same
 * products op_mxfp4_unpack forms), then its bytes only look values up: byte j
 * holds elements 2j and 2j + 1, one per nibble, in the view's nibble order. */
void op__indexer_unpack_lane(float *restrict tile, int lanes, int lane, const uint8_t *restrict in, int W, int block,
                             enum op_nibble_order order) {
  const uint8_t *scales = in + W / 2;
  const size_t row = (size_t)lanes, pair = 2 * row; /* one element, one byte further down the lane */
  float *lo = tile + lane + (order == OP_NIBBLE_EVEN_LOW ? 0 : row); /* where the low nibbles go */
  float *hi = tile + lane + (order == OP_NIBBLE_EVEN_LOW ? row : 0);
  for (int b = 0; b < W / block; b++) {
    float value[16];
    const float s = e8m0_value(scales[b]);
    /* A NaN scale makes every value that NaN, as the products do on x86;
     * spelled out because the compiler may fold -v * s into -(v * s), which
     * flips a NaN's sign bit. */
    const bool poisoned = isnan(s);
    for (int c = 0; c < 16; c++) value[c] = poisoned ? s : e2m1_value[c] * s;
    for (int j = b * block / 2; j < (b + 1) * block / 2; j++) {
      unsigned byte = in[j];
      lo[j * pair] = value[byte & 0xFu];
      hi[j * pair] = value[byte >> 4];
    }
  }
}

/* Floats of a tile's workspace: the tile, one unpacked key (formats other
 * than MXFP4), then the raw bytes of its keys (KTILE x op_kv_bytes, rounded
 * up to whole floats). */
static size_t tile_floats(const struct op_kv_view *kv) {
  size_t raw = (size_t)KTILE * op_kv_bytes(&kv->idx_fmt, kv->idx_w);
  return (size_t)(KTILE + 1) * (size_t)kv->idx_w + (raw + sizeof(float) - 1) / sizeof(float);
}

/* Whether the keys are MXFP4 (E2M1 + E8M0, any scale rule): those unpack
 * straight into the tile's lanes; other formats go through op_kv_unpack. */
static bool keys_mxfp4(const struct op_kv_view *kv) {
  return kv->idx_fmt.elem == OP_KV_E2M1 && kv->idx_fmt.scale == OP_KV_SCALE_E8M0;
}

/* Lanes [0, n) of the tile := the keys of entries ids[lane] (or e0 + lane
 * when ids is NULL); lanes [n, KTILE) := 0, so the kernel always runs full
 * width on finite numbers and their results are dropped. The raw keys are
 * gathered first: n short independent copies let the memory system fetch
 * them all at once, where unpacking straight from the pages stalls on each
 * key's cache misses in turn (half the time of a 1M-entry scan). */
static void tile_load(float *tile /* (tile_floats(kv)) */, const struct op_kv_view *kv, const int32_t *ids /* (n) */,
                      int64_t e0, int n) {
  const size_t kb = op_kv_bytes(&kv->idx_fmt, kv->idx_w);
  float *row = tile + (size_t)KTILE * kv->idx_w;                /* (idx_w) */
  uint8_t *raw = (uint8_t *)(row + kv->idx_w);                  /* (n, kb) */
  for (int lane = 0; lane < n; lane++)
    memcpy(raw + lane * kb, op_kv_entry(kv, ids ? ids[lane] : e0 + lane) + kv->idx_off, kb);
  for (int lane = 0; lane < n; lane++)
    if (keys_mxfp4(kv)) {
      op__indexer_unpack_lane(tile, KTILE, lane, raw + lane * kb, kv->idx_w, kv->idx_fmt.block, kv->idx_fmt.nibble);
    } else {
      op_kv_unpack(&kv->idx_fmt, row, raw + lane * kb, kv->idx_w);
      for (int i = 0; i < kv->idx_w; i++) tile[(size_t)i * KTILE + lane] = row[i];
    }
  if (n < KTILE)
    for (int i = 0; i < kv->idx_w; i++) memset(tile + (size_t)i * KTILE + n, 0, (size_t)(KTILE - n) * sizeof *tile);
}

/* ---- scoring ----------------------------------------------------------- */

/* dot[j][lane] = q_j . key(lane) for HBLK heads q_j over the whole tile. Each
 * dot is a plain sequential sum, d = 0; d += q_i k_i for i = 0, 1, ..., hd-1
 * (one rounding per step, always in that order, so the tile size, the
 * unroll and the lane a key sits in change nothing). The lanes are
 * independent: that inner loop is what the compiler vectorizes. */
static inline OP_ISA_BODY void head_dots(float dot[restrict HBLK][KTILE], const float *const qh[HBLK] /* HBLK x (hd) */,
                      const float *restrict tile /* (hd, KTILE) */, int hd) {
  for (int j = 0; j < HBLK; j++)
    for (int l = 0; l < KTILE; l++) dot[j][l] = 0.0f;
  int i = 0;
  for (; i + IBLK <= hd; i += IBLK) {
    float qv[HBLK][IBLK];
    for (int j = 0; j < HBLK; j++)
      for (int t = 0; t < IBLK; t++) qv[j][t] = qh[j][i + t];
    const float *restrict rows = tile + (size_t)i * KTILE; /* elements i .. i + IBLK - 1 of every lane */
    for (int l = 0; l < KTILE; l++)
      for (int j = 0; j < HBLK; j++) {
        float d = dot[j][l];
        for (int t = 0; t < IBLK; t++) d += qv[j][t] * rows[t * KTILE + l];
        dot[j][l] = d;
      }
  }
  for (; i < hd; i++)
    for (int j = 0; j < HBLK; j++)
      for (int l = 0; l < KTILE; l++) dot[j][l] += qh[j][i] * tile[(size_t)i * KTILE + l];
}

/* out[lane] = I = sum_h w_h ReLU(q_h . key(lane)) for every lane of the tile,
 * heads summed in order h = 0, 1, ... from 0. ReLU keeps a NaN (a poisoned
 * key must stay visible, see the ranking rule in indexer.h). Every score of
 * every path comes from here. */
static inline OP_ISA_BODY void score_tile_body(float *restrict out /* (KTILE) */, const float *q /* (heads, hd) */,
                                              const float *w /* (heads) */, const float *tile /* (hd, KTILE) */,
                                              int heads, int hd) {
  float dot[HBLK][KTILE];
  for (int l = 0; l < KTILE; l++) out[l] = 0.0f;
  for (int h0 = 0; h0 < heads; h0 += HBLK) {
    const float *qh[HBLK]; /* past the last head, repeat it: computed, then dropped */
    for (int j = 0; j < HBLK; j++) qh[j] = q + (size_t)(h0 + j < heads ? h0 + j : h0) * hd;
    head_dots(dot, qh, tile, hd);
    for (int j = 0; j < HBLK && h0 + j < heads; j++)
      for (int l = 0; l < KTILE; l++) out[l] += w[h0 + j] * (dot[j][l] < 0.0f ? 0.0f : dot[j][l]);
  }
}
/* score_tile: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(score_tile, (float *out, const float *q, const float *w, const float *tile, int heads, int hd),
              (out, q, w, tile, heads, hd))

static void check_view(const struct op_kv_view *kv, int heads) {
  CEDAR_ASSERT_MSG(kv->ratio >= 1 && kv->n_entries >= 0 && kv->page_entries >= 1,
                   "indexer: kv view ratio=%d n_entries=%lld page_entries=%d", kv->ratio,
                   (long long)kv->n_entries, kv->page_entries);
  CEDAR_ASSERT_MSG(op_kv_bytes(&kv->idx_fmt, kv->idx_w) > 0 && heads >= 1,
                   "indexer: idx_w=%d idx_block=%d heads=%d", kv->idx_w, kv->idx_fmt.block, heads);
}

int64_t op_indexer_visible(const struct op_kv_view *kv, int64_t pos) {
  CEDAR_ASSERT_MSG(pos >= 0 && kv->ratio >= 1, "indexer: pos=%lld ratio=%d", (long long)pos, kv->ratio);
  int64_t n = (pos + 1) / kv->ratio; /* entry s visible iff r*s + r - 1 <= pos */
  return n < kv->n_entries ? n : kv->n_entries;
}

/* scores[c] = I of one query for n entries, KTILE at a time: entries ids[c],
 * or e0 + c when ids is NULL. */
static void score_entries(float *scores /* (n) */, float *tile /* (hd, KTILE) */, const int32_t *ids /* (n) */,
                          int64_t e0, int64_t n, const float *q /* (heads, hd) */, const float *w /* (heads) */,
                          const struct op_kv_view *kv, int heads) {
  float out[KTILE];
  for (int64_t c0 = 0; c0 < n; c0 += KTILE) {
    int nt = n - c0 < KTILE ? (int)(n - c0) : KTILE;
    tile_load(tile, kv, ids ? ids + c0 : NULL, e0 + c0, nt);
    score_tile(out, q, w, tile, heads, kv->idx_w);
    memcpy(scores + c0, out, (size_t)nt * sizeof *out);
  }
}

void op_indexer_score(float *scores, const float *q, const float *w, const struct op_kv_view *kv, int64_t pos,
                      int heads) {
  check_view(kv, heads);
  float *tile = cedar_xmalloc(tile_floats(kv) * sizeof *tile);
  score_entries(scores, tile, NULL, 0, op_indexer_visible(kv, pos), q, w, kv, heads);
  free(tile);
}

/* ---- selection --------------------------------------------------------- */

/* Total order of scores: NaN above every number (as torch.topk), -0 == +0. */
static int score_cmp(float a, float b) {
  int an = isnan(a), bn = isnan(b);
  if (an || bn) return an - bn;
  return (a > b) - (a < b);
}

/* Index i ranks above index j: a better score, or an equal one and i < j. */
static bool ranks_above(const float *sc, int32_t i, int32_t j) {
  int c = score_cmp(sc[i], sc[j]);
  return c > 0 || (c == 0 && i < j);
}

/* heap[0 .. m) is a heap of kept indices whose root is the WORST one: every
 * child ranks above its parent, so the root is the one a newcomer must beat. */
static void sift_up(int32_t *heap, int at, const float *sc) {
  while (at > 0) {
    int parent = (at - 1) / 2;
    if (!ranks_above(sc, heap[parent], heap[at])) return;
    int32_t t = heap[parent];
    heap[parent] = heap[at], heap[at] = t;
    at = parent;
  }
}

static void sift_down(int32_t *heap, int m, const float *sc) {
  int at = 0;
  for (;;) {
    int l = 2 * at + 1, r = l + 1, worst = at;
    if (l < m && ranks_above(sc, heap[worst], heap[l])) worst = l;
    if (r < m && ranks_above(sc, heap[worst], heap[r])) worst = r;
    if (worst == at) return;
    int32_t t = heap[worst];
    heap[worst] = heap[at], heap[at] = t;
    at = worst;
  }
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* a[0 .. m) (distinct, in [0, n)) in ascending order: an LSD radix sort by
 * bytes, as many passes as n - 1 has bytes, through tmp (m). Replaces qsort,
 * whose comparator calls cost more than the heap at small widths. */
static void sort_indices(int32_t *a, int32_t *tmp, int m, int64_t n) {
  int32_t *src = a, *dst = tmp;
  for (int shift = 0; shift < 32 && ((n - 1) >> shift) > 0; shift += 8) {
    int count[257] = {0};
    for (int i = 0; i < m; i++) count[((uint32_t)src[i] >> shift & 0xFFu) + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    for (int i = 0; i < m; i++) dst[count[(uint32_t)src[i] >> shift & 0xFFu]++] = src[i];
    int32_t *t = src;
    src = dst, dst = t;
  }
  if (src != a) memcpy(a, src, (size_t)m * sizeof *a);
}

int op_topk_select(int32_t *out, const float *scores, int64_t n, int k) {
  CEDAR_ASSERT_MSG(k >= 1 && n >= 0 && n <= INT32_MAX, "topk: k=%d n=%lld", k, (long long)n);
  int m = 0;
  if (n <= k) { /* everything is selected, already in ascending order */
    for (; m < (int)n; m++) out[m] = m;
  } else {
    for (int32_t i = 0; i < (int32_t)n; i++) {
      if (m < k) {
        out[m] = i;
        sift_up(out, m++, scores);
      } else if (ranks_above(scores, i, out[0])) {
        out[0] = i;
        sift_down(out, k, scores);
      }
    }
    int32_t stack[2048], *tmp = m <= 2048 ? stack : cedar_xmalloc((size_t)m * sizeof *tmp);
    sort_indices(out, tmp, m, n);
    if (tmp != stack) free(tmp);
  }
  for (int j = m; j < k; j++) out[j] = -1;
  return m;
}

int op_pool_select(int32_t *blocks, float *block_scores, const float *scores, int64_t n_vis, int block,
                   int top_blocks, bool pin_newest) {
  CEDAR_ASSERT_MSG(block >= 1 && top_blocks >= 1 && n_vis >= 0, "pool: block=%d top_blocks=%d n_vis=%lld", block,
                   top_blocks, (long long)n_vis);
  int64_t n_blocks = (n_vis + block - 1) / block;
  for (int64_t b = 0; b < n_blocks; b++) { /* best visible score of the block */
    int64_t s0 = b * block, s1 = s0 + block < n_vis ? s0 + block : n_vis;
    float best = scores[s0];
    for (int64_t s = s0 + 1; s < s1; s++)
      if (score_cmp(scores[s], best) > 0) best = scores[s];
    block_scores[b] = best;
  }
  if (pin_newest && n_blocks > 0) block_scores[n_blocks - 1] = INFINITY;
  return op_topk_select(blocks, block_scores, n_blocks, top_blocks);
}

int64_t op_pool_expand(int32_t *entries, const int32_t *blocks, int top_blocks, int block, int64_t n_vis) {
  CEDAR_ASSERT_MSG(block >= 1 && n_vis <= INT32_MAX, "pool: block=%d n_vis=%lld", block, (long long)n_vis);
  int64_t n = 0;
  for (int i = 0; i < top_blocks; i++) {
    if (blocks[i] < 0) continue;
    int64_t s0 = (int64_t)blocks[i] * block, s1 = s0 + block < n_vis ? s0 + block : n_vis;
    for (int64_t s = s0; s < s1; s++) entries[n++] = (int32_t)s;
  }
  return n;
}

/* ---- a chunk of queries: full scan -------------------------------------- */

static int64_t widest_visible(const struct op_kv_view *kv, const int64_t *pos, int S) {
  int64_t ld = 0;
  for (int i = 0; i < S; i++) {
    int64_t n = op_indexer_visible(kv, pos[i]);
    if (n > ld) ld = n;
  }
  return ld;
}

size_t op_indexer_topk_work_bytes(const struct op_kv_view *kv, const int64_t *pos, int S, int pool_block) {
  if (S <= 0) return 0;
  int64_t ld = widest_visible(kv, pos, S);
  size_t rows = S < QTILE ? (size_t)S : QTILE;
  size_t n_blocks = pool_block > 0 ? (size_t)((ld + pool_block - 1) / pool_block) : 0;
  return (tile_floats(kv) + rows * (size_t)ld + n_blocks) * sizeof(float);
}

/* scores[i * ld + s] = I of query i over its entries [0, nvis[i]), for nq
 * queries: a tile of KTILE keys is dequantized once and scored for every
 * query that sees it (the tile, 32 KiB at flash width, stays in L1/L2 while
 * the nq queries, 16 KiB each, pass over it). */
static void score_queries(float *scores /* (nq, ld) */, int64_t ld, float *tile /* (hd, KTILE) */,
                          const float *q /* (nq, heads, hd) */, const float *w /* (nq, heads) */,
                          const int64_t *nvis /* (nq) */, int nq, const struct op_kv_view *kv, int heads) {
  int hd = kv->idx_w;
  int64_t n_max = 0;
  for (int i = 0; i < nq; i++) n_max = nvis[i] > n_max ? nvis[i] : n_max;
  float out[KTILE];
  for (int64_t e0 = 0; e0 < n_max; e0 += KTILE) {
    tile_load(tile, kv, NULL, e0, n_max - e0 < KTILE ? (int)(n_max - e0) : KTILE);
    for (int i = 0; i < nq; i++) {
      if (nvis[i] <= e0) continue;
      score_tile(out, q + (size_t)i * heads * hd, w + (size_t)i * heads, tile, heads, hd);
      int64_t nt = nvis[i] - e0 < KTILE ? nvis[i] - e0 : KTILE;
      memcpy(scores + (size_t)i * ld + e0, out, (size_t)nt * sizeof *out);
    }
  }
}

void op_indexer_topk(int32_t *topk, int32_t *pool, void *work, const float *q, const float *w, const int64_t *pos,
                     const struct op_kv_view *kv, int S, int heads, int k, int pool_block, int pool_top,
                     bool pin_newest) {
  check_view(kv, heads);
  CEDAR_ASSERT_MSG(k >= 1 && (!pool || (pool_block >= 1 && pool_top >= 1)), "indexer: k=%d block=%d top=%d", k,
                   pool_block, pool_top);
  if (S <= 0) return;
  int hd = kv->idx_w;
  int64_t ld = widest_visible(kv, pos, S);
  size_t rows = S < QTILE ? (size_t)S : QTILE; /* as op_indexer_topk_work_bytes */
  float *tile = work, *scores = tile + tile_floats(kv), *block_scores = scores + rows * (size_t)ld;
  for (int q0 = 0; q0 < S; q0 += QTILE) {
    int nq = S - q0 < QTILE ? S - q0 : QTILE;
    int64_t nvis[QTILE];
    for (int i = 0; i < nq; i++) nvis[i] = op_indexer_visible(kv, pos[q0 + i]);
    score_queries(scores, ld, tile, q + (size_t)q0 * heads * hd, w + (size_t)q0 * heads, nvis, nq, kv, heads);
    for (int i = 0; i < nq; i++) {
      const float *sc = scores + (size_t)i * ld;
      op_topk_select(topk + (size_t)(q0 + i) * k, sc, nvis[i], k);
      if (pool)
        op_pool_select(pool + (size_t)(q0 + i) * pool_top, block_scores, sc, nvis[i], pool_block, pool_top, pin_newest);
    }
  }
}

/* ---- a chunk of queries: reindex inside the pool ------------------------ */

size_t op_indexer_reindex_work_bytes(const struct op_kv_view *kv, int pool_block, int pool_top) {
  size_t cap = (size_t)pool_block * (size_t)pool_top; /* |C_p| <= top_blocks * block */
  return (tile_floats(kv) + cap) * sizeof(float) + ((size_t)pool_top + cap) * sizeof(int32_t);
}

void op_indexer_reindex(int32_t *topk, void *work, const int32_t *pool, const float *q, const float *w,
                        const int64_t *pos, const struct op_kv_view *kv, int S, int heads, int k, int pool_block,
                        int pool_top) {
  check_view(kv, heads);
  CEDAR_ASSERT_MSG(k >= 1 && pool_block >= 1 && pool_top >= 1, "reindex: k=%d block=%d top=%d", k, pool_block,
                   pool_top);
  int hd = kv->idx_w;
  size_t cap = (size_t)pool_block * (size_t)pool_top;
  float *tile = work, *cand_scores = tile + tile_floats(kv);
  int32_t *blocks = (int32_t *)(cand_scores + cap), *ids = blocks + pool_top;
  for (int i = 0; i < S; i++) {
    /* Sorted blocks give ascending entry ids, so a candidate's position in
     * ids orders like its entry id and the tie rule carries over. */
    memcpy(blocks, pool + (size_t)i * pool_top, (size_t)pool_top * sizeof *blocks);
    qsort(blocks, (size_t)pool_top, sizeof *blocks, cmp_i32);
    for (int b = 1; b < pool_top; b++)
      CEDAR_ASSERT_MSG(blocks[b] < 0 || blocks[b] != blocks[b - 1], "reindex: block %d twice in the pool of query %d",
                       blocks[b], i);
    int64_t n_c = op_pool_expand(ids, blocks, pool_top, pool_block, op_indexer_visible(kv, pos[i]));
    const float *qi = q + (size_t)i * heads * hd, *wi = w + (size_t)i * heads;
    score_entries(cand_scores, tile, ids, 0, n_c, qi, wi, kv, heads);
    int32_t *out = topk + (size_t)i * k;
    int m = op_topk_select(out, cand_scores, n_c, k);
    for (int j = 0; j < m; j++) out[j] = ids[out[j]]; /* candidate position -> entry id */
  }
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */
/* `cedar op indexer_topk` and `reindex`: the keys are one tensor of packed
 * rows, seen through a one-page op_kv_view (entry e = row e).
 * Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn). */

#include <limits.h>

#include "ops/registry.h"

/* The inputs and parameters both descriptors share. */
struct idx_call {
  const float *q, *w;
  const int64_t *pos;
  const uint8_t *page; /* the keys tensor: the view's only page */
  struct op_kv_view kv;
  int S, heads, k, pool_block;
};

/* q (S, heads, idx_w), w (S, heads), pos (S) >= 0. */
static int idx_queries(const struct op_desc *self, struct op_io *io, struct idx_call *c, int64_t *qd) {
  int64_t wd[2], pd[1];
  const struct op_tensor *q = op_io_in(self, io, "q", 3, qd);
  const struct op_tensor *w = q ? op_io_in(self, io, "w", 2, wd) : NULL;
  const struct op_tensor *pos = w ? op_io_in(self, io, "pos", 1, pd) : NULL;
  if (!pos) return CEDAR_EINVAL;
  if (wd[0] != qd[0] || wd[1] != qd[1])
    return op_io_fail(io, "%s: w is (%lld, %lld) but q is (%lld, %lld, %lld): w needs (%lld, %lld)", self->name,
                      (long long)wd[0], (long long)wd[1], (long long)qd[0], (long long)qd[1], (long long)qd[2],
                      (long long)qd[0], (long long)qd[1]);
  if (pd[0] != qd[0])
    return op_io_fail(io, "%s: pos has %lld positions but q has %lld queries", self->name, (long long)pd[0],
                      (long long)qd[0]);
  if (qd[1] < 1)
    return op_io_fail(io, "%s: q is (%lld, 0, %lld): it needs at least one head", self->name, (long long)qd[0],
                      (long long)qd[2]);
  c->q = q->data, c->w = w->data, c->pos = pos->data;
  c->S = (int)qd[0], c->heads = (int)qd[1];
  for (int i = 0; i < c->S; i++)
    if (c->pos[i] < 0 || c->pos[i] > ((int64_t)1 << 53))
      return op_io_fail(io, "%s: pos[%d] = %lld is outside [0, 2^53]", self->name, i, (long long)c->pos[i]);
  return 0;
}

/* keys (n_entries, row bytes) with the MXFP4 part at idx_off, and the view. */
static int idx_keys(const struct op_desc *self, struct op_io *io, struct idx_call *c, int idx_w) {
  int64_t kd[2];
  double ratio, k, block, nibble, off, pool_block;
  if (!op_io_param_in(self, io, "ratio", 1, INT_MAX, &ratio) || !op_io_param_in(self, io, "k", 1, INT_MAX, &k) ||
      !op_io_param_in(self, io, "idx_block", 2, INT_MAX, &block) || !op_io_param_in(self, io, "nibble", 0, 1, &nibble) ||
      !op_io_param_in(self, io, "idx_off", 0, INT_MAX, &off) || !op_io_param_in(self, io, "pool_block", 1, INT_MAX, &pool_block))
    return CEDAR_EINVAL;
  const struct op_tensor *keys = op_io_in(self, io, "keys", 2, kd);
  if (!keys) return CEDAR_EINVAL;
  size_t bytes = op_mxfp4_bytes(idx_w, (int)block);
  if (!bytes)
    return op_io_fail(io, "%s: idx_block %d must be even and divide the key width %d (q's last dim)", self->name,
                      (int)block, idx_w);
  if ((int64_t)off + (int64_t)bytes > kd[1])
    return op_io_fail(io, "%s: keys rows have %lld bytes but an MXFP4 key of %d values (block %d) at idx_off %d "
                          "needs %lld", self->name, (long long)kd[1], idx_w, (int)block, (int)off,
                      (long long)(off + (double)bytes));
  c->page = keys->data;
  c->kv = (struct op_kv_view){.pages = &c->page, .page_entries = kd[0] > 0 ? (int)kd[0] : 1,
                              .entry_bytes = (size_t)kd[1], .idx_off = (size_t)off, .n_entries = kd[0],
                              .ratio = (int)ratio, .idx_w = idx_w,
                              .idx_fmt = op_kv_mxfp4_format((int)block, OP_MX_CEIL, (enum op_nibble_order)nibble)};
  c->k = (int)k, c->pool_block = (int)pool_block;
  return 0;
}

static int idx_read(const struct op_desc *self, struct op_io *io, struct idx_call *c) {
  int64_t qd[3];
  int rc = idx_queries(self, io, c, qd);
  return rc ? rc : idx_keys(self, io, c, (int)qd[2]);
}

int op_indexer_topk_prepare(const struct op_desc *self, struct op_io *io, struct op_indexer_topk_call *t) {
  struct idx_call c;
  double build, top, pin;
  int rc = idx_read(self, io, &c);
  if (rc) return rc;
  if (!op_io_param_in(self, io, "build_pool", 0, 1, &build) || !op_io_param_in(self, io, "pool_top", 1, INT_MAX, &top) ||
      !op_io_param_in(self, io, "pin_newest", 0, 1, &pin))
    return CEDAR_EINVAL;
  int32_t *topk = op_io_out(self, io, "topk", 2, (int64_t[]){c.S, c.k});
  int32_t *pool = topk && build ? op_io_out(self, io, "pool", 2, (int64_t[]){c.S, (int64_t)top}) : NULL;
  if (!topk || (build && !pool)) return CEDAR_ENOMEM;
  *t = (struct op_indexer_topk_call){.q = c.q, .w = c.w, .pos = c.pos, .page = c.page, .kv = c.kv, .S = c.S,
                                     .heads = c.heads, .k = c.k, .pool_block = c.pool_block, .pool_top = (int)top,
                                     .pin_newest = pin != 0, .topk = topk, .pool = pool};
  t->kv.pages = &t->page;
  return 0;
}

static int indexer_topk_run(const struct op_desc *self, struct op_io *io) {
  struct op_indexer_topk_call c = {0};
  int rc = op_indexer_topk_prepare(self, io, &c);
  if (rc) return rc;
  size_t wb = op_indexer_topk_work_bytes(&c.kv, c.pos, c.S, c.pool ? c.pool_block : 0);
  void *work = malloc(wb ? wb : 1);
  if (!work) return op_io_fail(io, "indexer_topk: cannot allocate %zu bytes of workspace", wb), CEDAR_ENOMEM;
  op_indexer_topk(c.topk, c.pool, work, c.q, c.w, c.pos, &c.kv, c.S, c.heads, c.k, c.pool_block, c.pool_top,
                  c.pin_newest);
  free(work);
  return 0;
}

static int cmp_block(const void *a, const void *b) { return cmp_i32(a, b); }

/* pool (S, pool_top): block ids, -1 padded, no block twice in a row (the op
 * asserts that), and pool_top * pool_block within int32 (entry ids). */
static const int32_t *reindex_pool(const struct op_desc *self, struct op_io *io, const struct idx_call *c,
                                   int *pool_top) {
  int64_t pd[2];
  const struct op_tensor *t = op_io_in(self, io, "pool", 2, pd);
  if (!t) return NULL;
  if (pd[0] != c->S || pd[1] < 1 || pd[1] * c->pool_block > INT32_MAX) {
    op_io_fail(io, "reindex: pool is (%lld, %lld) for %d queries; it needs (%d, pool_top) with pool_top >= 1 and "
                   "pool_top * pool_block (%d) <= 2^31 - 1", (long long)pd[0], (long long)pd[1], c->S, c->S,
               c->pool_block);
    return NULL;
  }
  int32_t *row = malloc((size_t)pd[1] * sizeof *row);
  if (!row) return op_io_fail(io, "reindex: out of memory"), NULL;
  const int32_t *pool = t->data;
  bool ok = true;
  for (int i = 0; i < c->S && ok; i++) {
    memcpy(row, pool + (size_t)i * pd[1], (size_t)pd[1] * sizeof *row);
    qsort(row, (size_t)pd[1], sizeof *row, cmp_block);
    for (int64_t b = 1; b < pd[1] && ok; b++)
      if (row[b] >= 0 && row[b] == row[b - 1])
        ok = !op_io_fail(io, "reindex: block %d appears twice in the pool of query %d", (int)row[b], i);
  }
  free(row);
  *pool_top = (int)pd[1];
  return ok ? pool : NULL;
}

int op_reindex_prepare(const struct op_desc *self, struct op_io *io, struct op_reindex_call *r) {
  struct idx_call c;
  int top;
  int rc = idx_read(self, io, &c);
  if (rc) return rc;
  const int32_t *pool = reindex_pool(self, io, &c, &top);
  if (!pool) return CEDAR_EINVAL;
  int32_t *topk = op_io_out(self, io, "topk", 2, (int64_t[]){c.S, c.k});
  if (!topk) return CEDAR_ENOMEM;
  *r = (struct op_reindex_call){.q = c.q, .w = c.w, .pos = c.pos, .page = c.page, .kv = c.kv, .S = c.S,
                                .heads = c.heads, .k = c.k, .pool_block = c.pool_block, .pool_top = top, .pool = pool,
                                .topk = topk};
  r->kv.pages = &r->page;
  return 0;
}

static int reindex_run(const struct op_desc *self, struct op_io *io) {
  struct op_reindex_call c = {0};
  int rc = op_reindex_prepare(self, io, &c);
  if (rc) return rc;
  size_t wb = op_indexer_reindex_work_bytes(&c.kv, c.pool_block, c.pool_top);
  void *work = malloc(wb);
  if (!work) return op_io_fail(io, "reindex: cannot allocate %zu bytes of workspace", wb), CEDAR_ENOMEM;
  op_indexer_reindex(c.topk, work, c.pool, c.q, c.w, c.pos, &c.kv, c.S, c.heads, c.k, c.pool_block, c.pool_top);
  free(work);
  return 0;
}

#define IDX_INPUTS_                                                                                    \
  {"q", OP_F32, "(S, heads, idx_w)", "indexer queries, RoPE'd (q_indexer)"},                           \
  {"w", OP_F32, "(S, heads)", "head weights, scale folded in (index_weights)"},                        \
  {"pos", OP_I64, "(S)", "absolute query positions, >= 0"},                                            \
  {"keys", OP_U8, "(n_entries, bytes)", "Indexer-K entries: mxfp4_pack rows, or compress entries with idx_off"}
#define IDX_PARAMS_                                                                                    \
  {"ratio", OP_PARAM_INT, 2, "tokens per entry of the source [A]: 2 encoder, 1 decoder (L20)"},        \
  {"k", OP_PARAM_INT, 512, "Top-K length, index_topk [A]"},                                            \
  {"idx_block", OP_PARAM_INT, 32, "values per E8M0 scale [A]"},                                        \
  {"nibble", OP_PARAM_INT, 0, "0: element 2j in the low nibble, 1: in the high one [R]"},              \
  {"idx_off", OP_PARAM_INT, 0, "byte offset of the key in a keys row (compress entries: main bytes)"}, \
  {"pool_block", OP_PARAM_INT, 8, "entries per candidate block, candidate_block_size [A]"}

const struct op_desc op_desc_indexer_topk = {
    .name = "indexer_topk",
    .summary = "lightning indexer: scores over the visible keys, Top-K and optionally the candidate pool "
               "(SPEC 3.10-3.11)",
    .inputs = (const struct op_arg[]){IDX_INPUTS_, {0}},
    .outputs = (const struct op_arg[]){{"topk", OP_I32, "(S, k)", "selected entry ids, ascending, -1 padded"},
                                       {"pool", OP_I32, "(S, pool_top)", "with build_pool=1: candidate block ids"},
                                       {0}},
    .params = (const struct op_param[]){IDX_PARAMS_,
                                        {"pool_top", OP_PARAM_INT, 2048, "blocks kept, candidate_topk_blocks [A]"},
                                        {"build_pool", OP_PARAM_BOOL, 0, "also build the candidate pool (L20)"},
                                        {"pin_newest", OP_PARAM_BOOL, 1, "the newest visible block always in the "
                                                                        "pool, candidates.pin_newest [V #12]"},
                                        {0}},
    .run = indexer_topk_run,
};

const struct op_desc op_desc_reindex = {
    .name = "reindex",
    .summary = "reindex: score only the visible entries of the candidate pool's blocks, Top-K (SPEC 3.11)",
    .inputs = (const struct op_arg[]){IDX_INPUTS_,
                                      {"pool", OP_I32, "(S, pool_top)", "candidate block ids (indexer_topk), -1 "
                                                                        "padded, none twice"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"topk", OP_I32, "(S, k)", "selected entry ids, ascending, -1 padded"}, {0}},
    .params = (const struct op_param[]){IDX_PARAMS_, {0}},
    .run = reindex_run,
};

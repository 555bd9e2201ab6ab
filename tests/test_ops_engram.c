/* test_ops_engram.c: Engram tables, hashing, row gather and injection
 * (ops/engram.h) against plain references written here.
 *
 * What it is:
 *   - the prime rule with the V4.1-Flash numbers exactly (SPEC 8.6.29-30):
 *     48 distinct primes, 16 000 057 .. 16 000 889, module rows 384 006 168
 *     and 384 016 682, 768 022 850 rows x 256 = 196 613 849 600 parameters;
 *     every prime and every skipped number checked by trial division here;
 *     op_engram_is_prime on known hard cases (strong pseudoprimes, 2^61 - 1);
 *   - hashing against an int64 floor-modulo reference (and the demo's
 *     signed hash for its bounded multipliers), the held-out signed check
 *     of issue 13 (row 16000054), NumPy's multipliers at fixed vectors, pad ids at the start and across image
 *     positions, decode continuation from history, locality and purity
 *     (SPEC 8.6.28: a function of ids alone, no hidden state);
 *   - the row gather against a float64 E4M3 x 2^(e-127) decode (exact);
 *   - the injection against float64 with per-element bounds derived below.
 *
 * Tolerances. The gather is exact (an E4M3 value times a power of two is a
 * float). The injection is checked in two stages: kv = e W^T against
 * float64 with gamma(d_e) * sum|W e| (BLAS sum of d_e products); then the
 * gate and the update from the op's own kv (so the first stage's rounding
 * does not enter the second). Per stream, with H = hidden:
 *   s = sum (x q)(k kw): 3 products and H-1 adds per term -> gamma(H+2) Sabs;
 *   rx, rk: sum of squares (gamma(H)), /H, +eps, sqrt, 1/ -> gamma(H+4) rel;
 *   dot = s rx rk / sqrt(H): 3 more roundings. Together
 *   |dot - ref| <= gamma(3H+14) * Sabs rx rk / sqrt(H) =: D.
 *   z = sign sqrt(max(|dot|, floor)) is Lipschitz 1/(2 sqrt(max(|dot|-D,
 *   floor))) off zero (+1 u for sqrtf); where |dot| <= D the sign may flip:
 *   |dz| <= 2 sqrt(max(|dot|+D, floor)). sigmoid' <= 1/4, and expf (1 ulp =
 *   2u), 1+, / add gamma(4) relative: |dg| <= |dz|/4 + gamma(4) g.
 *   x' = x + g v: |dx'| <= |v| |dg| + gamma(2) (|x| + |g v|).
 *
 * Run: ctest --test-dir build -R ops_engram --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/engram.h"
#include "tests/harness.h"

#define H_U (H_U32)

/* ---- primes ------------------------------------------------------------- */

static int trial_prime(int64_t n) { /* plain trial division, independent of the op */
  if (n < 2) return 0;
  for (int64_t d = 2; d * d <= n; d++)
    if (n % d == 0) return 0;
  return 1;
}

static void check_flash_primes(void) {
  struct op_engram_tables t;
  EXPECT(op_engram_tables_init(&t, 2, 3, 8, 16000000) == 0, "flash tables init");
  EXPECT(t.n_modules == 2 && t.n_orders == 3 && t.n_heads == 8, "dims kept");
  EXPECT(t.prime[0] == 16000057, "first prime %lld, SPEC 8.6.29 says 16 000 057", (long long)t.prime[0]);
  EXPECT(t.prime[47] == 16000889, "last prime %lld, SPEC 3.15 says 16 000 889", (long long)t.prime[47]);
  EXPECT(t.rows[0] == 384006168, "module 0 rows %lld", (long long)t.rows[0]);
  EXPECT(t.rows[1] == 384016682, "module 1 rows %lld", (long long)t.rows[1]);
  EXPECT(t.rows[0] + t.rows[1] == 768022850, "total rows");
  EXPECT((t.rows[0] + t.rows[1]) * 256 == 196613849600LL, "parameters = rows x 256 = 196.6B (SPEC 8.6.30)");
  /* 48 distinct primes, each the next prime: every integer from table_base
   * up to the last prime is either the next prime in the list or composite. */
  int k = 0;
  for (int64_t v = 16000000; v <= 16000889; v++) {
    if (trial_prime(v)) {
      EXPECT(k < 48 && t.prime[k] == v, "prime %lld missing or out of order (slot %d)", (long long)v, k);
      k++;
    }
  }
  EXPECT(k == 48, "%d primes in [16e6, 16 000 889], want 48", k);
  for (int m = 0; m < 2; m++) { /* offsets are prefix sums inside each module */
    int64_t sum = 0;
    for (int j = 0; j < 24; j++) {
      EXPECT(t.offset[m * 24 + j] == sum, "offset (%d, %d)", m, j);
      sum += t.prime[m * 24 + j];
    }
    EXPECT(sum == t.rows[m], "module %d rows = sum of its primes", m);
  }
  op_engram_tables_free(&t);
}

static void check_prime_rule_misc(void) {
  struct op_engram_tables t;
  /* v41-mini: table_base 1000 -> primes from 1009 up. */
  EXPECT(op_engram_tables_init(&t, 2, 3, 2, 1000) == 0, "mini init");
  static const int64_t want[12] = {1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069};
  for (int i = 0; i < 12; i++) EXPECT(t.prime[i] == want[i], "mini prime %d = %lld", i, (long long)t.prime[i]);
  EXPECT(t.rows[0] == 1009 + 1013 + 1019 + 1021 + 1031 + 1033, "mini rows 0");
  op_engram_tables_free(&t);
  /* A prime base is itself the first prime (starts above base - 1). */
  EXPECT(op_engram_tables_init(&t, 1, 1, 3, 7) == 0 && t.prime[0] == 7 && t.prime[2] == 13, "base 7 -> 7, 11, 13");
  op_engram_tables_free(&t);
  EXPECT(op_engram_tables_init(&t, 0, 3, 8, 100) == -1 && t.prime == NULL, "no modules rejected");
  EXPECT(op_engram_tables_init(&t, 1, 3, 8, 1) == -1, "table_base < 2 rejected");
  EXPECT(op_engram_tables_init(&t, 1, 1, 2, INT64_MAX - 100) == -1, "row sum overflow rejected");

  for (int64_t n = -3; n < 20000; n++) EXPECT(op_engram_is_prime(n) == trial_prime(n), "is_prime(%lld)", (long long)n);
  EXPECT(!op_engram_is_prime(3215031751LL), "strong pseudoprime to bases 2, 3, 5, 7");
  EXPECT(!op_engram_is_prime(3825123056546413051LL), "strong pseudoprime to bases 2..23");
  EXPECT(!op_engram_is_prime(4759123141LL), "4759123141 = 48781 x 97561");
  EXPECT(op_engram_is_prime(2305843009213693951LL), "2^61 - 1 is prime");
  EXPECT(op_engram_is_prime(9223372036854775783LL), "2^63 - 25 is prime");
  EXPECT(!op_engram_is_prime(INT64_MAX), "2^63 - 1 = 7^2 x 73 x ... is composite");
  EXPECT(!op_engram_is_prime(1000000016000000063LL), "(1e9+7)(1e9+9) composite");
}

/* ---- hashing ------------------------------------------------------------ */

static uint64_t ref_splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The plain reference: for each position and order, build the n-gram id by
 * id, scanning the dead flags between the element and the position. */
static int64_t ref_row(const int32_t *tok, const uint8_t *dead, const int32_t *cmap, const uint64_t *mult, int u,
                       int order, int64_t prime, int64_t offset, int32_t pad) {
  uint64_t mix = 0;
  for (int k = 0; k < order; k++) {
    int q = u - k, is_pad = q < 0;
    for (int r = q < 0 ? 0 : q; r <= u && !is_pad && dead; r++) is_pad = dead[r] != 0;
    uint64_t g = is_pad ? (uint64_t)pad : (uint64_t)cmap[tok[q]];
    mix ^= g * mult[k];
  }
  /* int64 floor modulo (Python's %), written apart from the op's helper */
  int64_t sm = (int64_t)mix, r = sm - (sm / prime) * prime;
  if (r < 0) r += prime;
  return r + offset;
}

struct hash_case {
  int n_hist, n, vocab, cvocab, n_orders, n_heads;
  int orders[4];
  int64_t base, id_bound;
  int dead_every; /* 0: no dead positions */
};

static void check_hash_case(const struct hash_case *c, uint64_t *seed) {
  int total = c->n_hist + c->n, T = c->n_orders * c->n_heads, max_order = 0;
  for (int o = 0; o < c->n_orders; o++) max_order = c->orders[o] > max_order ? c->orders[o] : max_order;
  struct op_engram_tables t;
  EXPECT(op_engram_tables_init(&t, 2, c->n_orders, c->n_heads, c->base) == 0, "hash tables");
  int32_t *tok = malloc(total * sizeof *tok), *cmap = malloc(c->vocab * sizeof *cmap);
  uint8_t *dead = calloc(total, 1);
  uint64_t mult[16];
  op_engram_cmap_modulo(cmap, c->vocab, c->cvocab);
  op_engram_multipliers_splitmix64(mult, 42, 14, max_order, c->id_bound);
  for (int u = 0; u < total; u++) {
    tok[u] = (int32_t)(h_uniform(seed) * c->vocab);
    dead[u] = c->dead_every && u % c->dead_every == c->dead_every - 1;
  }
  size_t bytes = (size_t)c->n * T * sizeof(int64_t);
  int64_t *row = (int64_t *)h_alloc_bytes(bytes);
  const int64_t *P = op_engram_primes_of(&t, 1), *O = op_engram_offsets_of(&t, 1);
  int rc = op_engram_hash(row, tok, c->dead_every ? dead : NULL, cmap, mult, c->orders, P, O, c->n_hist, c->n,
                          c->vocab, c->n_orders, c->n_heads, 2);
  EXPECT(rc == -1, "hash returned %d", rc);
  int bad = 0, signed_bad = 0;
  for (int i = 0; i < c->n; i++)
    for (int o = 0; o < c->n_orders; o++)
      for (int h = 0; h < c->n_heads; h++) {
        int j = o * c->n_heads + h;
        int64_t want = ref_row(tok, c->dead_every ? dead : NULL, cmap, mult, c->n_hist + i, c->orders[o], P[j], O[j], 2);
        int64_t got = row[(size_t)i * T + j];
        bad += got != want || got < O[j] || got >= O[j] + P[j] || got >= t.rows[1];
        if (c->id_bound > 0) { /* the demo's signed int64 hash, Python-style mod */
          int64_t smix = 0;
          for (int k = 0; k < c->orders[o]; k++) {
            int q = c->n_hist + i - k, pad = q < 0;
            for (int r = q; r <= c->n_hist + i && !pad && c->dead_every; r++) pad = dead[r];
            int64_t g = pad ? 2 : cmap[tok[q]];
            EXPECT(g == 0 || (int64_t)mult[k] <= INT64_MAX / g, "bounded multiplier product overflows");
            smix ^= g * (int64_t)mult[k];
          }
          int64_t z = smix % P[j];
          signed_bad += (z < 0 ? z + P[j] : z) + O[j] != got;
        }
      }
  EXPECT(bad == 0, "hash (n_hist %d, n %d, orders %d, heads %d): %d rows differ from the reference", c->n_hist, c->n,
         c->n_orders, c->n_heads, bad);
  EXPECT(signed_bad == 0, "%d rows differ from the signed-int64 demo hash", signed_bad);
  h_free_bytes((uint8_t *)row, bytes, "hash rows");
  free(tok), free(cmap), free(dead);
  op_engram_tables_free(&t);
}

static void check_multipliers(void) {
  uint64_t m[4], m2[4], s = 42 + 10007u * 14;
  op_engram_multipliers_splitmix64(m, 42, 14, 4, 0);
  for (int k = 0; k < 4; k++) EXPECT(m[k] == (ref_splitmix(&s) | 1), "full-range multiplier %d", k);
  op_engram_multipliers_splitmix64(m, 0, 0, 1, 0);
  EXPECT(m[0] == 0xE220A8397B1DCDAFull, "splitmix64(0) first output (published test vector)");
  op_engram_multipliers_splitmix64(m, 7, 1, 4, 99092);
  op_engram_multipliers_splitmix64(m2, 7, 1, 4, 99092);
  int64_t lim = INT64_MAX / 99092;
  for (int k = 0; k < 4; k++) {
    EXPECT(m[k] & 1, "multiplier %d odd", k);
    EXPECT(m[k] <= (uint64_t)lim, "bounded multiplier %d below INT64_MAX / id_bound", k);
    EXPECT(m[k] == m2[k], "multipliers deterministic");
  }
  op_engram_multipliers_splitmix64(m2, 7, 14, 4, 99092);
  EXPECT(memcmp(m, m2, sizeof m) != 0, "layers 1 and 14 get different multipliers");
}

/* Python's a % p for p > 0, in 128-bit arithmetic (no overflow at INT64_MIN). */
static int64_t pymod(int64_t a, int64_t p) {
  __int128 r = (__int128)a % p;
  return (int64_t)(r < 0 ? r + p : r);
}

/* The vendor's signed arithmetic (Appendix V #18, issue 13's held-out check):
 * multipliers [-1, 3], tokens [5, 7], one head, prime 16000057: position 0
 * hashes (5, pad 2) to -5 XOR 6 = -3 -> row 16000054 (a uint64 modulo gives
 * 9903347). The pad is cmap[pad token]: with a map that moves id 2, the pad
 * follows it. */
static void check_signed_hash(void) {
  const int64_t prime = 16000057, offset = 0;
  uint64_t mult[2] = {(uint64_t)-1, 3};
  int32_t tok[2] = {5, 7}, cmap[8];
  op_engram_cmap_modulo(cmap, 8, 8);
  int64_t row[2];
  EXPECT(op_engram_hash(row, tok, NULL, cmap, mult, (int[]){2}, &prime, &offset, 0, 2, 8, 1, 1, cmap[2]) == -1,
         "signed hash runs");
  EXPECT(row[0] == 16000054, "held-out check: position 0 row %lld, want 16000054", (long long)row[0]);
  EXPECT(row[0] != 9903347, "not the uint64 modulo");
  /* position 1: 7 * -1 XOR 5 * 3 = -7 ^ 15 = -10 -> prime - 10 */
  EXPECT(row[1] == prime - 10, "position 1 row %lld, want %lld", (long long)row[1], (long long)(prime - 10));
  EXPECT(op_engram_floor_mod(-1, 7) == 6 && op_engram_floor_mod(INT64_MIN, 16000057) == pymod(INT64_MIN, 16000057) &&
             op_engram_floor_mod(INT64_MAX, 3) == 1,
         "floor modulo edge cases");
  /* pad = map[2]: a map sending 2 to 6 hashes the start with 6, not 2 */
  cmap[2] = 6;
  op_engram_hash(row, tok, NULL, cmap, mult, (int[]){2}, &prime, &offset, 0, 1, 8, 1, 1, cmap[2]);
  EXPECT(row[0] == pymod(-5 ^ 18, prime), "pad is the map's value of the pad token");
}

/* The vendor's multipliers: NumPy's default_rng(10007 l).integers(0,
 * (INT64_MAX // Vc) // 2, size=4, dtype=int64) * 2 + 1. The expected values
 * were printed by Debian's numpy 1.24 (tests/np_random_check.py compares
 * many more layers and Vc live). */
static void check_numpy_multipliers(void) {
  static const struct {
    int layer;
    int64_t vc;
    int64_t want[4];
  } cases[] = {
      {14, 99092, {67716810739261, 51510806800915, 30921347202721, 82619226485591}},
      {14, 512, {13105848065966575, 9969353256867905, 5984488548851707, 15990047638496783}},
      {14, 1 << 30, {6946783777, 6249355345, 549590775, 4753758075}}, /* the 32-bit Lemire path */
      {14, 1, {6710194209774887047, 5104308867516368317, 3064058137012074761, 8186904390910353997}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t m[4];
    op_engram_multipliers_numpy(m, cases[i].layer, 4, cases[i].vc);
    for (int k = 0; k < 4; k++)
      EXPECT((int64_t)m[k] == cases[i].want[k], "numpy multiplier layer %d Vc %lld k %d: %lld, want %lld",
             cases[i].layer, (long long)cases[i].vc, k, (long long)m[k], (long long)cases[i].want[k]);
  }
}

/* Start-of-sequence and image-boundary pads, decode continuation, locality. */
static void check_hash_semantics(void) {
  enum { N = 12, NO = 3, NH = 2, T = NO * NH, PAD = 2 };
  const int orders[NO] = {2, 3, 4};
  struct op_engram_tables t;
  op_engram_tables_init(&t, 1, NO, NH, 1000);
  const int64_t *P = t.prime, *O = t.offset;
  int32_t cmap[64], tok[N];
  uint64_t mult[4];
  op_engram_cmap_modulo(cmap, 64, 64);
  op_engram_multipliers_splitmix64(mult, 3, 1, 4, 0);
  for (int u = 0; u < N; u++) tok[u] = 5 + 3 * u;
  int64_t full[N * T], part[N * T], again[N * T];
  op_engram_hash(full, tok, NULL, cmap, mult, orders, P, O, 0, N, 64, NO, NH, PAD);
  /* Position 0, order 2: (pad, tok0) written out by hand. */
  uint64_t mix = (uint64_t)tok[0] * mult[0] ^ (uint64_t)PAD * mult[1];
  EXPECT(full[0] == pymod((int64_t)mix, P[0]) + O[0], "position 0 order 2 = hash(tok0, pad)");
  mix ^= (uint64_t)PAD * mult[2];
  EXPECT(full[NH] == pymod((int64_t)mix, P[NH]) + O[NH], "position 0 order 3 = hash(tok0, pad, pad)");
  /* Decode: the last position from its 3 ids of history equals the full hash. */
  for (int p = 3; p < N; p++) {
    op_engram_hash(part, tok + p - 3, NULL, cmap, mult, orders, P, O, 3, 1, 64, NO, NH, PAD);
    EXPECT(!memcmp(part, full + p * T, T * sizeof *part), "decode continuation at %d", p);
  }
  /* Purity: same ids, same rows, whatever else happened (no hidden state). */
  op_engram_hash(again, tok, NULL, cmap, mult, orders, P, O, 0, N, 64, NO, NH, PAD);
  EXPECT(!memcmp(again, full, sizeof full), "same ids give the same rows");
  /* Locality: changing token 6 changes rows of positions 6..9 only. */
  tok[6] = 61;
  op_engram_hash(again, tok, NULL, cmap, mult, orders, P, O, 0, N, 64, NO, NH, PAD);
  for (int p = 0; p < N; p++) {
    int same = !memcmp(again + p * T, full + p * T, T * sizeof *full);
    EXPECT(same == (p < 6 || p > 9), "position %d %s after changing token 6", p, same ? "unchanged" : "changed");
  }
  tok[6] = 5 + 18;
  /* An image position at 4: position 4's grams are all pad; positions after
   * it hash as a fresh sequence starting at 5. */
  uint8_t dead[N] = {0};
  dead[4] = 1;
  int64_t fresh[N * T];
  op_engram_hash(again, tok, dead, cmap, mult, orders, P, O, 0, N, 64, NO, NH, PAD);
  op_engram_hash(fresh, tok + 5, NULL, cmap, mult, orders, P, O, 0, N - 5, 64, NO, NH, PAD);
  EXPECT(!memcmp(again + 5 * T, fresh, (N - 5) * T * sizeof *fresh), "grams never reach back across the image");
  EXPECT(!memcmp(again, full, 4 * T * sizeof *full), "positions before the image unchanged");
  mix = 0;
  for (int k = 0; k < 4; k++) mix ^= (uint64_t)PAD * mult[k];
  EXPECT(again[4 * T + 2 * NH] == pymod((int64_t)mix, P[2 * NH]) + O[2 * NH], "image position: all-pad 4-gram");
  /* A bad id: its index comes back and nothing is written. */
  int64_t guard[N * T];
  memset(guard, 0x5A, sizeof guard);
  tok[2] = 64;
  EXPECT(op_engram_hash(guard, tok, NULL, cmap, mult, orders, P, O, 1, N - 1, 64, NO, NH, PAD) == 2, "bad id index");
  for (int i = 0; i < N * T; i++) EXPECT(guard[i] == 0x5A5A5A5A5A5A5A5ALL, "nothing written on a bad id (%d)", i);
  op_engram_tables_free(&t);
}

/* ---- row gather --------------------------------------------------------- */

static double ref_e4m3(int code) { /* OCP E4M3FN, written out; NaN codes are never generated */
  int e = (code >> 3) & 15, m = code & 7;
  double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) ? -v : v;
}

static void check_gather(int n, int n_tables, int head_dim, int block, int64_t n_rows, uint64_t *seed) {
  size_t rb = op_engram_row_bytes(head_dim, block), w = (size_t)n_tables * head_dim;
  EXPECT(rb == (size_t)head_dim + head_dim / block, "row bytes %zu", rb);
  uint8_t *table = malloc(rb * n_rows);
  for (size_t b = 0; b < rb * n_rows; b++) {
    size_t col = b % rb;
    uint8_t v = (uint8_t)(h_uniform(seed) * 256);
    if (col < (size_t)head_dim && (v & 0x7F) == 0x7F) v ^= 1; /* no NaN codes */
    if (col >= (size_t)head_dim) v = (uint8_t)(110 + h_uniform(seed) * 30); /* scales 2^-17 .. 2^12 */
    table[b] = v;
  }
  int64_t *row = malloc((size_t)n * n_tables * sizeof *row);
  for (int i = 0; i < n * n_tables; i++) row[i] = (int64_t)(h_uniform(seed) * n_rows);
  row[0] = n_rows - 1; /* the last row is reachable */
  float *e = h_alloc((size_t)n * w);
  double *ref = malloc((size_t)n * w * sizeof *ref);
  op_engram_gather(e, table, row, n, n_tables, head_dim, block, n_rows);
  for (int i = 0; i < n * n_tables; i++) {
    const uint8_t *r = table + (size_t)row[i] * rb;
    for (int c = 0; c < head_dim; c++)
      ref[(size_t)i * head_dim + c] = ref_e4m3(r[c]) * ldexp(1.0, r[head_dim + c / block] - 127);
  }
  /* Exact: an E4M3 value times a power of two in range is a float. */
  h_close(e, ref, NULL, (size_t)n * w, 0, 0, 0, "gather");
  h_free(e, (size_t)n * w, "gather e");
  free(ref), free(row), free(table);
}

/* ---- injection ---------------------------------------------------------- */

struct inj_case {
  int n, d_e, hidden, hc;
  float q_scale; /* scales q_w: tiny values push |dot| under the floor */
};

/* Stage 2 reference for one (position, stream): gate and its bound. */
static double ref_gate(const float *x, const float *key, const float *q, const float *kw, int H, float eps,
                       float floor_, double *dg) {
  double S = 0, Sabs = 0, ssx = 0, ssk = 0;
  for (int j = 0; j < H; j++) {
    double t = (double)x[j] * q[j] * key[j] * kw[j];
    S += t, Sabs += fabs(t), ssx += (double)x[j] * x[j], ssk += (double)key[j] * key[j];
  }
  double rx = 1 / sqrt(ssx / H + eps), rk = 1 / sqrt(ssk / H + eps), c = rx * rk / sqrt((double)H);
  double dot = S * c, D = h_gamma(3.0 * H + 14) * Sabs * c, fl = floor_;
  double z = dot == 0 ? 0 : copysign(sqrt(fmax(fabs(dot), fl)), dot);
  double dz = fabs(dot) <= D ? 2 * sqrt(fmax(fabs(dot) + D, fl)) : D / (2 * sqrt(fmax(fabs(dot) - D, fl)));
  dz += H_U * fabs(z);
  double g = 1 / (1 + exp(-z));
  *dg = dz / 4 + h_gamma(4) * g;
  return g;
}

static void check_inject(const struct inj_case *c, uint64_t *seed) {
  int n = c->n, H = c->hidden, hc = c->hc, w = (hc + 1) * H;
  size_t nx = (size_t)n * hc * H, nkv = (size_t)n * w;
  float *x = h_alloc(nx), *kv = h_alloc(nkv), *gate = h_alloc((size_t)n * hc);
  float *x0 = malloc(nx * sizeof *x0), *e = malloc((size_t)n * c->d_e * sizeof *e);
  float *W = malloc((size_t)w * c->d_e * sizeof *W), *q = malloc((size_t)hc * H * sizeof *q),
        *kw = malloc((size_t)hc * H * sizeof *kw);
  h_fill(x, nx, seed, -2, 2), h_fill(e, (size_t)n * c->d_e, seed, -1.5f, 1.5f);
  h_fill(W, (size_t)w * c->d_e, seed, -0.2f, 0.2f);
  h_fill(q, (size_t)hc * H, seed, 0.5f * c->q_scale, 1.5f * c->q_scale), h_fill(kw, (size_t)hc * H, seed, 0.5f, 1.5f);
  memcpy(x0, x, nx * sizeof *x);
  const float eps = 1e-6f, floor_ = 1e-6f;
  op_engram_inject(x, kv, gate, e, W, q, kw, n, c->d_e, H, hc, eps, floor_);
  double *ref = malloc(nkv * sizeof *ref), *abs_ = malloc(nkv * sizeof *abs_);
  for (int i = 0; i < n; i++)
    for (int r = 0; r < w; r++) {
      double s = 0, a = 0;
      for (int k = 0; k < c->d_e; k++) {
        double t = (double)W[(size_t)r * c->d_e + k] * e[(size_t)i * c->d_e + k];
        s += t, a += fabs(t);
      }
      ref[(size_t)i * w + r] = s, abs_[(size_t)i * w + r] = a;
    }
  h_close(kv, ref, abs_, nkv, c->d_e, 0, 0, "engram kv"); /* sgemm: gamma(d_e) sum|W e| */
  double *gref = malloc((size_t)n * hc * sizeof *gref), *gbound = malloc((size_t)n * hc * sizeof *gbound);
  double *xref = malloc(nx * sizeof *xref), *xbound = malloc(nx * sizeof *xbound);
  for (int i = 0; i < n; i++)
    for (int s = 0; s < hc; s++) {
      const float *xs = x0 + ((size_t)i * hc + s) * H, *v = kv + (size_t)i * w + (size_t)hc * H;
      size_t gi = (size_t)i * hc + s;
      gref[gi] = ref_gate(xs, kv + (size_t)i * w + (size_t)s * H, q + (size_t)s * H, kw + (size_t)s * H, H, eps,
                          floor_, &gbound[gi]);
      for (int j = 0; j < H; j++) {
        size_t xi = gi * H + j;
        xref[xi] = xs[j] + gref[gi] * v[j];
        xbound[xi] = fabs(v[j]) * gbound[gi] + h_gamma(2) * (fabs(xs[j]) + gref[gi] * fabs(v[j]));
      }
    }
  h_within(gate, gref, gbound, (size_t)n * hc, "engram gate");
  h_within(x, xref, xbound, nx, "engram x");
  for (size_t i = 0; i < (size_t)n * hc; i++) EXPECT(gate[i] > 0 && gate[i] < 1, "gate %zu in (0, 1)", i);
  h_free(x, nx, "engram x"), h_free(kv, nkv, "engram kv"), h_free(gate, (size_t)n * hc, "engram gate");
  free(x0), free(e), free(W), free(q), free(kw), free(ref), free(abs_), free(gref), free(gbound), free(xref), free(xbound);
}

/* Invariants of the gate: q_w = 0 gives dot = 0 and gate exactly 1/2 (x +=
 * v/2); negating q_w negates dot, so gate -> 1 - gate. */
static void check_gate_symmetry(uint64_t *seed) {
  enum { n = 2, d = 12, H = 9, hc = 2, w = (hc + 1) * H };
  float x[n * hc * H], x2[n * hc * H], kv[n * w], g[n * hc], g2[n * hc], e[n * d], W[w * d], q[hc * H], k[hc * H];
  h_fill(x, n * hc * H, seed, -1, 1), h_fill(e, n * d, seed, -1, 1), h_fill(W, w * d, seed, -1, 1);
  h_fill(q, hc * H, seed, -1, 1), h_fill(k, hc * H, seed, -1, 1);
  memcpy(x2, x, sizeof x);
  op_engram_inject(x2, kv, g, e, W, q, k, n, d, H, hc, 1e-6f, 1e-6f);
  for (int i = 0; i < hc * H; i++) q[i] = -q[i];
  memcpy(x2, x, sizeof x);
  op_engram_inject(x2, kv, g2, e, W, q, k, n, d, H, hc, 1e-6f, 1e-6f);
  for (int i = 0; i < n * hc; i++) /* 1 - sigmoid(z) vs sigmoid(-z): a few ulps of 1 */
    EXPECT(fabs(g[i] + g2[i] - 1.0) <= 8 * H_U, "gate(-q) = 1 - gate(q): %g + %g", g[i], g2[i]);
  memset(q, 0, sizeof q);
  memcpy(x2, x, sizeof x);
  op_engram_inject(x2, kv, g, e, W, q, k, n, d, H, hc, 1e-6f, 1e-6f);
  for (int i = 0; i < n * hc; i++) EXPECT(g[i] == 0.5f, "q_w = 0: gate %g, want exactly 0.5", g[i]);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0xE46A4001;
  check_flash_primes();
  check_prime_rule_misc();
  check_multipliers();
  check_signed_hash();
  check_numpy_multipliers();
  check_hash_semantics();
  /* (n_hist, n, vocab, compressed vocab, orders, heads, base, id bound, dead every) */
  struct hash_case hc[] = {
      {0, 64, 1000, 97, 3, 3, {2, 3, 4}, 1000, 0, 0},          /* full-range multipliers: products wrap */
      {0, 57, 129280, 99092, 3, 8, {2, 3, 4}, 16000000, 99092, 0}, /* flash primes, demo-bounded multipliers */
      {3, 41, 500, 500, 3, 5, {1, 3, 5}, 2, 0, 7},              /* odd orders, history, images every 7 */
      {0, 33, 300, 31, 2, 1, {4, 2}, 50, 31, 3},                /* unsorted orders, dense images */
      {2, 1, 77, 77, 1, 7, {3}, 123457, 0, 2},                  /* one decode position */
  };
  for (size_t i = 0; i < sizeof hc / sizeof hc[0]; i++) check_hash_case(&hc[i], &seed);
  check_gather(3, 24, 256, 32, 50, &seed); /* SPEC: 24 heads x 264 B rows */
  check_gather(5, 6, 96, 32, 17, &seed);
  check_gather(2, 5, 21, 7, 9, &seed); /* odd width and block */
  check_gather(1, 1, 1, 1, 1, &seed);
  struct inj_case ic[] = {
      {4, 6 * 32, 64, 4, 1.0f},  /* SPEC shape, small widths (hc = 4 streams) */
      {3, 63, 37, 3, 1.0f},      /* odd */
      {2, 7, 5, 1, 1.0f},        /* one stream */
      {3, 40, 33, 4, 1e-7f},     /* |dot| under the 1e-6 floor */
      {1, 129, 256, 2, 0.01f},
  };
  for (size_t i = 0; i < sizeof ic / sizeof ic[0]; i++) check_inject(&ic[i], &seed);
  check_gate_symmetry(&seed);
  return h_report("ops_engram");
}

/* test_ops_compressor.c: ops/compressor.h (KV-source compressor, tail, global
 * entry emission) against float64 references written here, plus the SPEC
 * 8.2 invariants 5-8, 10-12 and the tail rule of SPEC 3.9.
 *
 * Tolerances. Each reference value carries a bound B >= |op - ref|, built
 * stage by stage as in tests/test_ops_qkv.c (same rules, repeated below so
 * this file stands alone): linear maps gamma(K) sum|W|(|x| + xb) +
 * sum|W| xb; RMSNorm through the 1-Lipschitz rms plus (gamma(d)/2 + 6u) of
 * its own rounding; RoPE: the rotation keeps the input error, plus 3u of
 * float cos/sin, products and sum. The chain here is
 *   v, g = W u  ->  pooling  ->  RMSNorm_C = c  ->  kM = RoPE(c)
 *                                             ->  kI = RoPE_I([k_norm] W_ik c)
 * The pooling stage (per channel, over the r slots, softmax of g): with the
 * op's inputs off by vb, gb and E = max gb, every softmax weight moves by a
 * factor within [e^-2E, e^2E], so the exact pooling of the op's inputs is off
 * by max vb + (e^2E - 1) sum alpha|v|; the op's own rounding (g - max with
 * absolute error Delta u, Delta = max(max g - g) + 2E; expf within 1 ulp; an
 * r-term sum for s and one for acc; one division) adds
 * A' (2 eps_e + 2 gamma(r) + 2u), eps_e = (Delta + 2) u, A' = e^2E
 * (sum alpha|v| + max vb): 2 eps_e from the weights' relative error, 1u of
 * the 2u covers second-order terms. Ratio 1 copies v exactly.
 * h_close runs with k = 1 and absref = B / gamma(1): |op - ref| <= B per
 * element, after the NaN/Inf check.
 *
 * Bitwise vs tolerance (SPEC 8.2.12): op_comp_push on the same projected rows
 * must give bit-identical entries, floats and tails for every split of the
 * positions into calls (its arithmetic is per group in a fixed order);
 * op_compress projects with a GEMM over each call's rows, which OpenBLAS does
 * not compute row-independently, so its split runs are each checked against
 * the float64 reference within B instead.
 *
 * Run: ctest --test-dir build -R ops_compressor --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/compressor.h"
#include "tests/harness.h"

#define U H_U32
#define PAD 0x5A /* bytes of an entry outside its two parts must keep this */
static const float EPS = 1e-6f;

/* ---- float64 references with error bounds (see the header) ----------- */

static double *dalloc(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  if (!p) abort();
  return p;
}

/* One group: v, g (r, d) rows with bounds -> c_hat (d) with bound. */
static void ref_pool(double *ch, double *chb, const double *v, const double *vb, const double *g, const double *gb,
                     int r, int d) {
  for (int c = 0; c < d; c++) {
    if (r == 1) { /* softmax over one slot is exactly 1; the op copies v */
      ch[c] = v[c], chb[c] = vb[c];
      continue;
    }
    double m = -INFINITY, E = 0, mv = 0, s = 0, num = 0, A = 0, spread = 0;
    for (int i = 0; i < r; i++) m = fmax(m, g[i * d + c]), E = fmax(E, gb[i * d + c]), mv = fmax(mv, vb[i * d + c]);
    for (int i = 0; i < r; i++) {
      double e = exp(g[i * d + c] - m);
      s += e, num += e * v[i * d + c], A += e * fabs(v[i * d + c]), spread = fmax(spread, m - g[i * d + c]);
    }
    A /= s;
    double eps_e = (spread + 2 * E + 2) * U, Ap = exp(2 * E) * (A + mv);
    ch[c] = num / s;
    chb[c] = mv + (exp(2 * E) - 1) * A + Ap * (2 * eps_e + 2 * h_gamma(r) + 2 * U);
  }
}

/* ---- a compressor layer with random weights ---------------------------- */

struct ccfg {
  int ratio, hidden, d, rope_dim, idx_dim, idx_rope, main_block, idx_block;
  bool k_norm, k_gamma, yarn;
};

struct cdata {
  struct ccfg c;
  float *W_kv, *W_gate, *gamma, *W_ik, *k_gamma;
  struct op_rope rope, rope_i;
  struct op_comp_layer L;
};

static float *rand_floats(size_t n, uint64_t *seed, float lo, float hi) {
  float *x = h_alloc(n);
  h_fill(x, n, seed, lo, hi);
  return x;
}

/* Weights sized so v ~ 0.6 and g ~ 2 in magnitude: the softmax is far from
 * uniform and far from one-hot. */
static void cdata_init(struct cdata *D, const struct ccfg *c, uint64_t *seed) {
  memset(D, 0, sizeof *D);
  D->c = *c;
  float wa = 1.7f / sqrtf((float)c->hidden), wg = 6.0f / sqrtf((float)c->hidden), wi = 1.7f / sqrtf((float)c->d);
  D->W_kv = rand_floats((size_t)c->d * c->hidden, seed, -wa, wa);
  if (c->ratio > 1) D->W_gate = rand_floats((size_t)c->d * c->hidden, seed, -wg, wg);
  D->gamma = rand_floats((size_t)c->d, seed, -1.5f, 1.5f);
  D->W_ik = rand_floats((size_t)c->idx_dim * c->d, seed, -wi, wi);
  if (c->k_gamma) D->k_gamma = rand_floats((size_t)c->idx_dim, seed, 0.5f, 1.5f);
  double theta = c->yarn ? 160000 : 10000;
  EXPECT(op_rope_init(&D->rope, c->d, c->rope_dim, true, theta, c->yarn, 16, 65536, 32, 1) == 0, "rope");
  EXPECT(op_rope_init(&D->rope_i, c->idx_dim, c->idx_rope, true, theta, c->yarn, 16, 65536, 32, 1) == 0, "rope_i");
  D->L = (struct op_comp_layer){.ratio = c->ratio, .hidden = c->hidden, .d = c->d, .idx_dim = c->idx_dim,
                                .W_kv = D->W_kv, .W_gate = D->W_gate, .gamma = D->gamma, .W_ik = D->W_ik,
                                .k_norm = c->k_norm, .k_gamma = D->k_gamma, .eps = EPS, .rope = &D->rope,
                                .rope_i = &D->rope_i,
                                .main_fmt = op_kv_fp4_format(c->main_block, OP_NIBBLE_EVEN_LOW),
                                .idx_fmt = op_kv_mxfp4_format(c->idx_block, OP_MX_CEIL, OP_NIBBLE_EVEN_LOW)};
}

static void cdata_free(struct cdata *D) {
  const struct ccfg *c = &D->c;
  h_free(D->W_kv, (size_t)c->d * c->hidden, "W_kv");
  if (D->W_gate) h_free(D->W_gate, (size_t)c->d * c->hidden, "W_gate");
  h_free(D->gamma, (size_t)c->d, "gamma");
  h_free(D->W_ik, (size_t)c->idx_dim * c->d, "W_ik");
  if (D->k_gamma) h_free(D->k_gamma, (size_t)c->idx_dim, "k_gamma");
}

/* ---- output buffers ---------------------------------------------------- */

/* An output of capacity cap: parts separated by PAD gaps (layout 0: main
 * first; 1: indexer first), every byte pre-set to PAD. */
static void out_alloc(struct op_comp_out *o, const struct op_comp_layer *L, int cap, int layout) {
  size_t mb = op_kv_bytes(&L->main_fmt, L->d), ib = op_kv_bytes(&L->idx_fmt, L->idx_dim);
  memset(o, 0, sizeof *o);
  o->main_off = layout ? ib + 5 : 0;
  o->idx_off = layout ? 0 : mb + 5;
  o->entry_bytes = mb + ib + 8;
  o->max_entries = cap;
  o->entries = h_alloc_bytes((size_t)cap * o->entry_bytes);
  memset(o->entries, PAD, (size_t)cap * o->entry_bytes);
  o->pos = malloc(((size_t)cap + 1) * sizeof *o->pos);
  o->c = h_alloc((size_t)cap * L->d);
  o->kM = h_alloc((size_t)cap * L->d);
  o->kI = h_alloc((size_t)cap * L->idx_dim);
}

static void out_free(struct op_comp_out *o, const struct op_comp_layer *L) {
  size_t cap = (size_t)o->max_entries;
  h_free_bytes(o->entries, cap * o->entry_bytes, "entries");
  h_free(o->c, cap * L->d, "out c");
  h_free(o->kM, cap * L->d, "out kM");
  h_free(o->kI, cap * L->idx_dim, "out kI");
  free(o->pos);
}

/* The same output seen from entry e0 on (for the calls of a split run). */
static struct op_comp_out out_from(const struct op_comp_out *o, const struct op_comp_layer *L, int e0) {
  struct op_comp_out v = *o;
  v.entries += (size_t)e0 * o->entry_bytes;
  v.max_entries -= e0;
  v.pos += e0;
  v.c += (size_t)e0 * L->d;
  v.kM += (size_t)e0 * L->d;
  v.kI += (size_t)e0 * L->idx_dim;
  return v;
}

/* Entry bytes are exactly the packers' output of the op's own floats, and
 * nothing outside the two parts is written. */
static void check_bytes(const struct op_comp_out *o, const struct op_comp_layer *L, int E, const char *what) {
  uint8_t *want = malloc(o->entry_bytes);
  for (int e = 0; e < E; e++) {
    const uint8_t *got = o->entries + (size_t)e * o->entry_bytes;
    memset(want, PAD, o->entry_bytes);
    op_fp4_pack(want + o->main_off, o->kM + (size_t)e * L->d, L->d, L->main_fmt.block, L->main_fmt.nibble);
    op_mxfp4_pack(want + o->idx_off, o->kI + (size_t)e * L->idx_dim, L->idx_dim, L->idx_fmt.block, OP_MX_CEIL,
                  L->idx_fmt.nibble);
    EXPECT(memcmp(got, want, o->entry_bytes) == 0, "%s: entry %d bytes are not pack(kM) | pack(kI) | untouched pad",
           what, e);
  }
  free(want);
}

/* ---- the reference of a whole run ------------------------------------- */

struct cref {
  int E;
  int64_t *pos;
  double *v, *vb, *g, *gb; /* (N, d): projected rows, kept to check the tail */
  double *c, *cb, *kM, *kMb, *kI, *kIb;
};

/* Entries of positions [start, start + N) (start a multiple of r). */
static void cref_build(struct cref *R, const struct cdata *D, const float *u, int64_t start, int N) {
  const int r = D->c.ratio, d = D->c.d, di = D->c.idx_dim, h = D->c.hidden;
  double *ud = dalloc((size_t)N * h), *g = dalloc((size_t)N * d), *gb = dalloc((size_t)N * d);
  R->g = g, R->gb = gb;
  for (size_t i = 0; i < (size_t)N * h; i++) ud[i] = u[i];
  R->E = N / r;
  R->pos = malloc(((size_t)R->E + 1) * sizeof *R->pos);
  R->v = dalloc((size_t)N * d), R->vb = dalloc((size_t)N * d);
  R->c = dalloc((size_t)R->E * d), R->cb = dalloc((size_t)R->E * d);
  R->kM = dalloc((size_t)R->E * d), R->kMb = dalloc((size_t)R->E * d);
  R->kI = dalloc((size_t)R->E * di), R->kIb = dalloc((size_t)R->E * di);
  h_ref_linear(R->v, R->vb, D->W_kv, ud, NULL, N, h, d);
  if (r > 1) h_ref_linear(g, gb, D->W_gate, ud, NULL, N, h, d);
  for (int j = 0; j < R->E; j++) {
    size_t o = (size_t)j * r * d;
    ref_pool(R->c + (size_t)j * d, R->cb + (size_t)j * d, R->v + o, R->vb + o, g + o, gb + o, r, d);
    R->pos[j] = start + (int64_t)j * r;
  }
  h_ref_rmsnorm(R->c, R->cb, R->c, R->cb, D->gamma, R->E, d, EPS);
  h_ref_linear(R->kI, R->kIb, D->W_ik, R->c, R->cb, R->E, d, di);
  if (D->c.k_norm) h_ref_rmsnorm(R->kI, R->kIb, R->kI, R->kIb, D->k_gamma, R->E, di, EPS);
  h_ref_rope(R->kI, R->kIb, &D->rope_i, R->pos, R->E, 1);
  memcpy(R->kM, R->c, (size_t)R->E * d * sizeof *R->kM);
  memcpy(R->kMb, R->cb, (size_t)R->E * d * sizeof *R->kMb);
  h_ref_rope(R->kM, R->kMb, &D->rope, R->pos, R->E, 1);
  free(ud);
}

static void cref_free(struct cref *R) {
  double *all[] = {R->v, R->vb, R->g, R->gb, R->c, R->cb, R->kM, R->kMb, R->kI, R->kIb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
  free(R->pos);
}

/* ---- running a split ---------------------------------------------------- */

/* Call sizes covering N positions, at most cap calls (cap >= N + 2): 0 one
 * call; 1 one position per call; 2 random sizes in [0, 2r + 1] (empty calls
 * included); 3 odd sizes 1, 3, 5, ... */
static int make_sizes(int *sz, int cap, int N, int kind, int r, uint64_t *seed) {
  int k = 0, left = N;
  do {
    int s = kind == 0 ? N : kind == 1 ? 1 : kind == 2 ? (int)(h_uniform(seed) * (2 * r + 2)) : 2 * k + 1;
    if (s > left) s = left;
    if (s == 0 && k + left + 2 >= cap) s = left < 1 ? left : 1;
    sz[k++] = s, left -= s;
  } while (left > 0);
  return k;
}

/* Positions [start, start + N) through the tail in calls of sz[]: with v ==
 * NULL through op_compress (projecting u), else through op_comp_push on the
 * given projected rows. After each call the tail must hold exactly the
 * positions [b - (b - start) mod r, b) of the boundary b, and, for push, the
 * very rows it was given for them. Returns the entries emitted in all. */
static int run_split(const struct op_comp_out *o, struct op_comp_tail *t, const struct cdata *D, const float *u,
                     const float *v, const float *g, int64_t start, const int *sz, int ncall, int align,
                     const char *what) {
  const struct op_comp_layer *L = &D->L;
  const int r = L->ratio, d = L->d;
  int E = 0, done = 0;
  for (int k = 0; k < ncall; k++) {
    int n = sz[k];
    struct op_comp_out view = out_from(o, L, E);
    int got;
    /* Every other call takes its rows' RoPE angles from a table, as the
     * model's tiles do; the bitwise split checks then also hold the table
     * path to the computed one. */
    int64_t *pos = malloc(((size_t)n + 1) * sizeof *pos);
    size_t na = op_rope_angles_floats(L->rope, n) + 1;
    float *abuf = h_alloc(na);
    struct op_rope_angles ang;
    for (int i = 0; i < n; i++) pos[i] = start + done + i;
    op_rope_angles_init(&ang, abuf, L->rope, pos, n);
    const struct op_rope_angles *at = k % 2 ? &ang : NULL;
    if (v) {
      size_t nw = op_comp_work_floats(d, L->idx_dim) + (size_t)align;
      float *work = h_alloc(nw);
      got = op_comp_push(&view, t, work + align, v + (size_t)done * d, g ? g + (size_t)done * d : NULL,
                         start + done, n, L, at);
      h_free(work, nw, "push work");
    } else {
      size_t ns = op_comp_scratch_floats(n, r, d, L->idx_dim);
      float *scratch = h_alloc(ns);
      got = op_compress(&view, t, scratch, u + (size_t)done * L->hidden, start + done, n, L, at);
      h_free(scratch, ns, "compress scratch");
    }
    h_free(abuf, na, "angles"), free(pos);
    int64_t b = start + done + n;
    int want = (int)((b - start) / r) - E; /* groups completed by position b, less those already out */
    EXPECT(got == want, "%s: call %d [%lld, %lld) emitted %d, want %d", what, k, (long long)(start + done),
           (long long)b, got, want);
    if (got < 0) return E;
    E += got, done += n;
    EXPECT(t->count == (int)((b - start) % r) && t->pos0 == b - t->count,
           "%s: after call %d the tail is (pos0 %lld, count %d), want (%lld, %d)", what, k, (long long)t->pos0,
           t->count, (long long)(b - (b - start) % r), (int)((b - start) % r));
    if (v && t->count > 0) {
      size_t first = (size_t)(t->pos0 - start) * d, bytes = (size_t)t->count * d * sizeof(float);
      EXPECT(memcmp(t->v, v + first, bytes) == 0 && memcmp(t->g, g + first, bytes) == 0,
             "%s: after call %d the tail rows are not the pending positions' rows", what, k);
    }
  }
  return E;
}

static void check_entries(const struct op_comp_out *o, const struct cref *R, const struct cdata *D, int E,
                          const char *name) {
  char what[160];
  EXPECT(E == R->E, "%s: %d entries, want %d", name, E, R->E);
  if (E != R->E) return;
  for (int j = 0; j < E; j++)
    EXPECT(o->pos[j] == R->pos[j], "%s: entry %d at position %lld, want %lld", name, j, (long long)o->pos[j],
           (long long)R->pos[j]);
  snprintf(what, sizeof what, "%s: c", name);
  h_within(o->c, R->c, R->cb, (size_t)E * D->c.d, what);
  snprintf(what, sizeof what, "%s: kM", name);
  h_within(o->kM, R->kM, R->kMb, (size_t)E * D->c.d, what);
  snprintf(what, sizeof what, "%s: kI", name);
  h_within(o->kI, R->kI, R->kIb, (size_t)E * D->c.idx_dim, what);
  check_bytes(o, &D->L, E, name);
}

static struct op_comp_tail new_tail(float **buf, int r, int d, int64_t start) {
  struct op_comp_tail t;
  size_t tf = op_comp_tail_floats(r, d);
  *buf = r > 1 ? h_alloc(tf) : NULL; /* ratio 1 needs no rows at all */
  EXPECT(op_comp_tail_init(&t, *buf, r, d, start) == 0, "tail init r=%d start %lld", r, (long long)start);
  return t;
}

static void free_tail(float *buf, int r, int d) {
  if (buf) h_free(buf, op_comp_tail_floats(r, d), "tail rows");
}

/* ---- the checks ---------------------------------------------------------- */

/* Every op output against the float64 chain, for one-shot and split runs
 * through op_compress (split runs within the derived bound, not bitwise:
 * see the header), and the final tail's rows against the projections. */
static void test_reference(const struct ccfg *c, int N, int64_t start, uint64_t *seed) {
  struct cdata D;
  cdata_init(&D, c, seed);
  const int r = c->ratio, d = c->d;
  float *u = rand_floats((size_t)N * c->hidden, seed, -1, 1);
  struct cref R;
  cref_build(&R, &D, u, start, N);
  for (int kind = 0; kind < 4; kind++) {
    char name[160];
    snprintf(name, sizeof name, "ref r=%d hidden=%d d=%d idx=%d N=%d split %d", r, c->hidden, d, c->idx_dim, N,
             kind);
    int sz[4 * 64], cap = (int)(sizeof sz / sizeof sz[0]);
    int ncall = make_sizes(sz, cap, N, kind, r, seed);
    float *tb;
    struct op_comp_tail t = new_tail(&tb, r, d, start);
    struct op_comp_out o;
    out_alloc(&o, &D.L, R.E, kind & 1);
    int E = run_split(&o, &t, &D, u, NULL, NULL, start, sz, ncall, 0, name);
    check_entries(&o, &R, &D, E, name);
    if (t.count > 0) {
      size_t first = (size_t)(t.pos0 - start) * d, m = (size_t)t.count * d;
      char what[200];
      snprintf(what, sizeof what, "%s: tail v", name);
      h_within(t.v, R.v + first, R.vb + first, m, what);
      snprintf(what, sizeof what, "%s: tail g", name);
      h_within(t.g, R.g + first, R.gb + first, m, what);
    }
    out_free(&o, &D.L);
    free_tail(tb, r, d);
  }
  cref_free(&R);
  h_free(u, (size_t)N * c->hidden, "u");
  cdata_free(&D);
}

/* SPEC 8.2.5: ratio 1 has no gate weights (W_gate NULL, no tail rows: an
 * access would crash under ASan) and its latent is RMSNorm(W_kv u): bit for
 * bit what op_linear over the same rows and op_rmsnorm give. */
static void test_ratio1(uint64_t *seed) {
  const struct ccfg c = {1, 40, 24, 8, 16, 8, 8, 16, false, false, true};
  struct cdata D;
  cdata_init(&D, &c, seed);
  const int N = 11;
  EXPECT(D.L.W_gate == NULL && op_comp_tail_floats(1, c.d) == 0, "ratio 1 must need no gate and no tail rows");
  float *u = rand_floats((size_t)N * c.hidden, seed, -1, 1), *tb;
  struct op_comp_tail t = new_tail(&tb, 1, c.d, 0);
  struct op_comp_out o;
  out_alloc(&o, &D.L, N, 0);
  size_t ns = op_comp_scratch_floats(N, 1, c.d, c.idx_dim);
  float *scratch = h_alloc(ns), *want = h_alloc((size_t)N * c.d);
  EXPECT(op_compress(&o, &t, scratch, u, 0, N, &D.L, NULL) == N, "ratio 1: one entry per position");
  EXPECT(t.count == 0 && t.pos0 == N, "ratio 1: the tail stays empty");
  op_linear(want, u, D.W_kv, N, c.hidden, c.d, c.hidden, c.d);
  op_rmsnorm(want, want, D.gamma, N, c.d, EPS);
  EXPECT(memcmp(o.c, want, (size_t)N * c.d * sizeof *want) == 0, "ratio 1: c != RMSNorm(W_kv u) bit for bit");
  struct cref R;
  cref_build(&R, &D, u, 0, N);
  check_entries(&o, &R, &D, N, "ratio 1");
  cref_free(&R);
  h_free(scratch, ns, "scratch");
  h_free(want, (size_t)N * c.d, "want");
  h_free(u, (size_t)N * c.hidden, "u");
  out_free(&o, &D.L);
  cdata_free(&D);
}

/* SPEC 8.2.6: equal gates in every channel pool to the mean of the projected
 * values before the norm. r = 2: e = exp(0) = 1 exactly, s = 2, so c_hat is
 * fl(v0 + v1) / 2 and c is op_rmsnorm of that, bit for bit; any r: within
 * the pooling bound (with exact g) of the float64 mean, normalised. */
static void test_equal_gates(uint64_t *seed) {
  for (int r = 2; r <= 3; r++) {
    const struct ccfg c = {r, 8, 24, 8, 8, 4, 8, 8, false, false, false};
    struct cdata D;
    cdata_init(&D, &c, seed);
    const int d = c.d;
    float *v = rand_floats((size_t)r * d, seed, -1, 1), *g = h_alloc((size_t)r * d), *tb;
    h_fill(g, d, seed, -3, 3);
    for (int i = 1; i < r; i++) memcpy(g + (size_t)i * d, g, (size_t)d * sizeof *g);
    struct op_comp_tail t = new_tail(&tb, r, d, 0);
    struct op_comp_out o;
    out_alloc(&o, &D.L, 1, 0);
    float *work = h_alloc(op_comp_work_floats(d, c.idx_dim));
    EXPECT(op_comp_push(&o, &t, work, v, g, 0, r, &D.L, NULL) == 1, "equal gates r=%d: one entry", r);

    double *vd = dalloc((size_t)r * d), *zero = dalloc((size_t)r * d), *gd = dalloc((size_t)r * d);
    double *mean = dalloc(d), *pool = dalloc(d), *b = dalloc(d);
    for (int i = 0; i < r * d; i++) vd[i] = v[i], gd[i] = g[i];
    for (int k = 0; k < d; k++) {
      for (int i = 0; i < r; i++) mean[k] += vd[i * d + k] / r;
    }
    ref_pool(pool, b, vd, zero, gd, zero, r, d);
    for (int k = 0; k < d; k++)
      EXPECT(fabs(pool[k] - mean[k]) <= 1e-15 * (1 + fabs(mean[k])), "reference pooling is not the mean");
    h_ref_rmsnorm(mean, b, mean, b, D.gamma, 1, d, EPS);
    h_within(o.c, mean, b, d, r == 2 ? "equal gates r=2: c" : "equal gates r=3: c");
    if (r == 2) {
      float *want = h_alloc(d);
      for (int k = 0; k < d; k++) want[k] = (v[k] + v[d + k]) * 0.5f;
      op_rmsnorm(want, want, D.gamma, 1, d, EPS);
      EXPECT(memcmp(o.c, want, (size_t)d * sizeof *want) == 0, "equal gates r=2: c != RMSNorm(fl(v0 + v1) / 2)");
      h_free(want, d, "want");
    }
    free(vd), free(zero), free(gd), free(mean), free(pool), free(b);
    h_free(work, op_comp_work_floats(d, c.idx_dim), "work");
    h_free(v, (size_t)r * d, "v");
    h_free(g, (size_t)r * d, "g");
    out_free(&o, &D.L);
    free_tail(tb, r, d);
    cdata_free(&D);
  }
}

/* SPEC 8.2.7-8.2.8 and 6.4: after n tokens from position 0 there are
 * floor(n/r) entries and a tail of n mod r; 1024 -> 1025 -> 1026. */
static void test_counts(uint64_t *seed) {
  const int NMAX = 1026;
  for (int r = 1; r <= 4; r++) {
    const struct ccfg c = {r, 8, 8, 4, 4, 2, 4, 4, false, false, false};
    struct cdata D;
    cdata_init(&D, &c, seed);
    float *u = rand_floats((size_t)NMAX * c.hidden, seed, -1, 1), *tb;
    size_t ns = op_comp_scratch_floats(NMAX, r, c.d, c.idx_dim);
    float *scratch = h_alloc(ns);
    struct op_comp_out o;
    out_alloc(&o, &D.L, NMAX, 0);
    static const int ns_list[] = {0, 1, 2, 3, 4, 5, 7, 9, 1023, 1024, 1025, 1026};
    for (size_t k = 0; k < sizeof ns_list / sizeof ns_list[0]; k++) {
      int n = ns_list[k];
      struct op_comp_tail t = new_tail(&tb, r, c.d, 0);
      int E = op_compress(&o, &t, scratch, u, 0, n, &D.L, NULL);
      EXPECT(E == n / r && t.count == n % r && t.pos0 == n - n % r,
             "r=%d n=%d: %d entries, tail (pos0 %lld, count %d); want %d, (%d, %d)", r, n, E, (long long)t.pos0,
             t.count, n / r, n - n % r, n % r);
      for (int j = 0; j < E; j++) EXPECT(o.pos[j] == (int64_t)r * j, "r=%d n=%d: entry %d position", r, n, j);
      free_tail(tb, r, c.d);
    }
    /* The table of SPEC 6.4: prefill 1024, then positions 1024 and 1025. */
    struct op_comp_tail t = new_tail(&tb, r, c.d, 0);
    int total = 0, sizes[3] = {1024, 1, 1}, done = 0;
    for (int step = 0; step < 3; step++) {
      int e = op_compress(&o, &t, scratch, u + (size_t)done * c.hidden, done, sizes[step], &D.L, NULL);
      done += sizes[step], total += e;
      if (r == 2) {
        static const int want_total[3] = {512, 512, 513}, want_tail[3] = {0, 1, 0};
        EXPECT(total == want_total[step] && t.count == want_tail[step], "SPEC 6.4 r=2 after %d: %d entries, tail %d",
               done, total, t.count);
        if (step == 1) EXPECT(t.pos0 == 1024, "SPEC 6.4: the pending token is position 1024");
        if (step == 2) EXPECT(e == 1 && o.pos[0] == 1024, "SPEC 6.4: entry 512 sits at position 1024");
      }
      if (r == 1) EXPECT(total == done && t.count == 0, "SPEC 6.4 r=1 after %d: %d entries", done, total);
    }
    free_tail(tb, r, c.d);
    out_free(&o, &D.L);
    h_free(scratch, ns, "scratch");
    h_free(u, (size_t)NMAX * c.hidden, "u");
    cdata_free(&D);
  }
}

/* Largest |got - ref| / bound over n elements. */
static double worst_ratio(const float *got, const double *ref, const double *b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)got[i] - ref[i]) / b[i]);
  return w;
}

/* SPEC 8.2.10: entry j is rotated at position r j, its group's first token:
 * kM_j = RoPE(c_j, r j) and kI_j = RoPE_I([k_norm] W_ik c_j, r j), computed
 * here in float64 from the op's own c_j (bound: W_ik's gamma(d) and RoPE's
 * 3u). RoPE at r j + 1 must not fit the bound, or the check proves nothing. */
static void test_rope_position(uint64_t *seed) {
  for (int r = 2; r <= 3; r++) {
    const struct ccfg c = {r, 16, 16, 8, 8, 4, 16, 8, true, true, false};
    struct cdata D;
    cdata_init(&D, &c, seed);
    const int N = 6 * r + 1, d = c.d, di = c.idx_dim;
    float *u = rand_floats((size_t)N * c.hidden, seed, -1, 1), *tb;
    size_t ns = op_comp_scratch_floats(N, r, d, di);
    float *scratch = h_alloc(ns);
    struct op_comp_tail t = new_tail(&tb, r, d, 0);
    struct op_comp_out o;
    out_alloc(&o, &D.L, N / r, 0);
    int E = op_compress(&o, &t, scratch, u, 0, N, &D.L, NULL);
    double *m = dalloc(d), *mb = dalloc(d), *zero = dalloc(d), *k = dalloc(di), *kb = dalloc(di);
    for (int j = 0; j < E; j++) {
      for (int shift = 0; shift <= 1; shift++) {
        int64_t p = (int64_t)r * j + shift;
        for (int i = 0; i < d; i++) m[i] = o.c[(size_t)j * d + i], mb[i] = 0;
        h_ref_linear(k, kb, D.W_ik, m, zero, 1, d, di);
        h_ref_rmsnorm(k, kb, k, kb, D.k_gamma, 1, di, EPS);
        h_ref_rope(k, kb, &D.rope_i, &p, 1, 1);
        h_ref_rope(m, mb, &D.rope, &p, 1, 1);
        double wm = worst_ratio(o.kM + (size_t)j * d, m, mb, d), wi = worst_ratio(o.kI + (size_t)j * di, k, kb, di);
        if (shift == 0)
          EXPECT(wm <= 1 && wi <= 1, "r=%d entry %d: not rotated at %lld (kM %.3g, kI %.3g x bound)", r, j,
                 (long long)p, wm, wi);
        else
          EXPECT(wm > 1 && wi > 1, "r=%d entry %d: rotation at %lld fits too (kM %.3g, kI %.3g x bound)", r, j,
                 (long long)p, wm, wi);
      }
    }
    free(m), free(mb), free(zero), free(k), free(kb);
    out_free(&o, &D.L);
    free_tail(tb, r, d);
    h_free(scratch, ns, "scratch");
    h_free(u, (size_t)N * c.hidden, "u");
    cdata_free(&D);
  }
}

/* SPEC 8.2.11: Indexer K comes from c before RoPE and quantization. Changing
 * only the Main-KV quantization (block 16 -> 32 -> 64, and where the part
 * sits in the entry) leaves kI's floats and bytes identical while the Main-KV
 * bytes change. And kI is not regenerated from the FP4 Main KV: kI computed
 * from the decoded, un-rotated Main KV misses the op's kI by more than the
 * op's own bound. (The nibble order is shared by both parts, SPEC 4.1, so it
 * is not a Main-KV-only change.) */
static void test_indexer_independent(uint64_t *seed) {
  const struct ccfg c = {2, 32, 64, 16, 32, 16, 16, 32, false, false, true};
  struct cdata D;
  cdata_init(&D, &c, seed);
  const int N = 11, E = N / 2, d = c.d, di = c.idx_dim;
  float *u = rand_floats((size_t)N * c.hidden, seed, -1, 1), *tb;
  size_t ns = op_comp_scratch_floats(N, 2, d, di);
  float *scratch = h_alloc(ns);
  struct op_comp_out o[3];
  static const int blocks[3] = {16, 32, 64};
  for (int k = 0; k < 3; k++) {
    struct op_comp_layer L = D.L;
    L.main_fmt.block = blocks[k];
    struct op_comp_tail t = new_tail(&tb, 2, d, 0);
    out_alloc(&o[k], &L, E, k == 1);
    EXPECT(op_compress(&o[k], &t, scratch, u, 0, N, &L, NULL) == E, "8.2.11 block %d: %d entries", blocks[k], E);
    free_tail(tb, 2, d);
    if (k == 0) continue;
    EXPECT(memcmp(o[k].kI, o[0].kI, (size_t)E * di * sizeof(float)) == 0, "8.2.11: kI floats changed with block %d",
           blocks[k]);
    bool main_differs = false;
    for (int e = 0; e < E; e++) {
      const uint8_t *a = o[0].entries + (size_t)e * o[0].entry_bytes, *b = o[k].entries + (size_t)e * o[k].entry_bytes;
      EXPECT(memcmp(a + o[0].idx_off, b + o[k].idx_off, op_mxfp4_bytes(di, c.idx_block)) == 0,
             "8.2.11: entry %d Indexer-K bytes changed with Main-KV block %d", e, blocks[k]);
      main_differs |= memcmp(a + o[0].main_off, b + o[k].main_off, (size_t)d / 2) != 0;
    }
    EXPECT(main_differs, "8.2.11: Main-KV block %d gave the same payload as 16: the change changed nothing",
           blocks[k]);
    out_free(&o[k], &L);
  }

  /* kI from the FP4 Main KV (decode, inverse RoPE, W_ik, RoPE_I) vs the op's. */
  float *deq = h_alloc(d);
  double *x = dalloc(d), *xb = dalloc(d), *k = dalloc(di), *kb = dalloc(di), worst = 0;
  for (int e = 0; e < E; e++) {
    int64_t p = 2 * e, minus = -p;
    op_fp4_unpack(deq, o[0].entries + (size_t)e * o[0].entry_bytes + o[0].main_off, d, c.main_block, D.L.main_fmt.nibble);
    for (int i = 0; i < d; i++) x[i] = deq[i], xb[i] = 0;
    h_ref_rope(x, xb, &D.rope, &minus, 1, 1);
    h_ref_linear(k, kb, D.W_ik, x, NULL, 1, d, di);
    h_ref_rope(k, kb, &D.rope_i, &p, 1, 1);
    /* the op's own bound for kI, from its own c */
    for (int i = 0; i < d; i++) x[i] = o[0].c[(size_t)e * d + i], xb[i] = 0;
    double *kr = dalloc(di), *krb = dalloc(di);
    h_ref_linear(kr, krb, D.W_ik, x, NULL, 1, d, di);
    h_ref_rope(kr, krb, &D.rope_i, &p, 1, 1);
    EXPECT(worst_ratio(o[0].kI + (size_t)e * di, kr, krb, di) <= 1, "8.2.11: entry %d kI is not W_ik c", e);
    worst = fmax(worst, worst_ratio(o[0].kI + (size_t)e * di, k, krb, di));
    free(kr), free(krb);
  }
  EXPECT(worst > 1, "8.2.11: kI matches the one regenerated from FP4 within %.3g x bound", worst);
  free(x), free(xb), free(k), free(kb);
  h_free(deq, d, "deq");
  out_free(&o[0], &D.L);
  h_free(scratch, ns, "scratch");
  h_free(u, (size_t)N * c.hidden, "u");
  cdata_free(&D);
}

/* SPEC 8.2.12, bitwise part: the same projected rows pushed in calls split
 * at any boundaries (odd ones, empty calls, one position at a time), from a
 * start that is not 0, with work buffers at different alignments, give the
 * same entry bytes, floats, positions and tail, bit for bit. run_split also
 * checks the tail after every call. */
static void test_split_bitwise(uint64_t *seed) {
  for (int r = 1; r <= 4; r++) {
    const struct ccfg c = {r, 24, 16, 8, 8, 4, 16, 8, true, true, r % 2 == 0};
    struct cdata D;
    cdata_init(&D, &c, seed);
    const int N = 37, d = c.d, E = N / r;
    const int64_t start = 5 * r;
    float *u = rand_floats((size_t)N * c.hidden, seed, -1, 1);
    float *v = h_alloc((size_t)N * d), *g = r > 1 ? h_alloc((size_t)N * d) : NULL;
    op_comp_project(v, g, u, N, &D.L);
    struct op_comp_out base = {0};
    struct op_comp_tail tbase = {0};
    float *tbb = NULL;
    for (int kind = 0; kind < 6; kind++) {
      char name[96];
      snprintf(name, sizeof name, "8.2.12 r=%d split %d", r, kind);
      int sz[4 * 64], ncall = make_sizes(sz, (int)(sizeof sz / sizeof sz[0]), N, kind < 4 ? kind : 2, r, seed);
      float *tb;
      struct op_comp_tail t = new_tail(&tb, r, d, start);
      struct op_comp_out o;
      out_alloc(&o, &D.L, E, 0);
      int got = run_split(&o, &t, &D, NULL, v, g, start, sz, ncall, kind % 4, name);
      EXPECT(got == E, "%s: %d entries, want %d", name, got, E);
      if (kind == 0) {
        base = o, tbase = t, tbb = tb;
        continue;
      }
      EXPECT(memcmp(o.entries, base.entries, (size_t)E * o.entry_bytes) == 0, "%s: entry bytes differ", name);
      EXPECT(memcmp(o.pos, base.pos, (size_t)E * sizeof *o.pos) == 0, "%s: positions differ", name);
      EXPECT(memcmp(o.c, base.c, (size_t)E * d * sizeof(float)) == 0 &&
                 memcmp(o.kM, base.kM, (size_t)E * d * sizeof(float)) == 0 &&
                 memcmp(o.kI, base.kI, (size_t)E * c.idx_dim * sizeof(float)) == 0,
             "%s: entry floats differ", name);
      EXPECT(t.count == tbase.count && t.pos0 == tbase.pos0, "%s: tail differs", name);
      if (r > 1)
        EXPECT(memcmp(t.v, tbase.v, (size_t)t.count * d * sizeof(float)) == 0 &&
                   memcmp(t.g, tbase.g, (size_t)t.count * d * sizeof(float)) == 0,
               "%s: tail rows differ", name);
      out_free(&o, &D.L);
      free_tail(tb, r, d);
    }
    check_bytes(&base, &D.L, E, "8.2.12 one-shot");
    out_free(&base, &D.L);
    free_tail(tbb, r, d);
    h_free(v, (size_t)N * d, "v");
    if (g) h_free(g, (size_t)N * d, "g");
    h_free(u, (size_t)N * c.hidden, "u");
    cdata_free(&D);
  }
}

/* SPEC 3.9 and the call contract: a half-filled group is never emitted (the
 * output has room for exactly the complete groups; its sentinels and pad
 * bytes must survive); a call that does not continue the tail, or whose
 * entries do not fit, returns -1 and changes nothing; a tail cannot start
 * mid-group. */
static void test_tail_rule(uint64_t *seed) {
  for (int r = 2; r <= 4; r += 2) {
    const struct ccfg c = {r, 12, 8, 4, 4, 2, 8, 4, false, false, false};
    struct cdata D;
    cdata_init(&D, &c, seed);
    const int d = c.d, N = 2 * r + r - 1; /* two groups and r - 1 pending tokens */
    float *u = rand_floats((size_t)N * c.hidden, seed, -1, 1), *tb;
    size_t ns = op_comp_scratch_floats(N, r, d, c.idx_dim);
    float *scratch = h_alloc(ns);
    struct op_comp_tail t = new_tail(&tb, r, d, 4 * r);
    struct op_comp_out o0, o2;
    out_alloc(&o0, &D.L, 0, 0);
    out_alloc(&o2, &D.L, 2, 0);
    EXPECT(op_compress(&o0, &t, scratch, u, 4 * r, r - 1, &D.L, NULL) == 0 && t.count == r - 1,
           "r=%d: %d tokens must stay pending", r, r - 1);
    struct op_comp_tail saved = t;
    float *rows = h_alloc(op_comp_tail_floats(r, d));
    memcpy(rows, tb, op_comp_tail_floats(r, d) * sizeof *rows);
    /* one more token completes a group: no room, wrong positions, NULL out */
    EXPECT(op_compress(&o0, &t, scratch, u, 4 * r + r - 1, 1, &D.L, NULL) == -1, "r=%d: no room must fail", r);
    EXPECT(op_compress(NULL, &t, scratch, u, 4 * r + r - 1, 1, &D.L, NULL) == -1, "r=%d: NULL out must fail", r);
    EXPECT(op_compress(&o2, &t, scratch, u, 4 * r + r, 1, &D.L, NULL) == -1, "r=%d: a gap must fail", r);
    EXPECT(op_compress(&o2, &t, scratch, u, 4 * r + r - 2, 1, &D.L, NULL) == -1, "r=%d: an overlap must fail", r);
    EXPECT(memcmp(&saved, &t, sizeof t) == 0 && memcmp(rows, tb, op_comp_tail_floats(r, d) * sizeof *rows) == 0,
           "r=%d: a failed call changed the tail", r);
    EXPECT(op_compress(NULL, &t, scratch, u, 4 * r + r - 1, 0, &D.L, NULL) == 0, "r=%d: an empty call emits nothing", r);
    /* the rest: 2 r more tokens complete exactly two groups, r - 1 stay */
    int E = op_compress(&o2, &t, scratch, u, 4 * r + r - 1, 2 * r, &D.L, NULL);
    EXPECT(E == 2 && t.count == r - 1 && t.pos0 == 6 * r && o2.pos[0] == 4 * r && o2.pos[1] == 5 * r,
           "r=%d: %d entries, tail (pos0 %lld, count %d)", r, E, (long long)t.pos0, t.count);
    check_bytes(&o2, &D.L, 2, "tail rule");
    h_free(rows, op_comp_tail_floats(r, d), "rows");
    out_free(&o0, &D.L);
    out_free(&o2, &D.L);
    free_tail(tb, r, d);
    h_free(scratch, ns, "scratch");
    h_free(u, (size_t)N * c.hidden, "u");
    cdata_free(&D);
  }
  struct op_comp_tail t;
  float buf[8];
  EXPECT(op_comp_tail_init(&t, buf, 2, 4, 3) == -1, "a ratio-2 tail cannot start at an odd position");
  EXPECT(op_comp_tail_init(&t, buf, 2, 4, -2) == -1, "a tail cannot start before 0");
  EXPECT(op_comp_tail_init(&t, buf, 2, 4, 6) == 0 && t.count == 0 && t.pos0 == 6, "tail init at 6");
}

/* One slot's gate far above the others' in every channel (200 apart, or the
 * others at -inf): their weights exp(g - m) underflow to exactly 0 and the
 * max slot's is exp(0) = 1, so c_hat is that slot's v exactly and c is
 * op_rmsnorm of it, bit for bit. The max sits in the first or the last slot
 * by channel (at ratio 2 the pooling calls expf only off the max slot:
 * compressor.c). */
static void test_far_gates(uint64_t *seed) {
  for (int r = 2; r <= 3; r++) {
    const struct ccfg c = {r, 8, 24, 8, 8, 4, 8, 8, false, false, false};
    struct cdata D;
    cdata_init(&D, &c, seed);
    const int d = c.d;
    float *v = rand_floats((size_t)r * d, seed, -1, 1), *g = h_alloc((size_t)r * d), *want = h_alloc(d), *tb;
    for (int k = 0; k < d; k++) {
      const int top = k % 2 ? r - 1 : 0;
      const float gt = (float)(k % 7) - 3.0f;
      for (int i = 0; i < r; i++) g[(size_t)i * d + k] = i == top ? gt : k % 3 ? gt - 200.0f : -INFINITY;
      want[k] = v[(size_t)top * d + k];
    }
    op_rmsnorm(want, want, D.gamma, 1, d, EPS);
    struct op_comp_tail t = new_tail(&tb, r, d, 0);
    struct op_comp_out o;
    out_alloc(&o, &D.L, 1, 0);
    float *work = h_alloc(op_comp_work_floats(d, c.idx_dim));
    EXPECT(op_comp_push(&o, &t, work, v, g, 0, r, &D.L, NULL) == 1, "far gates r=%d: one entry", r);
    EXPECT(memcmp(o.c, want, (size_t)d * sizeof *want) == 0, "far gates r=%d: c != RMSNorm(v of the max slot)", r);
    /* A +inf gate: inf - inf is NaN, so that channel's weights are NaN and
     * the norm spreads it over the whole row. */
    g[(size_t)(r - 1) * d + 2] = INFINITY;
    EXPECT(op_comp_push(&o, &t, work, v, g, r, r, &D.L, NULL) == 1, "far gates r=%d, +inf: one entry", r);
    for (int k = 0; k < d; k++) EXPECT(isnan(o.c[k]), "far gates r=%d, a +inf gate: c[%d] = %g, want NaN", r, k, o.c[k]);
    h_free(work, op_comp_work_floats(d, c.idx_dim), "work");
    h_free(v, (size_t)r * d, "v"), h_free(g, (size_t)r * d, "g"), h_free(want, d, "want");
    out_free(&o, &D.L);
    free_tail(tb, r, d);
    cdata_free(&D);
  }
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0x243f6a8885a308d3ull;
  static const struct {
    struct ccfg c;
    int N;
    int64_t start;
  } cases[] = {
      /* ratio hidden d rope idx irope mblock iblock k_norm k_gamma yarn */
      {{1, 16, 16, 4, 8, 4, 16, 8, false, false, false}, 9, 0},
      {{2, 33, 32, 8, 16, 8, 16, 16, true, true, true}, 13, 0},
      {{3, 20, 48, 16, 12, 4, 16, 6, true, false, false}, 17, 3 * 7},
      {{4, 64, 64, 16, 32, 16, 16, 32, false, false, false}, 19, 4 * (1 << 18)},
      {{1, 96, 40, 8, 24, 8, 8, 8, true, true, true}, 6, 1000},
      {{2, 512, 512, 64, 128, 64, 16, 32, false, false, true}, 9, 0}, /* SPEC widths of d and idx */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    test_reference(&cases[i].c, cases[i].N, cases[i].start, &seed);
  test_ratio1(&seed);
  test_equal_gates(&seed);
  test_far_gates(&seed);
  test_counts(&seed);
  test_rope_position(&seed);
  test_indexer_independent(&seed);
  test_split_bitwise(&seed);
  test_tail_rule(&seed);
  return h_report("ops_compressor");
}

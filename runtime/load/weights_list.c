/* weights_list.c: the tensor list of docs/weights.md for a plan (names,
 * dtypes, shapes, how each is filled), its fingerprint and lookup by name
 * (weights.h). The values, a rank's part, the checks and save/load are
 * weights.c's.
 *
 * Synthetic scales [cedar]. Aim: unit-RMS activations everywhere, so the
 * forward's per-layer RMS checks can use fixed bounds.
 *  - Linear (out, in): uniform (-a, a) with a = sqrt(3 / in), so Var(w) =
 *    1/in and an input of mean square 1 gives outputs of variance 1. Every
 *    projection reads a normalized vector (RMSNorm, mHC's rsqrt) or one
 *    built from them, so this keeps each intermediate at RMS ~1.
 *  - Residual-branch outputs (attn.wo_b, ffn.experts.w_down,
 *    ffn.shared.w_down, engram.wkv): the same times WEIGHTS_RESIDUAL_GAIN =
 *    1/8. Each sublayer adds post * F (post ~1) to the streams; at unit gain
 *    40 layers would grow the streams' mean square to ~1 + 80 (RMS ~9). GPT-2
 *    scales these by 1/sqrt(2 L); cedar uses a constant (1/8 ~ 1/sqrt(2 *
 *    32)) so that layer l's tensors do not depend on n_layers. The mean
 *    square after layer l is then <= 1 + (2 (l + 1) + engram layers) / 64
 *    (RMS <= 1.5 at 40 layers), given Var(F) <= 1 before the gain.
 *    engram.wkv's keys pass through RMSNorm, so the gain only scales its
 *    value.
 *  - embed: uniform (-sqrt 3, sqrt 3): unit-RMS rows, so X^(0) is on the
 *    same scale as every later state.
 *  - lm_head: sqrt(3 / d): logits of variance ~1, a softmax neither flat nor
 *    one-hot.
 *  - RMSNorm weights and Engram q_w, k_w: 1 + uniform (-0.02, 0.02): near
 *    the identity, yet no two tensors are equal (a swap is detectable).
 *  - attn.sink: 0 (weighs like one more key with score 0); mHC scale: 1.
 *  - ffn.gate (router): half the linear scale: logits of std 0.5, so the
 *    selection depends on the token while the chosen experts' weights stay
 *    within ~2x of each other. ffn.bias: (-0.01, 0.01), used, rarely
 *    decisive.
 *  - mHC fn: a = 0.1 sqrt(3 / (hc d)): the mixes (fn . xf times rsqrt of
 *    xf's mean square) have std 0.1 at any width; a fixed +-0.02 would give
 *    0.37 at mini and 1.65 at flash widths. base (plus +-0.01 noise): pre
 *    logits ln(1/(hc-1)), so pre = 1/hc and u is the streams' mean; post
 *    logits 0, so post = 1; C logits ln(9 (hc-1)) on the diagonal and 0 off
 *    it, so the row softmax (already doubly stochastic) keeps 0.9 of each
 *    stream. head.hc.base: the pre logits (h_out = the streams' mean).
 *    With one stream, pre = 0.95.
 *  - Engram rows: uniform (-sqrt 3, sqrt 3) (unit RMS) packed E4M3 with an
 *    E8M0 scale per 32 (op_fp8_pack), so every row decodes to finite values.
 * Expected RMS once the forward runs: RMSNorm outputs ~1; attention and MoE
 * outputs F <= ~1 before the residual gain (attention averages unit-RMS
 * latents; a SwiGLU of unit-variance pre-activations has mean square ~0.36);
 * the residual state X after layer l between ~1 and the bound above.
 */
#include "runtime/load/weights.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/sample.h"
#include "runtime/load/shards.h"
#include "base/check.h"

#define NORM_NOISE 0.02f
#define BASE_NOISE 0.01f
#define BIAS_AMP 0.01f
#define ROUTER_GAIN 0.5f
#define MHC_MIX_STD 0.1f
#define SQRT3 1.7320508f

/* ---- the tensor list ---------------------------------------------------- */

struct fill {
  enum weights_init init;
  float a;
};

static struct fill lin(int64_t in, float gain) { return (struct fill){WEIGHTS_UNIFORM, gain * sqrtf(3.0f / (float)in)}; }
static struct fill ones(void) { return (struct fill){WEIGHTS_ONES, NORM_NOISE}; }
static struct fill constant(float v) { return (struct fill){WEIGHTS_CONST, v}; }

struct builder {
  struct weights_list *l;
  const struct plan *p;
  size_t cap;
  int layer; /* -1 while adding model-wide tensors */
  int mtp;   /* >= 0 while adding drafter block mtp.{k}'s tensors (layer -1) */
  int status;
  char *err;
  size_t err_len;
};

static uint64_t mul_sat(uint64_t a, uint64_t b) { return a && b > UINT64_MAX / a ? UINT64_MAX : a * b; }

/* Append one tensor; dims past ndim are ignored. nbytes saturates (a plan
 * whose tensor overflows 64 bits is refused in weights_list_init). */
static struct weights_spec *add(struct builder *b, const char *name, enum st_dtype dt, struct fill f, int ndim,
                                int64_t d0, int64_t d1, int64_t d2) {
  if (b->status) return NULL;
  struct weights_list *l = b->l;
  if (l->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 256;
    struct weights_spec *t = realloc(l->t, cap * sizeof *t);
    if (!t) {
      b->status = CEDAR_ENOMEM;
      snprintf(b->err, b->err_len, "out of memory listing weights");
      return NULL;
    }
    l->t = t, b->cap = cap;
  }
  struct weights_spec *s = &l->t[l->n++];
  *s = (struct weights_spec){.dtype = dt, .ndim = ndim, .layer = b->layer, .init = f.init, .a = f.a,
                             .shape = {d0, d1, d2}};
  if (b->layer >= 0) snprintf(s->name, sizeof s->name, "layers.%d.%s", b->layer, name);
  else if (b->mtp >= 0) snprintf(s->name, sizeof s->name, "mtp.%d.%s", b->mtp, name);
  else snprintf(s->name, sizeof s->name, "%s", name);
  uint64_t n = st_dtype_size(dt);
  for (int i = 0; i < ndim; i++) n = mul_sat(n, (uint64_t)s->shape[i]);
  s->nbytes = n;
  return s;
}

static void add_mhc(struct builder *b, const char *prefix, int rows, bool head) {
  const struct plan_model *m = &b->p->model;
  int hc = m->hc_streams;
  int64_t width = (int64_t)hc * m->hidden;
  char name[WEIGHTS_NAME_MAX];
  snprintf(name, sizeof name, "%s.fn", prefix);
  add(b, name, ST_F32, lin(width, MHC_MIX_STD), 2, rows, width, 0);
  snprintf(name, sizeof name, "%s.scale", prefix);
  add(b, name, ST_F32, constant(1.0f), 1, head ? 1 : 3, 0, 0);
  snprintf(name, sizeof name, "%s.base", prefix);
  struct weights_spec *s = add(b, name, ST_F32, (struct fill){WEIGHTS_MHC_BASE, BASE_NOISE}, 1, rows, 0, 0);
  if (s) s->hc = hc;
}

static void add_model_wide(struct builder *b) {
  const struct plan_model *m = &b->p->model;
  b->layer = -1;
  add(b, "embed", ST_F32, (struct fill){WEIGHTS_UNIFORM, SQRT3}, 2, m->vocab, m->hidden, 0);
  add(b, "norm", ST_F32, ones(), 1, m->hidden, 0, 0);
  add(b, "lm_head", ST_F32, lin(m->hidden, 1.0f), 2, m->vocab, m->hidden, 0);
  /* head.hc.* exist only with `merge: learned` (pairing v4): V4.1 collapses
   * with the last FFN's carried pre (`merge: carried`), and `sum` reads none. */
  if (m->hc_merge == PLAN_MERGE_LEARNED) add_mhc(b, "head.hc", m->hc_streams, true);
}

/* The tensors every layer has (docs/weights.md, "Every layer"); the
 * drafter's blocks have them too, with their own routed expert count. */
static void add_common(struct builder *b, int n_routed) {
  const struct plan_model *m = &b->p->model;
  int d = m->hidden, hdh = m->heads * m->head_dim, G = m->o_groups;
  int mrows = (2 + m->hc_streams) * m->hc_streams;
  int64_t S = (int64_t)m->n_shared * m->shared_inter;
  add(b, "attn_norm", ST_F32, ones(), 1, d, 0, 0);
  add(b, "ffn_norm", ST_F32, ones(), 1, d, 0, 0);
  add_mhc(b, "hc_attn", mrows, false);
  add_mhc(b, "hc_ffn", mrows, false);
  add(b, "attn.wq_a", ST_F32, lin(d, 1), 2, m->q_rank, d, 0);
  add(b, "attn.q_norm", ST_F32, ones(), 1, m->q_rank, 0, 0);
  add(b, "attn.wq_b", ST_F32, lin(m->q_rank, 1), 2, hdh, m->q_rank, 0);
  add(b, "attn.wkv", ST_F32, lin(d, 1), 2, m->head_dim, d, 0);
  add(b, "attn.kv_norm", ST_F32, ones(), 1, m->head_dim, 0, 0);
  /* docs/weights.md lists the sink unconditionally; a plan with `sink:
   * false` has no sink logits, so no tensor. */
  if (m->sink) add(b, "attn.sink", ST_F32, constant(0.0f), 1, m->heads, 0, 0);
  add(b, "attn.wo_a", ST_F32, lin(hdh / G, 1), 3, G, m->o_rank, hdh / G);
  add(b, "attn.wo_b", ST_F32, lin((int64_t)G * m->o_rank, WEIGHTS_RESIDUAL_GAIN), 2, d, (int64_t)G * m->o_rank, 0);
  add(b, "ffn.gate", ST_F32, lin(d, ROUTER_GAIN), 2, n_routed, d, 0);
  add(b, "ffn.bias", ST_F32, (struct fill){WEIGHTS_UNIFORM, BIAS_AMP}, 2, 2, n_routed, 0);
  add(b, "ffn.experts.w_gate", ST_F32, lin(d, 1), 3, n_routed, m->moe_inter, d);
  add(b, "ffn.experts.w_up", ST_F32, lin(d, 1), 3, n_routed, m->moe_inter, d);
  add(b, "ffn.experts.w_down", ST_F32, lin(m->moe_inter, WEIGHTS_RESIDUAL_GAIN), 3, n_routed, d, m->moe_inter);
  if (S > 0) {
    add(b, "ffn.shared.w_gate", ST_F32, lin(d, 1), 2, S, d, 0);
    add(b, "ffn.shared.w_up", ST_F32, lin(d, 1), 2, S, d, 0);
    add(b, "ffn.shared.w_down", ST_F32, lin(S, WEIGHTS_RESIDUAL_GAIN), 2, d, S, 0);
  }
}

static void add_index_source(struct builder *b) {
  const struct plan_model *m = &b->p->model;
  add(b, "attn.indexer.wq_b", ST_F32, lin(m->q_rank, 1), 2, (int64_t)m->idx_heads * m->idx_head_dim, m->q_rank, 0);
  add(b, "attn.indexer.weights_proj", ST_F32, lin(m->hidden, 1), 2, m->idx_heads, m->hidden, 0);
}

static void add_kv_source(struct builder *b, const struct plan_layer *L) {
  const struct plan_model *m = &b->p->model;
  int d = m->hidden, dh = m->head_dim;
  add(b, "attn.compressor.wkv", ST_F32, lin(d, 1), 2, dh, d, 0);
  if (L->ratio > 1) add(b, "attn.compressor.wgate", ST_F32, lin(d, 1), 2, dh, d, 0);
  add(b, "attn.compressor.norm", ST_F32, ones(), 1, dh, 0, 0);
  add(b, "attn.indexer.wk", ST_F32, lin(dh, 1), 2, m->idx_head_dim, dh, 0);
  if (m->idx_k_norm) add(b, "attn.indexer.k_norm", ST_F32, ones(), 1, m->idx_head_dim, 0, 0);
}

static void add_engram(struct builder *b, int64_t rows) {
  const struct plan_model *m = &b->p->model;
  int hd = m->engram_head_dim, hc = m->hc_streams;
  int64_t de = (int64_t)m->engram_n_orders * m->engram_heads * hd;
  int64_t rb = (int64_t)op_engram_row_bytes(hd, WEIGHTS_ENGRAM_BLOCK);
  struct weights_spec *t = add(b, "engram.table", ST_U8, (struct fill){WEIGHTS_ENGRAM_ROWS, SQRT3}, 2, rows, rb, 0);
  if (t) t->row_values = hd, b->l->engram_bytes += t->nbytes;
  add(b, "engram.wkv", ST_F32, lin(de, WEIGHTS_RESIDUAL_GAIN), 2, (int64_t)(hc + 1) * m->hidden, de, 0);
  add(b, "engram.q_w", ST_F32, ones(), 2, hc, m->hidden, 0);
  add(b, "engram.k_w", ST_F32, ones(), 2, hc, m->hidden, 0);
}

/* The DSpark drafter (Appendix V #24; runtime/model/mtp.h): dspark.blocks
 * window-only blocks mtp.{k} (every layer's tensors, dspark.routed_experts
 * routed experts), main_proj (hidden, targets x hidden) and main_norm on
 * mtp.0; the final norm, the Markov head (V, markov_rank) twice and the
 * confidence head (1, hidden + markov_rank) on the last block. Scales as
 * above: the Markov embedding unit-RMS like embed, the head and the
 * confidence projection linear. */
static void add_drafter(struct builder *b) {
  const struct plan_model *m = &b->p->model;
  int d = m->hidden, V = m->vocab, rank = m->dspark_markov_rank, last = m->dspark_blocks - 1;
  b->layer = -1;
  for (int k = 0; k < m->dspark_blocks; k++) {
    b->mtp = k;
    add_common(b, m->dspark_experts);
    if (k == 0) {
      int64_t in = (int64_t)m->dspark_n_targets * d;
      add(b, "main_proj", ST_F32, lin(in, 1), 2, d, in, 0);
      add(b, "main_norm", ST_F32, ones(), 1, d, 0, 0);
    }
    if (k == last) {
      add(b, "norm", ST_F32, ones(), 1, d, 0, 0);
      add(b, "markov_head.embed", ST_F32, (struct fill){WEIGHTS_UNIFORM, SQRT3}, 2, V, rank, 0);
      add(b, "markov_head.head", ST_F32, lin(rank, 1), 2, V, rank, 0);
      add(b, "confidence_head.proj", ST_F32, lin((int64_t)d + rank, 1), 2, 1, (int64_t)d + rank, 0);
    }
  }
  b->mtp = -1;
}

/* The Engram modules' table rows, or a refusal for widths the rows cannot take. */
static int engram_rows(const struct plan *p, struct op_engram_tables *et, char *err, size_t err_len) {
  int n_mod = 0;
  for (int l = 0; l < p->n_layers; l++) n_mod += p->layer[l].engram;
  memset(et, 0, sizeof *et);
  if (!n_mod) return CEDAR_OK;
  const struct plan_model *m = &p->model;
  if (op_engram_row_bytes(m->engram_head_dim, WEIGHTS_ENGRAM_BLOCK) == 0) {
    snprintf(err, err_len,
             "plan '%s': model.engram.head_dim = %d is not a multiple of %d; Engram rows carry one E8M0 scale per "
             "%d values (docs/weights.md)", p->name, m->engram_head_dim, WEIGHTS_ENGRAM_BLOCK, WEIGHTS_ENGRAM_BLOCK);
    return CEDAR_EINVAL;
  }
  if (op_engram_tables_init(et, n_mod, m->engram_n_orders, m->engram_heads, m->engram_table_base)) {
    snprintf(err, err_len, "plan '%s': the Engram tables of %d modules x %d orders x %d heads from table_base %" PRId64
             " do not fit 64-bit row counts", p->name, n_mod, m->engram_n_orders, m->engram_heads,
             m->engram_table_base);
    return CEDAR_EINVAL;
  }
  return CEDAR_OK;
}

/* ---- fingerprint -------------------------------------------------------- */

static void fp_printf(XXH3_state_t *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fp_printf(XXH3_state_t *st, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  CEDAR_ASSERT(n >= 0 && (size_t)n < sizeof line);
  XXH3_64bits_update(st, line, (size_t)n);
}

/* See weights.h for what is in the fingerprint and why. */
static uint64_t fingerprint(const struct weights_list *l, const struct plan *p) {
  const struct plan_model *m = &p->model;
  XXH3_state_t *st = XXH3_createState();
  CEDAR_ASSERT(st);
  XXH3_64bits_reset(st);
  fp_printf(st, "cedar-weights 1\n");
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[i];
    fp_printf(st, "%s %s", s->name, st_dtype_name(s->dtype));
    for (int k = 0; k < s->ndim; k++) fp_printf(st, "%c%" PRId64, k ? ',' : ' ', s->shape[k]);
    fp_printf(st, "\n");
  }
  fp_printf(st, "rope_dim %d\nindexer.rope_dim %d %s\n", m->rope_dim, m->idx_rope_dim,
            m->idx_rope_last ? "last" : "first");
  for (int i = 0; i < p->n_layers; i++)
    if (plan_is_kv_source(&p->layer[i])) fp_printf(st, "ratio %d %d\n", i, p->layer[i].ratio);
  if (l->engram_bytes) {
    fp_printf(st, "engram orders");
    for (int k = 0; k < m->engram_n_orders; k++) fp_printf(st, " %d", m->engram_orders[k]);
    fp_printf(st, "\nengram seed %" PRIu64 " cvocab %d pad %d base %" PRId64 " rows e4m3 e8m0/%d\n", m->engram_seed,
              m->engram_compressed_vocab, m->engram_pad_id, m->engram_table_base, WEIGHTS_ENGRAM_BLOCK);
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

void weights_fingerprint_hex(uint64_t fp, char out[17]) { snprintf(out, 17, "%016" PRIx64, fp); }

/* ---- list lifetime and lookup ------------------------------------------- */

static int by_name_cmp(const void *a, const void *b) {
  return strcmp((*(const struct weights_spec *const *)a)->name, (*(const struct weights_spec *const *)b)->name);
}

/* by_name (sorted through a temporary array of pointers: qsort has no
 * context argument), the duplicate guard and the total. */
static int index_names(struct weights_list *l, char *err, size_t err_len) {
  const struct weights_spec **ptr = malloc((l->n ? l->n : 1) * sizeof *ptr);
  l->by_name = malloc((l->n ? l->n : 1) * sizeof *l->by_name);
  if (!ptr || !l->by_name) {
    free(ptr);
    return snprintf(err, err_len, "out of memory listing weights"), CEDAR_ENOMEM;
  }
  for (size_t i = 0; i < l->n; i++) ptr[i] = &l->t[i];
  qsort(ptr, l->n, sizeof *ptr, by_name_cmp);
  for (size_t i = 0; i < l->n; i++) l->by_name[i] = (size_t)(ptr[i] - l->t);
  free(ptr);
  for (size_t i = 0; i < l->n; i++) {
    const struct weights_spec *s = &l->t[l->by_name[i]];
    CEDAR_ASSERT_MSG(i == 0 || strcmp(l->t[l->by_name[i - 1]].name, s->name), "duplicate weight %s", s->name);
    if (s->nbytes == UINT64_MAX || l->total_bytes > UINT64_MAX - s->nbytes)
      return snprintf(err, err_len, "plan '%s': tensor %s is larger than 2^64 bytes", l->plan_name, s->name),
             CEDAR_EINVAL;
    l->total_bytes += s->nbytes;
  }
  return CEDAR_OK;
}

int weights_list_init(struct weights_list *l, const struct plan *p, char *err, size_t err_len) {
  memset(l, 0, sizeof *l);
  struct op_engram_tables et;
  int rc = engram_rows(p, &et, err, err_len);
  if (rc) return rc;
  l->plan_name = cedar_xstrdup(p->name ? p->name : "");
  struct builder b = {.l = l, .p = p, .mtp = -1, .err = err, .err_len = err_len};
  add_model_wide(&b);
  for (int i = 0, module = 0; i < p->n_layers; i++) {
    const struct plan_layer *L = &p->layer[i];
    b.layer = i;
    if (L->engram) add_engram(&b, et.rows[module++]);
    add_common(&b, p->model.n_routed);
    if (plan_is_index_source(L)) add_index_source(&b);
    if (plan_is_kv_source(L)) add_kv_source(&b, L);
  }
  if (p->model.dspark_blocks > 0) add_drafter(&b);
  op_engram_tables_free(&et);
  rc = b.status ? b.status : index_names(l, err, err_len);
  if (rc) {
    weights_list_free(l);
    return rc;
  }
  l->fingerprint = fingerprint(l, p);
  return CEDAR_OK;
}

void weights_list_free(struct weights_list *l) {
  free(l->t);
  free(l->by_name);
  free(l->plan_name);
  memset(l, 0, sizeof *l);
}

static size_t find_index(const struct weights_list *l, const char *name) {
  size_t lo = 0, hi = l->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(l->t[l->by_name[mid]].name, name);
    if (!c) return l->by_name[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return SIZE_MAX;
}

const struct weights_spec *weights_list_find(const struct weights_list *l, const char *name) {
  size_t i = find_index(l, name);
  return i == SIZE_MAX ? NULL : &l->t[i];
}

/* attention.c: sparse attention with joint softmax and sink, inverse RoPE,
 * grouped output projection (see attention.h for the math and the API).
 *
 * What it is: plain loops, the numerical spec a CUDA twin (FlashMLA-style:
 * gather, online softmax, fused sink, inverse RoPE) is compared against.
 * Accumulation is fp32 throughout; a twin that rounds P to bf16 before P@V
 * (R.2) is compared under a tolerance that says so.
 *
 * What it is not: fast. Queries are independent (each reads its own entries
 * once); parallelism comes from the task graph.
 *
 * Test: ctest --test-dir build -R ops_attention --output-on-failure
 */
#include "ops/attention.h"

#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "runtime/check.h"

/* Where the entries come from: packed views, or float rows (gf/sf set). */
struct entry_src {
  const struct op_kv_view *kv;
  const float *gf;
  int64_t n_global;
  const struct op_swa_view *swa;
  const float *sf;
  const int64_t *spos;
  int slots;
};

/* Per-query running state of the online softmax, one set per head. */
struct online {
  const float *q; /* (heads, d) this query's rows */
  float *acc;     /* (heads, d) running numerator: the output row itself */
  float *m, *l;   /* (heads) running max and running sum */
  int heads, d;
  float tau;
};

static const float *swa_entry(const struct entry_src *src, int slot, int d, float *buf /* (d) */) {
  if (src->sf) return src->sf + (size_t)slot * d;
  const struct op_swa_view *v = src->swa;
  op_fp8_unpack(buf, v->slots + (size_t)slot * v->entry_bytes, v->w, v->block, v->scale);
  return buf;
}

static const float *global_entry(const struct entry_src *src, int64_t e, int d, float *buf /* (d) */) {
  if (src->gf) return src->gf + (size_t)e * d;
  const struct op_kv_view *v = src->kv;
  op_fp4_unpack(buf, op_kv_entry(v, e) + v->main_off, v->main_w, v->main_block, v->nibble);
  return buf;
}

/* Start every head with the sink as the only term: m = sigma, l = exp(0) = 1,
 * acc = 0. Without a sink, m = -inf and l = 0; the first entry's rescale
 * factor exp(-inf) = 0 clears l. (A sink of -inf behaves as no sink the same
 * way.) */
static void online_init(struct online *st, const float *sink) {
  for (int h = 0; h < st->heads; h++) {
    st->m[h] = sink ? sink[h] : -INFINITY;
    st->l[h] = sink ? 1.0f : 0.0f;
  }
  memset(st->acc, 0, (size_t)st->heads * st->d * sizeof *st->acc);
}

/* One entry k, all heads: its logit per head, rescale when the max grows,
 * then add exp(z - m) to the running sum and exp(z - m) k to the numerator.
 * A NaN logit fails the max test and poisons l and acc through exp(NaN). */
static void online_add(struct online *st, const float *k /* (d) */) {
  const int d = st->d;
  for (int h = 0; h < st->heads; h++) {
    const float *qh = st->q + (size_t)h * d;
    float *acc = st->acc + (size_t)h * d;
    float dot = 0.0f;
    for (int i = 0; i < d; i++) dot += qh[i] * k[i];
    float z = st->tau * dot;
    if (z > st->m[h]) {
      float c = expf(st->m[h] - z);
      st->l[h] *= c;
      for (int i = 0; i < d; i++) acc[i] *= c;
      st->m[h] = z;
    }
    float w = expf(z - st->m[h]);
    st->l[h] += w;
    for (int i = 0; i < d; i++) acc[i] += w * k[i];
  }
}

/* o_h = acc / l. l == 0 only when there was neither a sink nor an entry:
 * then acc is 0 and o = 0 (R.2). A NaN l divides through and stays NaN. */
static void online_finish(struct online *st) {
  for (int h = 0; h < st->heads; h++) {
    float *acc = st->acc + (size_t)h * st->d;
    if (st->l[h] == 0.0f) {
      memset(acc, 0, (size_t)st->d * sizeof *acc);
      continue;
    }
    for (int i = 0; i < st->d; i++) acc[i] /= st->l[h];
  }
}

/* Visit query p's entries: visible ring slots (decided on the stored
 * position), then the valid Top-K indices. Returns the number visited. */
static int32_t attend_query(struct online *st, const struct entry_src *src, const int32_t *idx /* (topk) or NULL */,
                            int64_t p, const struct op_attn_params *pr, float *buf /* (d) */) {
  int32_t used = 0;
  const int64_t lo = p - pr->window + 1 > pr->r0 ? p - pr->window + 1 : pr->r0;
  for (int s = 0; pr->window > 0 && s < src->slots; s++) {
    const int64_t ps = src->spos[s];
    if (ps < 0 || ps < lo || ps > p) continue; /* empty, too old, before r0, or future */
    online_add(st, swa_entry(src, s, st->d, buf));
    used++;
  }
  for (int t = 0; idx && t < pr->topk; t++) {
    if (idx[t] < 0 || idx[t] >= src->n_global) continue; /* -1 = none; uncommitted */
    online_add(st, global_entry(src, idx[t], st->d, buf));
    used++;
  }
  return used;
}

static void attend(float *o /* (S, heads, head_dim) */, int32_t *n_used /* (S) or NULL */,
                   const float *q /* (S, heads, head_dim) */, const int64_t *pos /* (S) */,
                   const int32_t *topk_idx /* (S, topk) or NULL */, const struct entry_src *src, int S,
                   const struct op_attn_params *pr) {
  const int H = pr->heads, d = pr->head_dim;
  CEDAR_ASSERT(S >= 0 && H > 0 && d > 0 && pr->topk >= 0);
  CEDAR_ASSERT(!pr->rope || pr->rope->dim == d);
  float *scratch = cedar_xmalloc((2 * (size_t)H + (size_t)d) * sizeof *scratch);
  struct online st = {.m = scratch, .l = scratch + H, .heads = H, .d = d, .tau = pr->tau};
  for (int i = 0; i < S; i++) {
    st.q = q + (size_t)i * H * d;
    st.acc = o + (size_t)i * H * d;
    online_init(&st, pr->sink);
    int32_t used = attend_query(&st, src, topk_idx ? topk_idx + (size_t)i * pr->topk : NULL, pos[i], pr,
                                scratch + 2 * H);
    online_finish(&st);
    if (n_used) n_used[i] = used;
  }
  free(scratch);
  /* SPEC 3.12: o_h[rope dims] = RoPE(o_h, -p), all heads of row i at pos[i]. */
  if (pr->rope && S > 0) op_rope_apply(o, pr->rope, pos, S, H, H * d, -1);
}

void op_sparse_attn(float *o, int32_t *n_used, const float *q, const int64_t *pos, const int32_t *topk_idx,
                    const struct op_kv_view *kv, const struct op_swa_view *swa, int S,
                    const struct op_attn_params *pr) {
  struct entry_src src = {.kv = kv, .swa = swa};
  if (topk_idx && pr->topk > 0) {
    CEDAR_ASSERT_MSG(kv && kv->main_w == pr->head_dim, "attention: Top-K given but the global view is %s",
                     kv ? "not head_dim wide" : "NULL");
    src.n_global = kv->n_entries;
  }
  if (swa) {
    CEDAR_ASSERT_MSG(swa->w == pr->head_dim, "attention: SWA entry width %d != head_dim %d", swa->w, pr->head_dim);
    src.spos = swa->pos;
    src.slots = swa->n_slots;
  }
  attend(o, n_used, q, pos, topk_idx, &src, S, pr);
}

void op_sparse_attn_f32(float *o, int32_t *n_used, const float *q, const int64_t *pos, const int32_t *topk_idx,
                        const float *gkv, int64_t n_global, const float *skv, const int64_t *spos, int slots, int S,
                        const struct op_attn_params *pr) {
  CEDAR_ASSERT(!(topk_idx && pr->topk > 0 && n_global > 0) || gkv);
  CEDAR_ASSERT(slots <= 0 || (skv && spos));
  struct entry_src src = {.gf = gkv, .n_global = gkv ? n_global : 0, .sf = skv, .spos = spos,
                          .slots = slots > 0 ? slots : 0};
  attend(o, n_used, q, pos, topk_idx, &src, S, pr);
}

void op_grouped_oproj(float *a, float *z, const float *o, const float *w_oa, const float *w_ob, int S, int heads,
                      int head_dim, int G, int o_rank, int hidden) {
  CEDAR_ASSERT_MSG(G > 0 && heads % G == 0, "grouped o-proj: heads %d is not a multiple of groups %d", heads, G);
  const int gw = heads / G * head_dim, ld_o = heads * head_dim, ld_z = G * o_rank;
  for (int g = 0; g < G; g++)
    op_linear(z + (size_t)g * o_rank, o + (size_t)g * gw, w_oa + (size_t)g * o_rank * gw, S, gw, o_rank, ld_o,
              ld_z);
  op_linear(a, z, w_ob, S, ld_z, hidden, ld_z, hidden);
}

/* attention.c: sparse attention with joint softmax and sink, inverse RoPE,
 * grouped output projection (see attention.h for the math and the API).
 *
 * What it is: plain loops, the numerical spec a CUDA twin (FlashMLA-style:
 * gather, online softmax, fused sink, inverse RoPE) is compared against.
 * Accumulation is fp32 throughout; a twin that rounds P to bf16 before P@V
 * (R.2) is compared under a tolerance that says so.
 *
 * Speed: blocks of 32 entries (attention.h: "How"); the inner loops run over
 * independent lanes (the block's entries for the logits, channels for the
 * accumulation) so the compiler vectorizes them without reordering any sum.
 * online_flush is compiled for SSE2, AVX2 and AVX-512 from one body
 * (ops/isa.h): the same bits at every level.
 * One thread: queries are independent (each reads its own entries once);
 * parallelism comes from the task graph.
 *
 * Test: ctest --test-dir build -R ops_attention --output-on-failure
 */
#include "ops/attention.h"

#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/formats.h"
#include "ops/isa.h"
#include "ops/num_softmax.h"
#include "ops/qlinear.h"
#include "base/check.h"

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

/* Entries are taken ATTN_BLOCK at a time (the reference kernel's tile is 64):
 * a block is dequantized once into kb, its logits for every head computed
 * together, and the accumulator rescaled at most once per block and head. */
#define ATTN_BLOCK 32

/* Per-query running state of the online softmax, one set per head, and the
 * buffers of the block being filled. */
struct online {
  const float *q; /* (heads, d) this query's rows */
  float *acc;     /* (heads, d) running numerator: the output row itself */
  float *m, *l;   /* (heads) running max and running sum */
  float *kb;      /* (ATTN_BLOCK, d) rows for entries that had to be dequantized */
  const float *row[ATTN_BLOCK]; /* the block's entries: rows of kb, or of the caller's float tables */
  float *kt;      /* (d, ATTN_BLOCK) the same transposed; columns >= nb are 0 */
  float *z;       /* (heads, ATTN_BLOCK) the block's logits, then weights */
  int heads, d, nb; /* nb: entries in the block so far */
  float tau;
};


/* Start every head with the sink as the only term: m = sigma, l = exp(0) = 1,
 * acc = 0. Without a sink, m = -inf and l = 0; the first block's rescale
 * factor exp(-inf) = 0 clears l. (A sink of -inf behaves as no sink the same
 * way.) */
static void online_init(struct online *st, const float *sink) {
  for (int h = 0; h < st->heads; h++) {
    const struct op_hd_online o = op_hd_online_start(sink != NULL, sink ? sink[h] : 0.0f);
    st->m[h] = o.m, st->l[h] = o.l;
  }
  memset(st->acc, 0, (size_t)st->heads * st->d * sizeof *st->acc);
  st->nb = 0;
}

/* The logits take channels ATTN_CHUNK at a time, so that the block's slice of
 * kt (B x ATTN_CHUNK floats, 8 KiB) stays in L1 while every head passes over
 * it. (The accumulation streams whole rows: chunking it measured slower.) */
#define ATTN_CHUNK 64

/* Heads whose logits are summed together in one pass over the block's
 * channels: their sums are independent chains, so a wide vector unit is not
 * left waiting on one head's adds. */
#define ATTN_HEADS_PER_PASS 4

/* z (heads, B) = tau * q (heads, d) . kt (d, B). Each logit is summed over
 * i = 0, 1, ..., d-1 in order, one product and one add per step (the partial
 * sum waits in z between channel chunks, exactly), then scaled by tau: the
 * order of a plain scalar dot, whatever B, the block's fill, the number of
 * heads per pass or the vector width. The lanes are the B entries of up to
 * ATTN_HEADS_PER_PASS heads, independent, so the inner loop vectorizes. */
static inline OP_ISA_BODY void block_logits(float *restrict z, const float *restrict q, const float *restrict kt,
                                            int heads, int d, float tau) {
  memset(z, 0, (size_t)heads * ATTN_BLOCK * sizeof *z);
  for (int i0 = 0; i0 < d; i0 += ATTN_CHUNK) {
    const int i1 = d - i0 < ATTN_CHUNK ? d : i0 + ATTN_CHUNK;
    int h = 0;
    for (; h + ATTN_HEADS_PER_PASS <= heads; h += ATTN_HEADS_PER_PASS) {
      float s[ATTN_HEADS_PER_PASS][ATTN_BLOCK];
      const float *qh = q + (size_t)h * d;
      for (int j = 0; j < ATTN_HEADS_PER_PASS; j++)
        for (int b = 0; b < ATTN_BLOCK; b++) s[j][b] = z[(size_t)(h + j) * ATTN_BLOCK + b];
      for (int i = i0; i < i1; i++)
        for (int j = 0; j < ATTN_HEADS_PER_PASS; j++)
          for (int b = 0; b < ATTN_BLOCK; b++) s[j][b] += qh[(size_t)j * d + i] * kt[(size_t)i * ATTN_BLOCK + b];
      for (int j = 0; j < ATTN_HEADS_PER_PASS; j++)
        for (int b = 0; b < ATTN_BLOCK; b++) z[(size_t)(h + j) * ATTN_BLOCK + b] = s[j][b];
    }
    for (; h < heads; h++) {
      const float *qh = q + (size_t)h * d;
      float s[ATTN_BLOCK];
      for (int b = 0; b < ATTN_BLOCK; b++) s[b] = z[(size_t)h * ATTN_BLOCK + b];
      for (int i = i0; i < i1; i++)
        for (int b = 0; b < ATTN_BLOCK; b++) s[b] += qh[i] * kt[(size_t)i * ATTN_BLOCK + b];
      for (int b = 0; b < ATTN_BLOCK; b++) z[(size_t)h * ATTN_BLOCK + b] = s[b];
    }
  }
  for (int k = 0; k < heads * ATTN_BLOCK; k++) z[k] *= tau;
}

/* acc (heads, d) += w (heads, B) kb (B, d) over the first nb entries: every
 * acc[h][i] adds its terms w[h][b] kb[b][i] one at a time in entry order.
 * Four entries go per pass over the row (left to right: the same order),
 * so acc is loaded and stored once per four terms. */
static inline OP_ISA_BODY void block_accumulate(float *restrict acc, const float *restrict w,
                                                const float *const *row, int heads, int d, int nb) {
  for (int h = 0; h < heads; h++) {
    float *ah = acc + (size_t)h * d;
    const float *wh = w + (size_t)h * ATTN_BLOCK;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
      const float w0 = wh[b], w1 = wh[b + 1], w2 = wh[b + 2], w3 = wh[b + 3];
      const float *restrict k0 = row[b], *restrict k1 = row[b + 1], *restrict k2 = row[b + 2],
                          *restrict k3 = row[b + 3];
      for (int i = 0; i < d; i++) ah[i] = ah[i] + w0 * k0[i] + w1 * k1[i] + w2 * k2[i] + w3 * k3[i];
    }
    for (; b < nb; b++) {
      const float wb = wh[b], *restrict kr = row[b];
      for (int i = 0; i < d; i++) ah[i] += wb * kr[i];
    }
  }
}

/* kt (d, B) = kb (nb, d) transposed, columns nb.. zero. By tiles of 16
 * channels (a cache line of a kb row), not channel by channel: kb's rows are
 * d apart, often a multiple of 4 KiB that would thrash one cache set. */
static inline OP_ISA_BODY void block_transpose(float *restrict kt, const float *const *row, int d, int nb) {
  for (int i0 = 0; i0 < d; i0 += 16) {
    const int n = d - i0 < 16 ? d - i0 : 16;
    for (int b = 0; b < nb; b++)
      for (int j = 0; j < n; j++) kt[(size_t)(i0 + j) * ATTN_BLOCK + b] = row[b][i0 + j];
    for (int j = 0; j < n; j++)
      for (int b = nb; b < ATTN_BLOCK; b++) kt[(size_t)(i0 + j) * ATTN_BLOCK + b] = 0.0f;
  }
}

/* Fold the filled block into the running state: logits of all heads, then
 * per head the block max; if it exceeds the running max, rescale l and acc
 * once by exp(m_old - m_new); the weights exp(z - m) join l in entry order
 * and acc through block_accumulate. A NaN logit fails the max test and
 * poisons l and acc through exp(NaN). */
static inline OP_ISA_BODY void online_flush_body(struct online *st) {
  const int H = st->heads, d = st->d, nb = st->nb;
  if (nb == 0) return;
  block_transpose(st->kt, st->row, d, nb);
  block_logits(st->z, st->q, st->kt, H, d, st->tau);
  for (int h = 0; h < H; h++) {
    float *zh = st->z + (size_t)h * ATTN_BLOCK, mb = st->m[h];
    for (int b = 0; b < nb; b++)
      if (zh[b] > mb) mb = zh[b];
    struct op_hd_online o = {st->m[h], st->l[h]}; /* the rules of ops/num_softmax.h */
    if (mb > o.m) {
      const float c = op_hd_online_raise(&o, mb);
      float *ah = st->acc + (size_t)h * d;
      for (int i = 0; i < d; i++) ah[i] *= c;
    }
    for (int b = 0; b < nb; b++) zh[b] = op_hd_online_weight(&o, zh[b]);
    st->m[h] = o.m, st->l[h] = o.l;
  }
  block_accumulate(st->acc, st->z, st->row, H, d, nb);
  st->nb = 0;
}
/* online_flush: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(online_flush, (struct online *st), (st))

/* The next row of kb to dequantize an entry into; flushes a full block first. */
static float *online_slot(struct online *st) {
  if (st->nb == ATTN_BLOCK) online_flush(st);
  float *r = st->kb + (size_t)st->nb * st->d;
  st->row[st->nb++] = r;
  return r;
}

/* Take a float row of the caller's as the block's next entry, in place. */
static void online_row(struct online *st, const float *r) {
  if (st->nb == ATTN_BLOCK) online_flush(st);
  st->row[st->nb++] = r;
}

static void swa_entry(struct online *st, const struct entry_src *src, int slot) {
  if (src->sf) {
    online_row(st, src->sf + (size_t)slot * st->d);
    return;
  }
  const struct op_swa_view *v = src->swa;
  op_kv_unpack(&v->fmt, online_slot(st), v->slots + (size_t)slot * v->entry_bytes, v->w);
}

static void global_entry(struct online *st, const struct entry_src *src, int64_t e) {
  if (src->gf) {
    online_row(st, src->gf + (size_t)e * st->d);
    return;
  }
  const struct op_kv_view *v = src->kv;
  op_kv_unpack(&v->main_fmt, online_slot(st), op_kv_entry(v, e) + v->main_off, v->main_w);
}

/* o_h = acc / l. l == 0 only when there was neither a sink nor an entry:
 * then acc is 0 and o = 0 (R.2). A NaN l divides through and stays NaN. */
static void online_finish(struct online *st) {
  online_flush(st);
  for (int h = 0; h < st->heads; h++) {
    float *acc = st->acc + (size_t)h * st->d;
    for (int i = 0; i < st->d; i++) acc[i] = op_hd_online_out(acc[i], st->l[h]);
  }
}

/* Visit query p's entries: visible ring slots (decided on the stored
 * position), then the valid Top-K indices. Returns the number visited. */
static int32_t attend_query(struct online *st, const struct entry_src *src, const int32_t *idx /* (topk) or NULL */,
                            int64_t p, const struct op_attn_params *pr) {
  int32_t used = 0;
  const int64_t lo = p - pr->window + 1 > pr->r0 ? p - pr->window + 1 : pr->r0;
  for (int s = 0; pr->window > 0 && s < src->slots; s++) {
    const int64_t ps = src->spos[s];
    if (ps < 0 || ps < lo || ps > p) continue; /* empty, too old, before r0, or future */
    swa_entry(st, src, s);
    used++;
  }
  for (int t = 0; idx && t < pr->topk; t++) {
    if (idx[t] < 0 || idx[t] >= src->n_global) continue; /* -1 = none; uncommitted */
    global_entry(st, src, idx[t]);
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
  const size_t blk = (size_t)ATTN_BLOCK * d;
  float *scratch = cedar_xmalloc((2 * (size_t)H + 2 * blk + (size_t)H * ATTN_BLOCK) * sizeof *scratch);
  struct online st = {.m = scratch, .l = scratch + H, .kb = scratch + 2 * H, .kt = scratch + 2 * H + blk,
                      .z = scratch + 2 * H + 2 * blk, .heads = H, .d = d, .tau = pr->tau};
  for (int i = 0; i < S; i++) {
    st.q = q + (size_t)i * H * d;
    st.acc = o + (size_t)i * H * d;
    online_init(&st, pr->sink);
    int32_t used = attend_query(&st, src, topk_idx ? topk_idx + (size_t)i * pr->topk : NULL, pos[i], pr);
    online_finish(&st);
    if (n_used) n_used[i] = used;
  }
  free(scratch);
  /* SPEC 3.12: o_h[rope dims] = RoPE(o_h, -p), all heads of row i at pos[i]. */
  if (pr->rope && S > 0 && pr->angles) {
    for (int i = 0; i < S; i++)
      CEDAR_ASSERT_MSG(i < pr->angles->n && pr->angles->pos[i] == pos[i], "attention: angle row %d is not query %d's", i, i);
    op_rope_rotate(o, pr->rope, pr->angles, 0, S, H, H * d, -1);
  } else if (pr->rope && S > 0) {
    op_rope_apply(o, pr->rope, pos, S, H, H * d, -1);
  }
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
  struct op_qweight wa = op_qw_f32(w_oa, G * o_rank, heads / G * head_dim), wb = op_qw_f32(w_ob, hidden, G * o_rank);
  op_grouped_oproj_q(a, z, o, &wa, &wb, S, heads, head_dim, G);
}

void op_grouped_oproj_q(float *a, float *z, const float *o, const struct op_qweight *w_oa,
                        const struct op_qweight *w_ob, int S, int heads, int head_dim, int G) {
  CEDAR_ASSERT_MSG(G > 0 && heads % G == 0, "grouped o-proj: heads %d is not a multiple of groups %d", heads, G);
  const int gw = heads / G * head_dim, ld_o = heads * head_dim, o_rank = w_oa->out / G, ld_z = G * o_rank;
  CEDAR_ASSERT(w_oa->in == gw && w_oa->out == ld_z && w_ob->in == ld_z);
  for (int g = 0; g < G; g++) {
    struct op_qweight wg = op_qweight_rows(w_oa, g * o_rank, o_rank);
    op_qlinear(z + (size_t)g * o_rank, o + (size_t)g * gw, &wg, S, ld_o, ld_z);
  }
  op_qlinear(a, z, w_ob, S, ld_z, w_ob->out);
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */
/* `cedar op sparse_attn` over packed entries given as tensors (the global
 * source as a one-page view, the SWA ring as its slots and positions), and
 * `cedar op oproj`. Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn). */

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>

#include "ops/registry.h"

/* One sparse_attn call: struct op_attn_call (attention.h). */
#define attn_call op_attn_call

/* q (S, heads, head_dim), pos (S) >= 0, topk (S, k) and sink (heads). */
static int attn_queries(const struct op_desc *self, struct op_io *io, struct attn_call *c) {
  int64_t qd[3], pd[1], td[2] = {0, 0}, sd[1];
  const struct op_tensor *q = op_io_in(self, io, "q", 3, qd), *t = NULL, *s = NULL;
  const struct op_tensor *pos = q ? op_io_in(self, io, "pos", 1, pd) : NULL;
  if (!pos || (io->input(io, "topk") && !(t = op_io_in(self, io, "topk", 2, td))) ||
      (io->input(io, "sink") && !(s = op_io_in(self, io, "sink", 1, sd))))
    return CEDAR_EINVAL;
  if (qd[1] < 1 || qd[2] < 1)
    return op_io_fail(io, "sparse_attn: q is (%lld, %lld, %lld): it needs heads >= 1 and head_dim >= 1",
                      (long long)qd[0], (long long)qd[1], (long long)qd[2]);
  if (pd[0] != qd[0])
    return op_io_fail(io, "sparse_attn: pos has %lld positions but q has %lld queries", (long long)pd[0],
                      (long long)qd[0]);
  if (t && td[0] != qd[0])
    return op_io_fail(io, "sparse_attn: topk is (%lld, %lld) but q has %lld queries", (long long)td[0],
                      (long long)td[1], (long long)qd[0]);
  if (s && sd[0] != qd[1])
    return op_io_fail(io, "sparse_attn: sink has %lld values but q has %lld heads", (long long)sd[0],
                      (long long)qd[1]);
  c->q = q->data, c->pos = pos->data, c->topk = t ? t->data : NULL, c->S = (int)qd[0];
  c->pr = (struct op_attn_params){.heads = (int)qd[1], .head_dim = (int)qd[2], .topk = t ? (int)td[1] : 0,
                                  .sink = s ? s->data : NULL};
  for (int i = 0; i < c->S; i++)
    if (c->pos[i] < 0 || c->pos[i] > ((int64_t)1 << 53))
      return op_io_fail(io, "sparse_attn: pos[%d] = %lld is outside [0, 2^53]", i, (long long)c->pos[i]);
  return 0;
}

/* entries (n, bytes): the Main-KV part at main_off of each row. Needed
 * exactly when topk is given. */
static int attn_global(const struct op_desc *self, struct op_io *io, struct attn_call *c) {
  int64_t ed[2];
  double block, off, nibble;
  if (!c->topk) {
    if (io->input(io, "entries"))
      return op_io_fail(io, "sparse_attn: entries given without topk (the Top-K list picks the global entries)");
    return 0;
  }
  const struct op_tensor *e = op_io_in(self, io, "entries", 2, ed);
  if (!e || !op_io_param_in(self, io, "main_block", 2, INT_MAX, &block) ||
      !op_io_param_in(self, io, "main_off", 0, INT_MAX, &off) || !op_io_param_in(self, io, "nibble", 0, 1, &nibble))
    return CEDAR_EINVAL;
  const int hd = c->pr.head_dim;
  size_t bytes = op_fp4_bytes(hd, (int)block);
  if (!bytes)
    return op_io_fail(io, "sparse_attn: main_block %d must be even and divide head_dim %d", (int)block, hd);
  if ((int64_t)off + (int64_t)bytes > ed[1])
    return op_io_fail(io, "sparse_attn: entries rows have %lld bytes but a Main-KV entry of %d values (block %d) at "
                          "main_off %d needs %lld", (long long)ed[1], hd, (int)block, (int)off,
                      (long long)off + (long long)bytes);
  c->page = e->data;
  c->kv = (struct op_kv_view){.pages = &c->page, .page_entries = ed[0] > 0 ? (int)ed[0] : 1,
                              .entry_bytes = (size_t)ed[1], .main_off = (size_t)off, .n_entries = ed[0],
                              .ratio = 1, .main_w = hd,
                              .main_fmt = op_kv_fp4_format((int)block, (enum op_nibble_order)nibble)};
  return 0;
}

/* swa (slots, bytes) FP8 entries and swa_pos (slots): both or neither. */
static int attn_ring(const struct op_desc *self, struct op_io *io, struct attn_call *c) {
  int64_t sd[2], pd[1];
  double block, scale;
  bool has = io->input(io, "swa") != NULL;
  if (has != (io->input(io, "swa_pos") != NULL))
    return op_io_fail(io, "sparse_attn: give both swa and swa_pos, or neither (got only %s)",
                      has ? "swa" : "swa_pos");
  if (!has) return 0;
  const struct op_tensor *s = op_io_in(self, io, "swa", 2, sd);
  const struct op_tensor *p = s ? op_io_in(self, io, "swa_pos", 1, pd) : NULL;
  if (!p || !op_io_param_in(self, io, "swa_block", 0, INT_MAX, &block) || !op_io_param_in(self, io, "swa_scale", 0, 1, &scale))
    return CEDAR_EINVAL;
  if (pd[0] != sd[0])
    return op_io_fail(io, "sparse_attn: swa_pos has %lld positions but swa has %lld slots", (long long)pd[0],
                      (long long)sd[0]);
  const int hd = c->pr.head_dim, blk = block ? (int)block : hd;
  size_t bytes = op_fp8_bytes(hd, blk, (enum op_scale_kind)scale);
  if (!bytes || (int64_t)bytes != sd[1])
    return op_io_fail(io, "sparse_attn: swa rows have %lld bytes but an FP8 entry of head_dim %d with swa_block %d "
                          "and swa_scale %d has %zu (0: the block does not divide head_dim)", (long long)sd[1], hd,
                      blk, (int)scale, bytes);
  c->swa = (struct op_swa_view){.slots = s->data, .pos = p->data, .n_slots = (int)sd[0], .entry_bytes = bytes,
                                .w = hd, .fmt = op_kv_fp8_format(blk, (enum op_scale_kind)scale)};
  c->has_swa = true;
  return 0;
}

static int attn_scalars(const struct op_desc *self, struct op_io *io, struct attn_call *c) {
  double window, r0, tau;
  if (!op_io_param_in(self, io, "window", 0, INT_MAX, &window) || !op_io_param_in(self, io, "r0", -0x1p53, 0x1p53, &r0) ||
      !op_io_param_in(self, io, "tau", -DBL_MAX, DBL_MAX, &tau) || !op_rope_from_params(self, io, "rope_dim", "last", c->pr.head_dim, &c->rope))
    return CEDAR_EINVAL;
  c->pr.window = (int)window;
  c->pr.r0 = (int64_t)r0;
  c->pr.tau = tau == 0 ? op_attn_tau_default(c->pr.head_dim) : (float)tau;
  c->pr.rope = c->rope.rope_dim > 0 ? &c->rope : NULL;
  return 0;
}

int op_sparse_attn_prepare(const struct op_desc *self, struct op_io *io, struct op_attn_call *cp) {
  struct attn_call c;
  memset(&c, 0, sizeof c);
  int rc = attn_queries(self, io, &c);
  if (!rc) rc = attn_global(self, io, &c);
  /* the kernel skips an index past the committed entries (the model's
   * uncommitted tail); from a caller's tensors such an index is a mistake */
  for (int64_t i = 0; !rc && c.topk && i < (int64_t)c.S * c.pr.topk; i++)
    if (c.topk[i] < -1 || c.topk[i] >= c.kv.n_entries)
      rc = op_io_fail(io, "sparse_attn: topk[%lld][%lld] = %d is neither -1 (none) nor an entry index in [0, %lld)",
                      (long long)(i / c.pr.topk), (long long)(i % c.pr.topk), (int)c.topk[i],
                      (long long)c.kv.n_entries);
  if (!rc) rc = attn_ring(self, io, &c);
  if (!rc) rc = attn_scalars(self, io, &c);
  if (rc) return rc;
  const struct op_attn_params *pr = &c.pr;
  c.o = op_io_out(self, io, "o", 3, (int64_t[]){c.S, pr->heads, pr->head_dim});
  c.n_used = c.o ? op_io_out(self, io, "n_used", 1, (int64_t[]){c.S}) : NULL;
  if (!c.n_used) return CEDAR_ENOMEM;
  *cp = c;
  /* the views point into the call: re-aim them at the caller's copy */
  cp->kv.pages = &cp->page;
  cp->pr.rope = c.pr.rope ? &cp->rope : NULL;
  return 0;
}

static int sparse_attn_run(const struct op_desc *self, struct op_io *io) {
  struct op_attn_call c = {0};
  int rc = op_sparse_attn_prepare(self, io, &c);
  if (rc) return rc;
  op_sparse_attn(c.o, c.n_used, c.q, c.pos, c.topk, c.topk ? &c.kv : NULL, c.has_swa ? &c.swa : NULL, c.S, &c.pr);
  return 0;
}

int op_oproj_prepare(const struct op_desc *self, struct op_io *io, struct op_oproj_call *c) {
  int64_t od[3], ad[3], bd[2];
  const struct op_tensor *o = op_io_in(self, io, "o", 3, od);
  const struct op_tensor *wa = o ? op_io_in(self, io, "W_oa", 3, ad) : NULL;
  const struct op_tensor *wb = wa ? op_io_in(self, io, "W_ob", 2, bd) : NULL;
  if (!wb) return CEDAR_EINVAL;
  const int64_t G = ad[0], heads = od[1], hd = od[2];
  if (G < 1 || heads % G != 0 || ad[2] != heads / G * hd)
    return op_io_fail(io, "oproj: W_oa is (%lld, %lld, %lld) but o is (%lld, %lld, %lld): it needs (G, o_rank, "
                          "heads/G * head_dim) with G >= 1 dividing heads", (long long)ad[0], (long long)ad[1],
                      (long long)ad[2], (long long)od[0], (long long)heads, (long long)hd);
  if (bd[1] != G * ad[1])
    return op_io_fail(io, "oproj: W_ob is (%lld, %lld) but W_oa is (%lld, %lld, %lld): W_ob needs %lld columns",
                      (long long)bd[0], (long long)bd[1], (long long)ad[0], (long long)ad[1], (long long)ad[2],
                      (long long)(G * ad[1]));
  float *a = op_io_out(self, io, "a", 2, (int64_t[]){od[0], bd[0]});
  float *z = a ? op_io_out(self, io, "z", 2, (int64_t[]){od[0], bd[1]}) : NULL;
  if (!z) return CEDAR_ENOMEM;
  *c = (struct op_oproj_call){.o = o->data, .w_oa = wa->data, .w_ob = wb->data, .a = a, .z = z, .S = (int)od[0],
                              .heads = (int)heads, .head_dim = (int)hd, .G = (int)G, .o_rank = (int)ad[1],
                              .hidden = (int)bd[0]};
  return 0;
}

static int oproj_run(const struct op_desc *self, struct op_io *io) {
  struct op_oproj_call c = {0};
  int rc = op_oproj_prepare(self, io, &c);
  if (!rc) op_grouped_oproj(c.a, c.z, c.o, c.w_oa, c.w_ob, c.S, c.heads, c.head_dim, c.G, c.o_rank, c.hidden);
  return rc;
}

const struct op_desc op_desc_sparse_attn = {
    .name = "sparse_attn",
    .summary = "sparse attention over Top-K global entries and the SWA ring, one softmax with sink, inverse "
               "RoPE (SPEC 3.12)",
    .inputs = (const struct op_arg[]){
        {"q", OP_F32, "(S, heads, head_dim)", "main queries, RoPE'd (q_main)"},
        {"pos", OP_I64, "(S)", "absolute query positions, >= 0"},
        {"topk", OP_I32, "(S, k)", "optional: global entry ids per query, -1 = none (absent: SWA-only layer)"},
        {"entries", OP_U8, "(n, bytes)", "with topk only: global entries, Main-KV (fp4) part at main_off"},
        {"swa", OP_U8, "(slots, bytes)", "optional: SWA ring slots, FP8 (fp8_pack / swa_kv pack=1)"},
        {"swa_pos", OP_I64, "(slots)", "with swa: absolute position held by each slot, < 0 = empty"},
        {"sink", OP_F32, "(heads)", "optional: sink logit per head, unscaled (absent: no sink)"},
        {0}},
    .outputs = (const struct op_arg[]){{"o", OP_F32, "(S, heads, head_dim)", "attention output, inverse RoPE'd"},
                                       {"n_used", OP_I32, "(S)", "entries each query attended to"},
                                       {0}},
    .params = (const struct op_param[]){
        {"window", OP_PARAM_INT, 128, "SWA visibility span W [A]; 0 = no local entries"},
        {"r0", OP_PARAM_INT, 0, "replay start: SWA positions < r0 are invisible (SPEC 3.9)"},
        {"tau", OP_PARAM_FLOAT, 0, "softmax scale; 0 = 1/sqrt(head_dim) [R-cfg]"},
        {"main_block", OP_PARAM_INT, 16, "values per E4M3 scale in Main KV [A]"},
        {"main_off", OP_PARAM_INT, 0, "byte offset of the Main-KV part in an entries row (compress: 0)"},
        {"nibble", OP_PARAM_INT, 0, "Main KV: 0 element 2j in the low nibble, 1 in the high one [R]"},
        {"swa_block", OP_PARAM_INT, 0, "values per SWA scale; 0 = one per entry [R] (R.2 serving: 32)"},
        {"swa_scale", OP_PARAM_INT, 0, "SWA scales: 0 FP32 [R], 1 E8M0 (R.2)"},
        {"rope_dim", OP_PARAM_INT, 64, "channels of the inverse RoPE, 0 = none [A]"},
        {"last", OP_PARAM_BOOL, 1, "rotate the last rope_dim channels, else the first [A]"},
        OP_ROPE_PARAM_LIST,
        {0}},
    .run = sparse_attn_run,
};

const struct op_desc op_desc_oproj = {
    .name = "oproj",
    .summary = "grouped output projection: z_g = W_oa[g] o_group(g), a = W_ob z (SPEC 3.12, R.2)",
    .inputs = (const struct op_arg[]){
        {"o", OP_F32, "(S, heads, head_dim)", "attention output (sparse_attn)"},
        {"W_oa", OP_F32, "(G, o_rank, heads/G*head_dim)", "per-group down-projection; G = o_groups (8 [R-cfg])"},
        {"W_ob", OP_F32, "(hidden, G*o_rank)", "up-projection (o_rank 1024, hidden 5120 [R-cfg])"},
        {0}},
    .outputs = (const struct op_arg[]){{"a", OP_F32, "(S, hidden)", "attention branch output"},
                                       {"z", OP_F32, "(S, G*o_rank)", "the concatenated group projections"},
                                       {0}},
    .run = oproj_run,
};

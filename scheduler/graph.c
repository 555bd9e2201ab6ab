/* graph.c: the compiler from a plan to a graph (graph.h), and the edge
 * derivation. Printing and DOT are in viz/graph_print.c.
 *
 * Reading guide: graph_build_prefill and graph_build_decode are the flows of
 * docs/model.md s6 written as loops over tiles and layers; emit_layer adds
 * one layer's nodes for one tile with the data each reads and writes; the
 * edges come from graph__finish() (graph_edges.c) at the end, from the
 * accesses alone.
 */
#include "scheduler/graph.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "scheduler/plan_place.h"

static const char *const op_names[] = {
#define X(e, s) s,
    GRAPH_OPS(X)
#undef X
};

const char *graph_op_name(enum graph_op op) { return op < GRAPH_OP_COUNT ? op_names[op] : "?"; }

const char *graph_flow_name(enum graph_flow f) {
  switch (f) {
  case GRAPH_PREFILL_CED: return "prefill-ced";
  case GRAPH_PREFILL_DENSE: return "prefill-dense";
  case GRAPH_DECODE: return "decode";
  }
  return "?";
}

const char *graph_access_name(enum graph_access a) {
  switch (a) {
  case GRAPH_R: return "R";
  case GRAPH_W: return "W";
  case GRAPH_RW: return "RW";
  case GRAPH_APPEND: return "APPEND";
  }
  return "?";
}

/* ---- placement ----------------------------------------------------------- */

struct graph_place graph_place_of(const struct plan *p, enum graph_flow f) {
  const struct plan_serving *s = &p->serving;
  bool pre = f != GRAPH_DECODE;
  int dev = pre ? s->prefill_device : s->decode_device;
  struct graph_place pl = {pre ? s->prefill_rank : s->decode_rank, dev == PLAN_DEV_CUDA ? GRAPH_DEV_CUDA : GRAPH_DEV_CPU,
                           0};
  if (pl.dev == GRAPH_DEV_CUDA) pl.dev_id = pre ? s->prefill_device_id : s->decode_device_id;
  return pl;
}

bool graph_place_eq(struct graph_place a, struct graph_place b) {
  return a.rank == b.rank && a.dev == b.dev && a.dev_id == b.dev_id;
}

const char *graph_place_str(struct graph_place pl, char *buf, size_t len) {
  if (pl.dev == GRAPH_DEV_CUDA)
    snprintf(buf, len, "rank %d cuda:%d", pl.rank, pl.dev_id);
  else
    snprintf(buf, len, "rank %d cpu", pl.rank);
  return buf;
}

/* ---- building blocks ---------------------------------------------------- */

/* Per-request data ids fixed for a whole graph; *_dst: the decode side's
 * copies a P->D transfer writes (-1 until a transfer needs them). */
struct ids {
  int w_model, tokens, xe;
  int w[PLAN_MAX_LAYERS], ring[PLAN_MAX_LAYERS], tail[PLAN_MAX_LAYERS], kv[PLAN_MAX_LAYERS];
  int kv_dst[PLAN_MAX_LAYERS];
};

/* Per-tile data ids. */
struct tile {
  int chunk;
  int64_t a;
  int n;
  int64_t r0;
  int x, pre;
  int topk[PLAN_MAX_LAYERS], pool[PLAN_MAX_LAYERS];
  int eng[PLAN_MAX_LAYERS]; /* each Engram layer's gathered rows, -1 before */
  bool laid;                /* its first layer is emitted */
  char tag[16]; /* "c2", "rp1", "dec" */
};

static int add_data(struct graph *g, enum graph_data_kind kind, int layer, int chunk, int64_t bytes, const char *fmt,
                    ...) {
  if (g->n_data == g->cap_data) {
    g->cap_data = g->cap_data ? 2 * g->cap_data : 64;
    g->data = cedar_xrealloc(g->data, sizeof(*g->data) * g->cap_data);
  }
  struct graph_data *d = &g->data[g->n_data];
  memset(d, 0, sizeof(*d));
  d->kind = kind;
  d->layer = layer;
  d->chunk = chunk;
  d->bytes = bytes;
  d->last_use = -1;
  d->home = g->place;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->name, sizeof(d->name), fmt, ap);
  va_end(ap);
  return g->n_data++;
}

static struct graph_node *add_node(struct graph *g, enum graph_op op, int layer, const struct tile *t) {
  if (g->n_node == g->cap_node) {
    g->cap_node = g->cap_node ? 2 * g->cap_node : 64;
    g->node = cedar_xrealloc(g->node, sizeof(*g->node) * g->cap_node);
  }
  struct graph_node *nd = &g->node[g->n_node++];
  memset(nd, 0, sizeof(*nd));
  nd->op = op;
  nd->layer = layer;
  nd->chunk = t->chunk;
  nd->a = t->a;
  nd->n = t->n;
  nd->r0 = t->r0;
  nd->x = t->x;
  nd->aux = -1;
  for (int i = 0; i < 4; i++) nd->bus[i] = -1;
  nd->pre = -1;
  nd->place = g->place;
  nd->slot0 = 0;
  nd->n_slots = 1;
  nd->xfer_src = nd->xfer_dst = -1;
  nd->key_src[0] = nd->key_src[1] = -1;
  if (layer >= 0)
    snprintf(nd->name, sizeof(nd->name), "L%d.%s %s", layer, graph_op_name(op), t->tag);
  else
    snprintf(nd->name, sizeof(nd->name), "%s %s", graph_op_name(op), t->tag);
  return nd;
}

static void use(struct graph_node *nd, int data, enum graph_access mode) {
  if (data < 0) return;
  for (int i = 0; i < nd->n_use; i++)
    if (nd->use[i].data == data) {
      if (mode == GRAPH_APPEND || nd->use[i].mode == GRAPH_APPEND)
        nd->use[i].mode = GRAPH_APPEND;
      else
        nd->use[i].mode |= mode;
      return;
    }
  nd->use = cedar_xrealloc(nd->use, sizeof(*nd->use) * (nd->n_use + 1));
  nd->use[nd->n_use++] = (struct graph_use){data, mode, 0, 0, 0};
}

static struct graph_use *use_of(struct graph_node *nd, int data) {
  for (int i = 0; i < nd->n_use; i++)
    if (nd->use[i].data == data) return &nd->use[i];
  CEDAR_ASSERT_MSG(0, "%s does not use data %d", nd->name, data);
  return NULL;
}


/* ---- sizes and flops ---------------------------------------------------- */

static int64_t x_bytes(const struct plan_model *m, int n) { return (int64_t)n * m->hc_streams * m->hidden * 4; }

static int engram_tables(const struct plan_model *m) { return m->engram_n_orders * m->engram_heads; }

static double attn_flops(const struct plan *p, const struct plan_layer *L, int n) {
  const struct plan_model *m = &p->model;
  double d = m->hidden, hd = m->heads * (double)m->head_dim;
  double f = d * m->q_rank + m->q_rank * hd + d * m->head_dim;           /* q latent, q heads, SWA kv */
  f += hd * 2.0 * (m->window + (plan_is_csa(L) ? m->topk : 0));          /* logits and weighted sum */
  f += hd * m->o_rank / m->o_groups * m->o_groups + m->o_groups * (double)m->o_rank * d; /* O projection */
  if (plan_is_index_source(L)) f += m->q_rank * (double)m->idx_heads * m->idx_head_dim + d * m->idx_heads;
  return 2.0 * f * n;
}

static double moe_flops(const struct plan_model *m, int n) {
  double d = m->hidden;
  double f = d * m->n_routed + 3.0 * d * (m->n_active * (double)m->moe_inter + m->n_shared * (double)m->shared_inter);
  return 2.0 * f * n;
}

/* ---- one layer of one tile ---------------------------------------------- */

struct ctx {
  struct graph *g;
  const struct plan *p;
  struct ids id;
  int64_t kv_entries[PLAN_MAX_LAYERS]; /* by source: entries committed so far in program order */
  int64_t kv_shipped[PLAN_MAX_LAYERS]; /* by source: entries a TRANSFER has sent to the decode side */
  int first_dec;      /* first decoder layer, or n_layers when none */
  bool ced;
  /* model.indexer.key_slot: vendor (docs/model.md s3.2): the new positions
   * [fw_a, fw_end) of a prefill forward, and the first row whose slot rows
   * are not committed yet (-1: none) */
  int64_t fw_a, fw_end, keys_short;
};

/* KV source l's entries: node nd appends those of positions up to `end`
 * (a compressor of ratio r has committed floor(p / r) entries after
 * positions [0, p)), or reads every entry committed so far. */
static void kv_append(struct ctx *c, struct graph_node *nd, int l, int64_t end) {
  use(nd, c->id.kv[l], GRAPH_APPEND);
  struct graph_use *u = use_of(nd, c->id.kv[l]);
  u->e_w0 = c->kv_entries[l];
  u->e_w1 = c->kv_entries[l] = end / c->p->layer[l].ratio;
}

static void kv_read(struct ctx *c, struct graph_node *nd, int l) {
  use(nd, c->id.kv[l], GRAPH_R);
  use_of(nd, c->id.kv[l])->e_read = c->kv_entries[l];
}

/* The slot before layer l's indexer in a forward over [a, end), as the
 * vendor's forwards leave it: the last KV source at or before l that
 * publishes in the forward, else the last source in layer order (ratio 1
 * by plan_check: what every forward leaves; none at position 0). A source publishes when the forward completes one of its
 * groups (its compressor emits a latent): a decode step at p when (p + 1)
 * % r == 0 (ratio 1 always, ratio 2 at odd p); a prefill, one forward over
 * its new positions [fw_a, fw_end) however cedar tiles it, when
 * floor(fw_end / r) > floor(fw_a / r). */
static int slot_in(const struct plan *p, int l, int64_t a, int64_t end) {
  int k = -1;
  for (int j = 0; j < p->n_layers; j++) /* the last source: what a forward before this one left */
    if (a > 0 && plan_is_kv_source(&p->layer[j])) k = j;
  for (int j = 0; j <= l; j++) {
    const struct plan_layer *J = &p->layer[j];
    if (plan_is_kv_source(J) && end / J->ratio > a / J->ratio) k = j;
  }
  return k;
}

static int slot_at(const struct ctx *c, int l, int64_t p) {
  bool step = c->g->flow == GRAPH_DECODE;
  return step ? slot_in(c->p, l, p, p + 1) : slot_in(c->p, l, c->fw_a, c->fw_end);
}

void graph__key_sources(const struct plan *p, int l, int src[2]) {
  src[0] = src[1] = -1;
  const struct plan_layer *L = &p->layer[l];
  if (p->model.idx_key_slot != PLAN_KEY_SLOT_VENDOR || !plan_is_index_source(L)) return;
  for (int c = 0; c < 2; c++) { /* decode steps at p = 2 (p + 1 odd) and p = 1 (even) stand for every p > 0 */
    int k = slot_in(p, l, 2 - c, 3 - c);
    src[c] = k == L->kv_src ? -1 : k;
  }
}

/* Which Indexer-K index layer l's rows score on tile t (graph_node.key_src),
 * and the reads of those that are not its own source's. A decode or verify
 * tile's row at p reads the slot as the one-position step p would (so a
 * verify step scores as plain decoding does). */
static void key_reads(struct ctx *c, struct graph_node *nd, const struct tile *t, int l) {
  const struct plan_layer *L = &c->p->layer[l];
  if (c->p->model.idx_key_slot != PLAN_KEY_SLOT_VENDOR) return;
  for (int i = 0; i < t->n; i++) {
    int64_t p = t->a + i;
    int k = slot_at(c, l, p);
    if (k < 0 || k == L->kv_src) continue;
    nd->key_src[(p + 1) % 2 == 0] = k;
    kv_read(c, nd, k);
    if ((p + 1) / L->ratio > c->kv_entries[k] && c->keys_short < 0) c->keys_short = p;
  }
}

/* The mHC wiring of a sublayer node (docs/model.md s2): under pairing v41
 * it mixes with the carried pre (the tile's pre buffer: the embedding's
 * one-hot, then each sublayer's own) and carries its own on; under v4 it
 * mixes with its own and carries nothing. */
static void mhc_flags(const struct ctx *c, struct graph_node *nd) {
  nd->flags |= c->p->model.hc_pairing == PLAN_PAIRING_V4 ? GRAPH_F_RESTART : GRAPH_F_PRE_NEXT;
}

/* The Engram prefetch of layer l on tile t: hash and gather the rows from
 * the token ids alone (SPEC 3.15, 8.6.28), emitted at the tile's start so
 * it runs ahead of the layers (docs/runtime.md, "Engram prefetch"). */
static void emit_engram_gather(struct ctx *c, struct tile *t, int l) {
  const struct plan_model *m = &c->p->model;
  int e = add_data(c->g, GRAPH_ACT, l, t->chunk, (int64_t)t->n * engram_tables(m) * m->engram_head_dim * 4,
                   "L%d.engram_e %s", l, t->tag);
  struct graph_node *nd = add_node(c->g, GRAPH_ENGRAM_GATHER, l, t);
  nd->x = -1;
  nd->aux = e;
  use(nd, c->id.tokens, GRAPH_R);
  use(nd, c->id.w[l], GRAPH_R);
  use(nd, e, GRAPH_W);
  t->eng[l] = e;
}

static void emit_engram(struct ctx *c, struct tile *t, int l) {
  const struct plan_model *m = &c->p->model;
  if (t->eng[l] < 0) emit_engram_gather(c, t, l);
  int e = t->eng[l];
  struct graph_node *nd = add_node(c->g, GRAPH_ENGRAM, l, t);
  nd->aux = e;
  use(nd, t->x, GRAPH_RW);
  use(nd, e, GRAPH_R);
  use(nd, c->id.w[l], GRAPH_R);
  nd->flops = 2.0 * t->n * (m->hc_streams + 1.0) * m->hidden * engram_tables(m) * m->engram_head_dim;
}

/* Attention and MoE of layer l on tile t. write_kv: a KV source appends from
 * its own input (always for encoder sources; decoder sources only when CED
 * is off). */
static void emit_layer(struct ctx *c, struct tile *t, int l, bool write_kv) {
  const struct plan *p = c->p;
  const struct plan_model *m = &p->model;
  const struct plan_layer *L = &p->layer[l];
  struct graph *g = c->g;

  struct graph_node *nd = add_node(g, GRAPH_ATTN, l, t);
  nd->aux = t->pre;
  use(nd, t->x, GRAPH_RW);
  use(nd, t->pre, GRAPH_RW);
  use(nd, c->id.w[l], GRAPH_R);
  use(nd, c->id.ring[l], GRAPH_RW);
  /* Under serving.engram.prefetch the tile's first layer reads (waits for)
   * its prefetches on its stage: rows are fetched before it under every
   * StarPU policy, not only those that read priorities (docs/runtime.md,
   * "Engram tiers and prefetch"). */
  for (int j = 0; j < p->n_layers && !t->laid && p->serving.engram_prefetch; j++)
    if (t->eng[j] >= 0 && plan_stage_of(p, j) == plan_stage_of(p, l)) use(nd, t->eng[j], GRAPH_R);
  t->laid = true;
  mhc_flags(c, nd);
  if (t->r0 > 0) nd->flags |= GRAPH_F_REPLAY;
  if (plan_is_kv_source(L) && write_kv) {
    nd->flags |= GRAPH_F_WRITE_KV;
    use(nd, c->id.tail[l], GRAPH_RW);
    kv_append(c, nd, l, t->a + t->n);
  }
  if (plan_is_csa(L)) kv_read(c, nd, L->kv_src);
  if (plan_is_index_source(L)) key_reads(c, nd, t, l);
  if (plan_is_index_source(L)) {
    t->topk[l] = add_data(g, GRAPH_BUS, l, t->chunk, (int64_t)t->n * m->topk * 4, "L%d.topk %s", l, t->tag);
    use(nd, t->topk[l], GRAPH_W);
    nd->bus[GRAPH_TOPK_OUT] = t->topk[l];
  }
  if (L->cand == PLAN_CAND_BUILD) {
    nd->flags |= GRAPH_F_BUILD_POOL;
    t->pool[l] = add_data(g, GRAPH_BUS, l, t->chunk, (int64_t)t->n * m->cand_top_blocks * 4, "L%d.pool %s", l,
                          t->tag);
    use(nd, t->pool[l], GRAPH_W);
    nd->bus[GRAPH_POOL_OUT] = t->pool[l];
  }
  if (L->mode == PLAN_REINDEX && L->cand == PLAN_CAND_READ) {
    CEDAR_ASSERT(t->pool[L->pool_src] >= 0);
    use(nd, t->pool[L->pool_src], GRAPH_R);
    nd->bus[GRAPH_POOL_IN] = t->pool[L->pool_src];
  }
  if (L->mode == PLAN_REUSE) {
    CEDAR_ASSERT(t->topk[L->topk_src] >= 0);
    use(nd, t->topk[L->topk_src], GRAPH_R);
    nd->bus[GRAPH_TOPK_IN] = t->topk[L->topk_src];
  }
  nd->flops = attn_flops(p, L, t->n);

  nd = add_node(g, GRAPH_MOE, l, t);
  nd->aux = t->pre;
  use(nd, t->x, GRAPH_RW);
  use(nd, t->pre, GRAPH_RW);
  use(nd, c->id.w[l], GRAPH_R);
  nd->flops = moe_flops(m, t->n);
  mhc_flags(c, nd);
}

/* A tile's own activations: the residual streams and the mHC pre. */
static void tile_init(struct ctx *c, struct tile *t, int chunk, int64_t a, int n, int64_t r0, const char *tag) {
  memset(t, 0, sizeof(*t));
  t->chunk = chunk;
  t->a = a;
  t->n = n;
  t->r0 = r0;
  snprintf(t->tag, sizeof(t->tag), "%s", tag);
  const struct plan_model *m = &c->p->model;
  t->x = add_data(c->g, GRAPH_ACT, -1, chunk, x_bytes(m, n), "X %s", tag);
  t->pre = add_data(c->g, GRAPH_ACT, -1, chunk, (int64_t)n * m->hc_streams * 4, "pre %s", tag);
  c->g->data[t->x].a0 = c->g->data[t->pre].a0 = a;
  c->g->data[t->pre].pre = true;
  for (int l = 0; l < PLAN_MAX_LAYERS; l++) t->topk[l] = t->pool[l] = t->eng[l] = -1;
}

static void emit_head(struct ctx *c, struct tile *t, int64_t a, int n) {
  const struct plan_model *m = &c->p->model;
  int lg = add_data(c->g, GRAPH_ACT, -1, t->chunk, (int64_t)n * m->vocab * 4, "logits %s", t->tag);
  struct tile h = *t;
  h.a = a;
  h.n = n;
  struct graph_node *nd = add_node(c->g, GRAPH_HEAD, -1, &h);
  nd->x = t->x;
  nd->aux = lg;
  c->g->out_rows += n;
  use(nd, t->x, GRAPH_R);
  if (m->hc_merge == PLAN_MERGE_CARRIED) { /* the last FFN's own pre (docs/model.md s2) */
    nd->pre = t->pre;
    use(nd, t->pre, GRAPH_R);
  }
  use(nd, c->id.w_model, GRAPH_R);
  use(nd, lg, GRAPH_W);
  nd->flops = 2.0 * n * m->vocab * m->hidden;
}

/* The Engram prefetches of layers [lo, hi) not yet emitted for the tile. */
static void emit_prefetch(struct ctx *c, struct tile *t, int lo, int hi) {
  for (int l = lo; l < hi && c->p->serving.engram_prefetch; l++)
    if (c->p->layer[l].engram && t->eng[l] < 0) emit_engram_gather(c, t, l);
}

/* Layers [lo, hi) of a tile, the Engram prefetches of the range first. KV sources append
 * from their own input where their region's flag says so: encoder sources
 * unless the tile replays cached positions, decoder sources only without
 * CED (under CED dec_kv appends for them). */
static void emit_layers(struct ctx *c, struct tile *t, int lo, int hi, bool write_enc, bool write_dec) {
  emit_prefetch(c, t, lo, hi);
  for (int l = lo; l < hi; l++) {
    if (c->p->layer[l].engram) emit_engram(c, t, l);
    emit_layer(c, t, l, c->p->layer[l].region == PLAN_ENCODER ? write_enc : write_dec);
  }
}

/* Under CED: the tile's encoder outputs into the request's ring. */
static void emit_keep_xe(struct ctx *c, struct tile *t) {
  struct graph_node *nd = add_node(c->g, GRAPH_KEEP_XE, -1, t);
  nd->pre = t->pre;
  use(nd, t->x, GRAPH_R);
  use(nd, t->pre, GRAPH_R);
  use(nd, c->id.xe, GRAPH_RW);
}

/* Under CED: every decoder KV source appends the tile's entries, projected
 * from the encoder output (docs/model.md s3.1). */
static void emit_dec_kv(struct ctx *c, struct tile *t) {
  const struct plan_model *m = &c->p->model;
  for (int l = c->first_dec; l < c->p->n_layers; l++) {
    if (!plan_is_kv_source(&c->p->layer[l])) continue;
    struct graph_node *nd = add_node(c->g, GRAPH_DEC_KV, l, t);
    nd->pre = t->pre;
    use(nd, t->x, GRAPH_R);
    use(nd, t->pre, GRAPH_R);
    use(nd, c->id.w[l], GRAPH_R);
    use(nd, c->id.tail[l], GRAPH_RW);
    kv_append(c, nd, l, t->a + t->n);
    nd->flops = 2.0 * t->n * ((double)m->hc_streams * m->hidden * (2 + m->hc_streams) * m->hc_streams + 2.0 * m->hidden * m->head_dim);
  }
}

/* ---- transfers (prefill and decode on different homes, SPEC 7) ----------- */

/* One TRANSFER node: data object src, at the prefill's home, copied to its
 * twin *dst at the decode side's home (created on first use). Its edges come
 * from the accesses like every node's: it reads src after the writes it
 * ships, and the writes of one twin chain in order. */
static void emit_transfer(struct ctx *c, struct tile *t, int src, int *dst) {
  struct graph *g = c->g;
  struct graph_data sd = g->data[src]; /* a copy: add_data may move g->data */
  if (*dst < 0) {
    *dst = add_data(g, sd.kind, sd.layer, -1, sd.bytes, "%s@D", sd.name);
    g->data[*dst].state = g->data[src].state;
    g->data[*dst].home = g->peer;
  }
  struct graph_node *nd = add_node(g, GRAPH_TRANSFER, g->data[src].layer, t);
  nd->x = -1;
  nd->xfer_src = src;
  nd->xfer_dst = *dst;
  snprintf(nd->name, sizeof nd->name, "xfer %.18s %s", g->data[src].name, t->tag);
  use(nd, src, GRAPH_R);
  use(nd, *dst, GRAPH_W);
  if (sd.state == GRAPH_ST_KV) { /* ships the entries committed since its previous transfer */
    struct graph_use *w = use_of(nd, *dst);
    use_of(nd, src)->e_read = w->e_w1 = c->kv_entries[sd.layer];
    w->e_w0 = c->kv_shipped[sd.layer];
    c->kv_shipped[sd.layer] = w->e_w1;
  }
  g->n_transfer++;
}

static bool needs_transfer(const struct ctx *c) { return !graph_place_eq(c->g->place, c->g->peer); }

/* After a prefill tile that appended global entries: stream each KV
 * source's new entries to the decode side while later tiles compute. */
static void emit_kv_stream(struct ctx *c, struct tile *t) {
  for (int l = 0; l < c->p->n_layers && needs_transfer(c); l++)
    if (plan_is_kv_source(&c->p->layer[l])) emit_transfer(c, t, c->id.kv[l], &c->id.kv_dst[l]);
}

/* At the end of a prefill: the small per-request state once (SWA rings,
 * compressor tails, the token history, the kept encoder outputs). */
static void emit_state_handoff(struct ctx *c, struct tile *t) {
  if (!needs_transfer(c)) return;
  int dst;
  bool dec_on_d = c->p->serving.pd_replay == PLAN_REPLAY_ON_DECODE;
  for (int l = 0; l < c->p->n_layers; l++) {
    dst = -1;
    if (!(dec_on_d && c->ced && l >= c->first_dec)) /* D rebuilds the decoder rings by its replay */
      emit_transfer(c, t, c->id.ring[l], &dst);
    if (c->id.tail[l] < 0) continue;
    dst = -1;
    emit_transfer(c, t, c->id.tail[l], &dst);
  }
  dst = -1;
  emit_transfer(c, t, c->id.tokens, &dst);
  if (c->id.xe < 0) return;
  dst = -1;
  emit_transfer(c, t, c->id.xe, &dst);
}

/* ---- flows --------------------------------------------------------------- */

static void ctx_init(struct ctx *c, struct graph *g, const struct plan *p, enum graph_flow flow) {
  memset(g, 0, sizeof(*g));
  g->plan = p;
  g->flow = flow;
  g->place = graph_place_of(p, flow);
  g->peer = flow == GRAPH_DECODE ? g->place : graph_place_of(p, GRAPH_DECODE);
  memset(c, 0, sizeof(*c));
  c->g = g;
  c->p = p;
  c->ced = p->serving.ced;
  c->keys_short = -1;
  c->first_dec = p->n_layers;
  for (int l = 0; l < p->n_layers; l++)
    if (p->layer[l].region == PLAN_DECODER) {
      c->first_dec = l;
      break;
    }
  c->id.w_model = add_data(g, GRAPH_WEIGHTS, -1, -1, 0, "W model");
  c->id.tokens = add_data(g, GRAPH_STATE, -1, -1, 0, "tokens");
  g->data[c->id.tokens].state = GRAPH_ST_TOKENS;
  c->id.xe = -1;
  if (c->ced && c->first_dec < p->n_layers) {
    c->id.xe = add_data(g, GRAPH_STATE, -1, -1, 0, "XE ring");
    g->data[c->id.xe].state = GRAPH_ST_XE;
  }
  for (int l = 0; l < p->n_layers; l++) {
    c->id.w[l] = add_data(g, GRAPH_WEIGHTS, l, -1, 0, "W L%d", l);
    c->id.ring[l] = add_data(g, GRAPH_STATE, l, -1, 0, "L%d.ring", l);
    g->data[c->id.ring[l]].state = GRAPH_ST_RING;
    c->id.tail[l] = c->id.kv[l] = c->id.kv_dst[l] = -1;
    if (!plan_is_kv_source(&p->layer[l])) continue;
    c->id.tail[l] = add_data(g, GRAPH_STATE, l, -1, 0, "L%d.tail", l);
    g->data[c->id.tail[l]].state = GRAPH_ST_TAIL;
    c->id.kv[l] = add_data(g, GRAPH_STATE, l, -1, 0, "L%d.kv", l);
    g->data[c->id.kv[l]].state = GRAPH_ST_KV;
  }
}

/* The embedding of a tile's tokens into its residual streams. */
static void emit_embed(struct ctx *c, struct tile *t) {
  struct graph_node *nd = add_node(c->g, GRAPH_EMBED, -1, t);
  use(nd, c->id.tokens, GRAPH_R);
  use(nd, c->id.w_model, GRAPH_R);
  use(nd, t->x, GRAPH_W);
  use(nd, t->pre, GRAPH_W);
  nd->aux = t->pre;
}

/* The tiles of one prefill whose streams REPLAY_IN may read. */
struct xlist {
  int *x, *pre;
  int64_t *a;
  int *n, count;
};

/* One tile of positions [a, a + len) through layers [0, hi) (plus, under
 * CED, the decoder-global projection). write: the tile is new to the global
 * KV (not an encoder replay of cached positions). */
static void emit_prefix_tile(struct ctx *c, struct xlist *xs, const char *kind, int k, int64_t a, int len,
                             int64_t r0, int hi, bool dense, bool write, bool head_all, bool head_last) {
  char tag[16];
  snprintf(tag, sizeof(tag), "%s%d", kind, k);
  struct tile t;
  tile_init(c, &t, k, a, len, r0, tag);
  xs->x[xs->count] = t.x;
  xs->pre[xs->count] = t.pre;
  xs->a[xs->count] = a;
  xs->n[xs->count++] = len;
  emit_prefetch(c, &t, 0, hi);
  emit_embed(c, &t);
  emit_layers(c, &t, 0, hi, write, write && dense);
  if (dense) {
    if (head_all)
      emit_head(c, &t, a, len);
    else if (head_last)
      emit_head(c, &t, a + len - 1, 1);
  } else {
    emit_keep_xe(c, &t);
    if (write) emit_dec_kv(c, &t);
  }
  if (write) emit_kv_stream(c, &t);
}

/* Check the options against the plan and fill the derived lengths. */
static int prefill_opts(const struct plan *p, int64_t n, const struct graph_opts *o, int *chunk, int64_t *replay,
                        int64_t *hit, int64_t *e0, char *err, size_t err_len) {
  *chunk = o && o->chunk > 0 ? o->chunk : p->serving.prefill_chunk;
  *hit = o ? o->hit : 0;
  if (n < 1) {
    snprintf(err, err_len, "a prefill needs at least one token (got %lld)", (long long)n);
    return CEDAR_EINVAL;
  }
  if (*chunk < 1) {
    snprintf(err, err_len, "--chunk must be at least 1 (got %d)", *chunk);
    return CEDAR_EINVAL;
  }
  if (*hit < 0 || *hit > n) {
    snprintf(err, err_len, "a prefix hit of %lld tokens does not fit a prompt of %lld", (long long)*hit, (long long)n);
    return CEDAR_EINVAL;
  }
  if (plan_hit_check(p, *hit, o && o->swa_hit, err, err_len)) return CEDAR_EINVAL;
  *replay = o && o->replay >= 0 ? o->replay : p->serving.replay_decoder; /* resolved by plan_load */
  int64_t er = o && o->has_replay_encoder ? o->replay_encoder : p->serving.replay_encoder;
  *e0 = *hit == 0 || (o && o->swa_hit) ? *hit : (*hit > er ? *hit - er : 0);
  return 0;
}

int graph_build_prefill(struct graph *g, const struct plan *p, int64_t n, const struct graph_opts *o, char *err,
                        size_t err_len) {
  int chunk;
  int64_t replay, hit, e0;
  memset(g, 0, sizeof(*g));
  int rc = prefill_opts(p, n, o, &chunk, &replay, &hit, &e0, err, err_len);
  if (rc) return rc;
  struct ctx c;
  ctx_init(&c, g, p, p->serving.ced ? GRAPH_PREFILL_CED : GRAPH_PREFILL_DENSE);
  if (o && o->at_decode) { /* D's own flow: one home, no transfers */
    g->place = g->peer;
    for (int d = 0; d < g->n_data; d++) g->data[d].home = g->place;
  }
  bool dense = !c.ced || c.first_dec == p->n_layers;
  /* P/D with the replay on D: P's prefill ends with the encoder and the
   * decoder-global projection; D replays (at_decode) */
  bool replay_on_d = !dense && p->serving.pd_replay == PLAN_REPLAY_ON_DECODE && needs_transfer(&c);
  g->n_prompt = n;
  g->chunk = chunk;
  g->hit = hit;
  g->encoder_start = e0;
  g->replay = dense ? 0 : (replay < n ? replay : n);
  if (!dense && g->replay < 1) {
    snprintf(err, err_len, "the decoder replay must cover at least the last position under CED (got %lld): the "
             "first token's logits come from the decoder", (long long)replay);
    free(g->data);
    memset(g, 0, sizeof(*g));
    return CEDAR_EINVAL;
  }
  int hi = dense ? p->n_layers : c.first_dec;
  bool all = o && o->all_logits;
  /* A prefix hit attaches the entries of [0, hit); a P->D stream still
   * ships them from entry 0 (the decode side gets the attached prefix too). */
  for (int l = 0; l < p->n_layers; l++)
    if (plan_is_kv_source(&p->layer[l])) c.kv_entries[l] = hit / p->layer[l].ratio;
  c.fw_a = hit, c.fw_end = n; /* the vendor's prefill forward (slot_at) */

  /* Encoder (every layer when dense): replay of cached positions [e0, hit)
   * with global writes off (an SWA-snapshot miss), then the new [hit, n). */
  int cap = (int)((hit - e0 + chunk - 1) / chunk + (n - hit + chunk - 1) / chunk) + 1;
  struct xlist xs = {cedar_xmalloc(sizeof(int) * cap), cedar_xmalloc(sizeof(int) * cap),
                     cedar_xmalloc(sizeof(int64_t) * cap), cedar_xmalloc(sizeof(int) * cap), 0};
  int k = 0;
  for (int64_t a = e0; a < hit; a += chunk, k++)
    emit_prefix_tile(&c, &xs, "er", k, a, (int)(hit - a < chunk ? hit - a : chunk), e0, hi, dense, false, false,
                     false);
  k = 0;
  for (int64_t a = hit; a < n; a += chunk, k++) {
    int len = (int)(n - a < chunk ? n - a : chunk);
    emit_prefix_tile(&c, &xs, "c", k, a, len, e0, hi, dense, true, all, a + len == n);
  }
  if (!dense && !replay_on_d) {
    /* The decoder's bounded replay of [n - R, n), chunked like the prompt.
     * Rows before e0 (a prefix hit with its encoder SWA restored) come from
     * the encoder outputs kept with the cache entry. */
    int64_t r0 = n - g->replay;
    k = 0;
    for (int64_t a = r0; a < n; a += chunk, k++) {
      int len = (int)(n - a < chunk ? n - a : chunk);
      char tag[16];
      snprintf(tag, sizeof(tag), "rp%d", k);
      struct tile t;
      tile_init(&c, &t, k, a, len, r0, tag);
      struct graph_node *nd = add_node(g, GRAPH_REPLAY_IN, -1, &t);
      nd->aux = t.pre;
      if (a < e0) use(nd, c.id.xe, GRAPH_R);
      for (int i = 0; i < xs.count; i++)
        if (xs.a[i] < a + len && a < xs.a[i] + xs.n[i]) {
          use(nd, xs.x[i], GRAPH_R);
          use(nd, xs.pre[i], GRAPH_R);
        }
      use(nd, t.x, GRAPH_W);
      use(nd, t.pre, GRAPH_W);
      int first_node = g->n_node;
      emit_layers(&c, &t, c.first_dec, p->n_layers, false, false);
      for (int i = first_node; k == 0 && i < g->n_node; i++)
        if (g->node[i].op == GRAPH_ATTN) g->node[i].flags |= GRAPH_F_RING_RESET;
      if (all)
        emit_head(&c, &t, a, len);
      else if (a + len == n)
        emit_head(&c, &t, n - 1, 1);
    }
  }
  free(xs.x);
  free(xs.pre);
  free(xs.a);
  free(xs.n);
  if (c.keys_short >= 0) { /* plan_check's rules keep a prefill's slot rows committed; a broken rule says so */
    snprintf(err, err_len, "prefill: under model.indexer.key_slot: vendor position %lld scores slot keys not yet "
             "committed (a plan the checks missed)", (long long)c.keys_short);
    graph_free(g);
    return CEDAR_EINVAL;
  }
  struct tile end;
  memset(&end, 0, sizeof end);
  end.chunk = k;
  end.a = n;
  end.x = end.pre = -1;
  snprintf(end.tag, sizeof end.tag, "end");
  emit_state_handoff(&c, &end);
  graph__place_stages(g);
  graph__finish(g);
  return 0;
}

int graph_build_decode(struct graph *g, const struct plan *p, int64_t pos, char *err, size_t err_len) {
  return graph_build_verify(g, p, pos, 1, err, err_len);
}

int graph_verify_rows_max(const struct plan *p, int64_t pos) {
  bool two = false;
  for (int l = 0; l < p->n_layers; l++) two |= plan_is_kv_source(&p->layer[l]) && p->layer[l].ratio > 1;
  if (p->model.idx_key_slot != PLAN_KEY_SLOT_VENDOR || !two || pos + 1 >= p->model.window) return p->model.window;
  return (int)(pos + 1);
}

int graph_build_verify(struct graph *g, const struct plan *p, int64_t pos, int n, char *err, size_t err_len) {
  if (pos < 0 || n < 1 || n > p->model.window) {
    snprintf(err, err_len, "a decode step needs a position >= 0 (got %lld) and 1 to window (%d) rows (got %d)",
             (long long)pos, p->model.window, n);
    return CEDAR_EINVAL;
  }
  struct ctx c;
  ctx_init(&c, g, p, GRAPH_DECODE);
  g->n_prompt = pos;
  g->chunk = n;
  for (int l = 0; l < p->n_layers; l++)
    if (plan_is_kv_source(&p->layer[l])) c.kv_entries[l] = pos / p->layer[l].ratio;
  struct tile t;
  tile_init(&c, &t, 0, pos, n, 0, "dec");
  emit_prefetch(&c, &t, 0, p->n_layers); /* step t+1's rows as soon as token t is known */
  emit_embed(&c, &t);
  if (c.ced && c.first_dec < p->n_layers) {
    emit_layers(&c, &t, 0, c.first_dec, true, false);
    emit_keep_xe(&c, &t);
    emit_dec_kv(&c, &t);
    emit_layers(&c, &t, c.first_dec, p->n_layers, true, false);
  } else {
    emit_layers(&c, &t, 0, p->n_layers, true, true);
  }
  emit_head(&c, &t, pos, n);
  if (c.keys_short >= 0) { /* docs/model.md s3.2: decoding one position at a time would have them */
    snprintf(err, err_len, "a verify step of %d rows at position %lld: under model.indexer.key_slot: vendor row %lld "
             "scores keys its step would read from the previous step, which this tile has not computed; verify at "
             "most %lld rows here", n, (long long)pos, (long long)c.keys_short, (long long)(pos + 1));
    graph_free(g);
    return CEDAR_EINVAL;
  }
  graph__place_stages(g);
  graph__finish(g);
  return 0;
}

void graph_free(struct graph *g) {
  for (int k = 0; k < g->n_node; k++) {
    free(g->node[k].use);
    free(g->node[k].dep);
  }
  free(g->node);
  free(g->data);
  memset(g, 0, sizeof(*g));
}

int graph_count_op(const struct graph *g, enum graph_op op, int layer) {
  int k = 0;
  for (int i = 0; i < g->n_node; i++)
    if (g->node[i].op == op && (layer < 0 || g->node[i].layer == layer)) k++;
  return k;
}

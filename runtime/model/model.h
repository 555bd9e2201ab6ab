/* model.h: the forward of docs/model.md as op groups, one per graph node
 * kind (scheduler/graph.h): embed, Engram rows and injection, the attention
 * sublayer, the MoE sublayer, the decoder-global projection (CED), and the
 * head. Each runs on a tile of n consecutive positions of one request and is
 * a sequence of ops/ calls; every executor (direct, StarPU) calls exactly
 * these, so they compute the same bits.
 *
 * struct rt_model binds a plan to its weights once: per-layer pointers into
 * the weights (looked up by docs/weights.md names), RoPE tables, the Engram
 * tables and multipliers, the op configs.
 *
 * mHC (docs/model.md s2): a sublayer node computes its own pre, post and C
 * from its input state with its own fn; it mixes with the pre carried in the
 * tile's `pre` buffer (pairing v41: the embedding's one-hot, then the previous
 * sublayer's own) and, with GRAPH_F_PRE_NEXT, leaves its own there for the
 * next sublayer or the head; with GRAPH_F_RESTART (pairing v4) it mixes with
 * its own.
 *
 * Errors: a pool that runs out of pages fails the node with CEDAR_ENOMEM
 * (the request fails, the process goes on); everything else is checked
 * before the run (weights against the plan, token ids against the vocab).
 * Not here: scheduling (runtime/exec/exec_direct.c), state layout (state.h).
 * Test: tests/test_model_*.c, and against the oracle: tests/cli/oracle_run.sh.
 */
#ifndef CEDAR_RUNTIME_MODEL_H
#define CEDAR_RUNTIME_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/engram.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/rope.h"
#include "runtime/model/arena.h"
#include "runtime/model/state.h"
#include "runtime/load/weights.h"
#include "scheduler/graph.h"

struct rt_layer {
  const struct plan_layer *pl;
  const float *attn_norm, *ffn_norm;
  const float *hc_fn[2], *hc_scale[2], *hc_base[2]; /* [0] attention, [1] MoE */
  /* The linears as views (ops/qweight.h): each in its held format
   * (runtime/load/weights.h), F32 views with --weights-format f32. */
  struct op_qweight wq_a, wq_b, wkv, wo_a, wo_b;
  const float *q_norm, *kv_norm, *sink;
  struct op_qweight iq_b;          /* index sources */
  const float *iw;
  struct op_comp_layer comp;       /* KV sources */
  struct op_moe_weights moe;       /* its views in moe.q (has_q) */
  const struct op_rope *rope;      /* rope_swa or rope_csa */
  /* Engram layers */
  int e_module;
  const uint8_t *e_table;
  const uint8_t *e_scales; /* a checkpoint's table in the mmap tier: e_table its values, these its scales */
  int64_t e_rows;
  struct op_qweight e_wkv;
  const float *e_qw, *e_kw;
  uint64_t e_mult[64];
};

struct rt_dev_ctx;

struct rt_model {
  const struct plan *p;
  const struct weights *w;
  struct rt_layer *L;              /* (n_layers) */
  struct op_qweight embed, lm_head; /* (vocab, hidden) views */
  const float *norm;
  const float *head_fn, *head_scale, *head_base; /* learned merge only */
  struct op_rope rope_swa, rope_csa, rope_idx;
  struct op_mhc_cfg mhc;
  struct op_moe_cfg moe;
  struct op_engram_tables eng;
  int32_t *cmap;                   /* (vocab) Engram compressed ids */
  const char *cmap_source;         /* where cmap came from, for reports */
  int e_max_order, e_tables;
  int first_dec;                   /* first decoder layer, n_layers when none */
  float eps, tau, idx_scale;
  struct op_kv_format swa_fmt;     /* plan formats.swa */
  size_t swa_bytes;                /* one SWA entry */
  /* The device home's state, weights and CUDA graphs (runtime/device/devbind.h),
   * set by the engine when nodes run on CUDA; NULL: the host request's. */
  struct rt_dev_ctx *dev;
};

/* The MoE weights of `<prefix>.<idx>.ffn.*` (layers.l or mtp.k) as views
 * (moe->has_q; bias as floats); shared: the plan has a shared expert. */
void rt_bind_moe(const struct weights *w, const char *prefix, int idx, bool shared, struct op_moe_weights *moe);

/* Bind p to w (w checked against p). Returns 0, or CEDAR_EUNSUPPORTED /
 * CEDAR_EINVAL / CEDAR_ENOMEM with a message. */
int rt_model_init(struct rt_model *M, const struct plan *p, const struct weights *w, char *err, size_t err_len);
void rt_model_free(struct rt_model *M);

/* Replace the Engram token map (id mod compressed_vocab after init) by a
 * tokenizer's: map (n ids, n_distinct keys; runtime/model/engram_map.h builds it).
 * Refused with err when n_distinct != model.engram.compressed_vocab (a
 * tokenizer that is not the checkpoint's) or the pad id is past the map.
 * Ids past n take the pad's compressed id [cedar]. source (static string)
 * names the map in reports (M->cmap_source). No Engram layer: a no-op. */
int rt_model_set_cmap(struct rt_model *M, const int32_t *map, int n, int n_distinct, const char *source, char *err,
                      size_t err_len);

/* h (n, hidden) = the embedding rows of tok (decoded from the held format);
 * the index of the first id outside the vocabulary, or -1. */
int rt_embed_rows(const struct rt_model *M, float *h, const int32_t *tok, int n);
/* X (n, hc, d) = every stream the embedding of tok; pre (n, hc) = the
 * one-hot (1, 0, ..., 0) layer 0's attention mixes with. Token ids are
 * checked by the caller. */
void rt_embed(const struct rt_model *M, float *X /* (n, hc, d) */, float *pre /* (n, hc) */,
              const int32_t *tok /* (n) */, int n, struct rt_arena *ar);
/* Engram rows of layer l for positions [a, a + n) of r's tokens:
 * e (n, tables * engram head_dim). Token ids only. */
void rt_engram_rows(const struct rt_model *M, int l, float *e, const struct rt_request *r, int64_t a, int n,
                    struct rt_arena *ar);
void rt_engram_inject(const struct rt_model *M, int l, float *X /* (n, hc, d) */, const float *e, int n,
                      struct rt_arena *ar);

/* The buses an attention node reads or writes (NULL where the layer has none). */
struct rt_buses {
  int32_t *topk_out;        /* (n, topk): index sources */
  int32_t *pool_out;        /* (n, top_blocks): the pool builder */
  const int32_t *topk_in;   /* (n, topk): reuse layers */
  const int32_t *pool_in;   /* (n, top_blocks): reindex layers reading a pool */
};

/* The request state a node works on, bound by the executor from the node's
 * data accesses (graph_node.use), never looked up from the plan: its SWA
 * ring, its compressor tail, the KV source it appends to and the one it
 * reads (with the entries the graph lets it see, and the pages as the
 * executor's data handles hand them over). */
struct rt_bound {
  struct rt_ring *ring;          /* or NULL */
  struct op_comp_tail *tail;     /* or NULL */
  struct rt_tail_log *tail_log;  /* the tail's log during a verify step (state.h), or NULL */
  struct rt_kv_seq *kv_w;        /* APPEND target, or NULL */
  int64_t kv_w_end;              /* its entries after this node */
  struct rt_kv_seq *kv_r;        /* the source read, or NULL */
  int64_t kv_r_end;              /* entries [0, kv_r_end) visible */
  const uint8_t *const *kv_r_pages; /* the pages to read them from, or NULL: kv_r's own table */
  /* model.indexer.key_slot: vendor (graph_node.key_src; docs/model.md s3.2):
   * the source whose Indexer-K the rows of class c score, or NULL: kv_r's;
   * its committed entries the graph declared, and its pages as above */
  struct rt_kv_seq *key_r[2];
  int64_t key_r_end[2];
  const uint8_t *const *key_r_pages[2];
  /* CUDA nodes (runtime/device/node_cuda.h): a device array of kv_w's device page
   * addresses covering kv_w_end entries, pages reserved before the node runs;
   * filled by the executor's binder (cudastate's side). CPU nodes: NULL. */
  const uint8_t *const *kv_w_pages;
};

/* The attention sublayer of node nd (GRAPH_ATTN) on X (n, hc, d) and the
 * tile's pre (n, hc), on the state st binds. Returns 0 or CEDAR_ENOMEM (KV
 * pages). */
int rt_attn(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, const struct rt_buses *b,
            const struct rt_bound *st, struct rt_arena *ar);
/* The attention sublayer of B decode nodes of B requests (nds[i]: request
 * i's node at its one position, all of one layer) on X (B, hc, d) and pre
 * (B, hc), row i request i's: the row-wise parts once over the B rows, the
 * rest on each request's state (st[i], buses b[i]) as rt_attn runs it alone.
 * rc[i]: 0 or CEDAR_ENOMEM (request i's KV pages); a failed row's state is
 * unusable, the others are unaffected. runtime/engine/batch.c calls it. */
void rt_attn_rows(const struct rt_model *M, const struct graph_node *const *nds, int B, float *X, float *pre,
                  const struct rt_buses *b, const struct rt_bound *st, int *rc, struct rt_arena *ar);
/* internal (model_topk.c): the Top-K node nd's n rows attend with, into b's
 * topk_out (or reuse's topk_in), from its normed input a_in (n, hidden),
 * q latent cq (n, q_rank), positions, the tile's RoPE angles, the entries
 * kv it may see and the key tensors st binds (key_slot: vendor). */
const int32_t *rt__select_topk(const struct rt_model *M, const struct graph_node *nd, const float *a_in, const float *cq,
                               const int64_t *pos, const struct op_rope_angles *ang, const struct op_kv_view *kv,
                               const struct rt_bound *st, const struct rt_buses *b, struct rt_arena *ar);
/* The MoE sublayer of node nd (GRAPH_MOE), in one op group. Returns 0. */
int rt_moe(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, struct rt_arena *ar);
/* The same sublayer in the expert-parallel split (scheduler/graph_ep.c,
 * runtime/dist/expert_par.h): the route reads X and pre and gives the input x
 * (n, d), the shared expert's output y (n, d), the selection sel and
 * weights wt (n, k) and the mHC post (n, hc) and C (n, hc, hc); the finish
 * takes y with the routed outputs added and updates X. Together they
 * compute rt_moe's bits (op_moe_forward's steps, in its order). */
void rt_moe_route(const struct rt_model *M, const struct graph_node *nd, float *X, float *pre, float *x, float *y,
                  int32_t *sel, float *wt, float *post, float *C, struct rt_arena *ar);
void rt_moe_finish(const struct rt_model *M, const struct graph_node *nd, float *X, const float *post,
                   const float *C, float *y, const int32_t *sel, struct rt_arena *ar);
/* Decoder KV source l appends the entries of positions [a, a + n) projected
 * from the encoder output XE (n, hc, d) and the pre it carries (n, hc)
 * (docs/model.md s3.1: the first decoder layer's own attention input) to
 * st->kv_w through st->tail. */
int rt_dec_kv(const struct rt_model *M, const struct rt_bound *st, int l, const float *XE, const float *pre,
              int64_t a, int n, struct rt_arena *ar);
/* logits (n, vocab) of the final states X (n, hc, d); pre (n, hc): the
 * carried pre (merge: carried), else unused. */
void rt_head(const struct rt_model *M, float *logits, const float *X, const float *pre, int n, struct rt_arena *ar);

#endif

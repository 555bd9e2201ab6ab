/* plan.h: the typed execution plan, cedar's one configuration struct.
 *
 * A plan is loaded from YAML (plan_yaml.c: syntax and `extends`; plan_load.c:
 * keys and types; plan_check.c: semantic rules and derived ownership), then is
 * read-only. Every value that SPEC marks [R] or [R-cfg] is a field here with
 * SPEC's default. Layer numbers are never hard-coded elsewhere: code asks the
 * plan which layer owns which bus.
 *
 * Not here: weights, request state, graphs (runtime/, scheduler/compile_*).
 * Tests: tests/test_plan_load.c, tests/test_plan_rules.c, tests/test_plan_cost.c.
 */
#ifndef CEDAR_PLAN_H
#define CEDAR_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/formats.h"
#include "ops/rope.h"

#define PLAN_MAX_LAYERS 1024
#define PLAN_MAX_ORDERS 8
#define PLAN_MAX_TARGETS 8

/* Where a value came from, for error messages: file:line:col (1-based). */
struct plan_mark {
  const char *file; /* interned in the plan's string arena; NULL = default */
  int line, col;
};

enum plan_region { PLAN_ENCODER = 0, PLAN_DECODER = 1 };
enum plan_mode { PLAN_SWA_ONLY = 0, PLAN_FULL, PLAN_REINDEX, PLAN_REUSE };
enum plan_cand { PLAN_CAND_NONE = 0, PLAN_CAND_BUILD, PLAN_CAND_READ };

/* Storage format of one cache class: element type, scale type, values per scale. */
enum plan_elem { PLAN_E2M1 = 0, PLAN_E4M3, PLAN_BF16, PLAN_F32 };
enum plan_scale { PLAN_SCALE_NONE = 0, PLAN_SCALE_E4M3, PLAN_SCALE_E8M0, PLAN_SCALE_F32 };
/* How a block's scale is chosen (docs/formats.md s3): AUTO is the vendor's
 * rule for the scale type (rne for e4m3, ceil for e8m0, the float quotient
 * for f32); plan checking resolves it. */
enum plan_scale_rule { PLAN_RULE_CEIL = 0, PLAN_RULE_OCP, PLAN_RULE_RNE, PLAN_RULE_ROUNDUP, PLAN_RULE_AUTO };

struct plan_format {
  enum plan_elem elem;
  enum plan_scale scale;
  int block;                 /* values per scale */
  enum plan_scale_rule rule; /* scale choice (ceil/ocp for e8m0, rne/roundup for e4m3) */
  double floor;              /* scale_floor (rne, ceil); < 0: the vendor's (plan checking resolves it) */
  bool bf16_round;           /* round values to bf16 before quantizing (vendor: true) */
};

/* A RoPE block of the plan (model.rope.swa, model.rope.csa) is the ops'
 * parameter struct, so the plan hands it to op_rope_init_params as it is;
 * its defaults are op_rope_params_swa and op_rope_params_csa. */

struct plan_model {
  int n_layers;
  int hidden;
  int vocab;
  double norm_eps;

  /* attention (SPEC 1.1, 3.5, 3.12) */
  int heads, head_dim, rope_dim, q_rank;
  bool q_head_norm;
  int o_groups, o_rank;
  double softmax_scale; /* 0 = 1/sqrt(head_dim) */
  bool sink;
  struct op_rope_params rope_swa; /* SWA-only layers */
  struct op_rope_params rope_csa; /* ratio-1 and ratio-2 layers */

  /* lightning indexer (SPEC 3.10-3.11) */
  int idx_heads, idx_head_dim, idx_rope_dim;
  bool idx_rope_last; /* rope dims are the last idx_rope_dim of idx_head_dim */
  bool idx_k_norm;
  bool idx_q_mxfp4;   /* round-trip qI through MXFP4 before scoring (Appendix V #11) */
  /* the Indexer-K an index layer scores (Appendix V #25, docs/model.md s3.2):
   * vendor = one shared slot a KV source republishes only on a tile that
   * completes a group; own_source = each layer its KV source's own keys */
  enum { PLAN_KEY_SLOT_VENDOR = 0, PLAN_KEY_SLOT_OWN } idx_key_slot;
  int topk;
  int window;
  int cand_block, cand_top_blocks;
  bool cand_pin_newest; /* the newest visible block always in the pool (Appendix V #12) */

  /* model.numerics: where activations are rounded (Appendix V #22; docs/model.md s7) */
  bool num_act_bf16;    /* activations: bf16 = the residual streams X rounded to bf16 after every update */
  bool num_io_bf16;     /* sublayer_io: bf16 = a sublayer's mixed input, normed input and output rounded */
  bool num_lin_mxfp8;   /* linear_inputs: mxfp8 = an FP8 linear's input through E4M3 + E8M0 per 32 */

  /* MoE (SPEC 1.2, 3.13) */
  int n_routed, n_shared, n_active, moe_inter, shared_inter;
  enum { PLAN_SCORE_SQRTSOFTPLUS = 0, PLAN_SCORE_SOFTMAX, PLAN_SCORE_SIGMOID } moe_score;
  bool moe_norm_topk;
  double route_scale, swiglu_limit;

  /* mHC (SPEC 1.3, 3.14) */
  int hc_streams, hc_sinkhorn_iters;
  double hc_eps;
  /* which pre each sublayer mixes with (docs/model.md s2): v41 = the vendor's
   * carried ("delayed") pre, v4 = every sublayer's own pre from its own state */
  enum { PLAN_PAIRING_V41 = 0, PLAN_PAIRING_V4 } hc_pairing;
  /* the streams' collapse before the head: carried = the last FFN's own pre
   * (v41), learned = head.hc.* (v4), sum */
  enum { PLAN_MERGE_CARRIED = 0, PLAN_MERGE_LEARNED, PLAN_MERGE_SUM } hc_merge;

  /* Engram (SPEC 1.4, 3.15) */
  int engram_n_orders;
  int engram_orders[PLAN_MAX_ORDERS];
  int engram_heads, engram_head_dim;
  int64_t engram_table_base; /* primes start above this - 1 (engram_vocab_size) */
  int engram_compressed_vocab, engram_pad_id; /* pad_id: engram_pad_token_id, a token id (pad = cmap[pad_id]) */
  enum { PLAN_ENGRAM_MULT_NUMPY = 0, PLAN_ENGRAM_MULT_SPLITMIX64 } engram_mult; /* Appendix V #18 / cedar's older */
  uint64_t engram_seed;                         /* splitmix64 only */

  /* DSpark (SPEC 1.5, 3.16) */
  int dspark_blocks, dspark_window, dspark_draft, dspark_markov_rank;
  int dspark_experts, dspark_active, dspark_noise_token;
  int dspark_n_targets;
  int dspark_targets[PLAN_MAX_TARGETS];

  /* vision (SPEC 1.6, 3.17) */
  int vit_layers, vit_hidden, vit_heads, vit_patch, vit_ffn, vit_unshuffle;
  int vit_proj_hidden, vit_max_tokens, image_token;

  /* storage formats (SPEC 4) */
  struct plan_format main_kv, indexer_k, swa;
  bool nibble_low_first;
};

struct plan_layer {
  int index;
  enum plan_region region;
  enum plan_mode mode;
  int ratio;       /* compress ratio; 0 for swa_only layers */
  int kv_src;      /* layer whose Main-KV/Indexer-K pool this layer reads; -1 none */
  int topk_src;    /* layer whose Top-K this layer reads; -1 none */
  int pool_src;    /* candidate-pool builder this layer reads; -1 none */
  enum plan_cand cand;
  bool engram;
  /* Where each value was set (the layer entry, or the override that changed it). */
  struct plan_mark mark, mark_mode, mark_ratio, mark_kv, mark_topk, mark_cand, mark_region;
  /* The last `layer_overrides` entry that changed the layer (file NULL: none):
   * a rule the layer breaks after it is blamed there, where the change was made. */
  struct plan_mark mark_override;
};

/* serving.placement.stages / experts / engram (scheduler/plan_place.c).
 * n_stages 0: every layer on the flow's own home (prefill / decode). */
#define PLAN_MAX_STAGES 16
#define PLAN_MAX_EP_RANKS 64
struct plan_stage {
  int lo, hi;                 /* layers [lo, hi] */
  int rank;
  int device;                 /* PLAN_DEV_CPU / PLAN_DEV_CUDA */
  int device_id;
  struct plan_mark mark, mark_rank, mark_device;
  /* P/D per stage ({layers: 0-13, prefill: 0, decode: 2}): rank is the
   * prefill home (the prefill graph's), decode the decode home. */
  bool pd;
  int decode;
  struct plan_mark mark_decode;
};
struct plan_placement {
  int n_stages;
  struct plan_stage stage[PLAN_MAX_STAGES];
  struct plan_mark mark_stages;
  int n_ep_ranks;             /* 0: each layer's experts live with its stage */
  int ep_rank[PLAN_MAX_EP_RANKS];
  bool ep_layer[PLAN_MAX_LAYERS]; /* the MoE layers whose routed experts are sharded */
  struct plan_mark mark_experts, mark_ep_rank[PLAN_MAX_EP_RANKS];
  /* P/D (experts: {prefill: [0, 2], decode: [1, 2]}): ep_rank holds the
   * prefill role's shards, ep_rank_d the decode role's. */
  bool ep_pd;
  int n_ep_ranks_d;
  int ep_rank_d[PLAN_MAX_EP_RANKS];
  struct plan_mark mark_ep_rank_d[PLAN_MAX_EP_RANKS];
  bool engram_set;            /* serving.placement.engram given */
  int engram_rank;
  enum { PLAN_ENGRAM_HOST = 0, PLAN_ENGRAM_FILE } engram_memory;
  struct plan_mark mark_engram;
};

struct plan_serving {
  bool ced;               /* causal encoder-decoder prefill; off = dense baseline */
  int replay_encoder;     /* encoder bounded replay on an SWA-snapshot miss */
  int replay_decoder;     /* decoder bounded replay on every prefill */
  int prefill_chunk;      /* tokens per prefill chunk */
  int page_tokens;        /* global KV page size in tokens (even) */
  int prefix_block_tokens;/* prefix-cache block size in tokens (even) */
  int64_t gpu_cache_bytes, host_cache_bytes;
  double global_ttl_hours;
  double swa_pool_fraction; /* of host DRAM */
  double swa_pool_ttl_s;
  /* serving.batch (continuous batching, docs/serving.md): at most
   * batch_max_requests requests run at once; one step runs at most
   * batch_step_tokens tokens (a decode row is one, a prefill chunk its
   * positions); a new request's prefill advances batch_chunk positions a
   * step. 0 in the file derives them: chunk = serving.prefill_chunk,
   * step_tokens = chunk + max_requests (one chunk beside every decode row). */
  int batch_max_requests, batch_step_tokens, batch_chunk;
  int prefill_rank, decode_rank;
  enum { PLAN_DEV_CPU = 0, PLAN_DEV_CUDA } prefill_device, decode_device;
  /* P/D (SPEC 7.6): where the decoder's bounded replay runs when prefill and
   * decode are on different homes; P ships the decoder rings, or D rebuilds
   * them from the kept encoder outputs P ships. */
  enum { PLAN_REPLAY_ON_PREFILL = 0, PLAN_REPLAY_ON_DECODE } pd_replay;
  int prefill_device_id, decode_device_id;
  /* Where each placement value was written (file NULL: the default), for
   * runtime/node/backend.h's refusals. */
  struct plan_mark mark_prefill_rank, mark_prefill_device, mark_decode_rank, mark_decode_device;
  /* serving.engram (scheduler/plan_engram.c, docs/runtime.md "Engram
   * tiers"): where the Engram tables live at run time. memory: with the
   * other weights; mmap: in a memory-mapped file (the weights file, or for
   * synthetic weights engram_file, NULL: derived), faulted in by the
   * prefetch tasks. Marks: file NULL = not written. */
  enum { PLAN_ENGRAM_TIER_MEMORY = 0, PLAN_ENGRAM_TIER_MMAP } engram_tier;
  char *engram_file;
  /* true (default): the row gathers are prefetches, emitted at the tile's
   * start and run first; false: each just before the layer that reads it */
  bool engram_prefetch;
  struct plan_mark mark_engram_tier;
  /* Layer and expert placement (scheduler/plan_place.c, docs/placement.md):
   * the pipeline stages, the routed experts' ranks, the Engram tables' home. */
  struct plan_placement place;
};

struct plan {
  char *name;
  char *description;
  const char *path; /* the file loaded (interned) */
  struct plan_model model;
  struct plan_serving serving;
  struct plan_layer layer[PLAN_MAX_LAYERS];
  int n_layers;
  /* internal: string arena for file names; owned by the plan */
  char **strings;
  size_t n_strings;
};

/* Diagnostics collected while loading: each is one "file:line:col: msg" line
 * plus an optional hint. Loading reports every error it can, not just the
 * first. */
struct plan_diag {
  bool warning;          /* a warning: the plan still loads (plan__warn) */
  struct plan_mark mark; /* mark.file points to `file`, owned by the diag */
  char *file;
  char *msg;
  char *hint;
};

struct plan_diags {
  struct plan_diag *d;
  size_t n, cap;
};

/* Load, merge `extends`, type-check and validate. Returns 0 and fills *out,
 * or a negative cedar_status with every problem in *diags. On failure *out is
 * left empty (nothing to free). `diags` may be NULL. */
int plan_load(const char *path, struct plan *out, struct plan_diags *diags);
/* Same, from a string (tests, fuzzing); `name` stands in for the file name and
 * `extends` resolves relative to the current directory. */
int plan_load_string(const char *name, const char *text, size_t len, struct plan *out,
                     struct plan_diags *diags);
void plan_free(struct plan *p);

void plan_diags_print(const struct plan_diags *diags, FILE *f);
void plan_diags_free(struct plan_diags *diags);

const char *plan_mode_name(enum plan_mode m);
const char *plan_region_name(enum plan_region r);
const char *plan_cand_name(enum plan_cand c);
const char *plan_elem_name(enum plan_elem e);
const char *plan_scale_name(enum plan_scale s);

/* Every value a plan file can set, walked from the same field tables that
 * load it (scheduler/plan_load.c), so a key added there is visited here
 * without another list: fn gets the dotted key ("model.swa.window"), the
 * value's bytes in the plan (an int, int64_t, double or bool as stored; an
 * integer list's items; a string's characters) and their length. Layers and
 * placement stages are not in the tables (read by hand): walk p->layer.
 * Used for the prefix cache's key (runtime/cache/kv_identity.h). */
typedef void (*plan_value_fn)(void *ctx, const char *key, const void *bytes, size_t n);
void plan_each_value(const struct plan *p, plan_value_fn fn, void *ctx);

/* Derived facts every consumer uses. */
static inline bool plan_is_csa(const struct plan_layer *l) { return l->mode != PLAN_SWA_ONLY; }
static inline bool plan_is_kv_source(const struct plan_layer *l) { return l->mode == PLAN_FULL; }
static inline bool plan_is_index_source(const struct plan_layer *l) {
  return l->mode == PLAN_FULL || l->mode == PLAN_REINDEX;
}
int plan_count_region(const struct plan *p, enum plan_region r);
double plan_softmax_scale(const struct plan *p);
/* The most positions a request may hold (prompt plus generated tokens): the
 * context RoPE is set up for, yarn_factor x yarn_original_len of the CSA
 * RoPE block when it has YaRN (1M for V4.1), else its yarn_original_len. */
int64_t plan_max_positions(const struct plan *p);
/* Whether a prefix hit of `hit` cached positions can resume (SPEC 6.5), the
 * one rule `cedar plan cost`, `cedar graph show` and the compiler share:
 * with the encoder-SWA snapshot at hit (path a, snapshot = true) any hit;
 * without it (path b) the hit must end on a whole group of every KV
 * source's ratio, because the tail of a partial group lives only in a
 * snapshot (encoder replay rebuilds the SWA window, not compressor tails).
 * Returns 0, or CEDAR_EINVAL with a message naming the layer. */
int plan_hit_check(const struct plan *p, int64_t hit, bool snapshot, char *err, size_t err_len);

/* Bytes of one stored vector of `width` values in format f (payload + scales). */
int64_t plan_format_bytes(const struct plan_format *f, int width);
int64_t plan_format_payload_bytes(const struct plan_format *f, int width);
/* The ops' format of a checked plan's cache class (rule and floor resolved). */
struct op_kv_format plan_kv_format(const struct plan_model *m, const struct plan_format *f);

#endif

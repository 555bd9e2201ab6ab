/* checkpoint.h: a checkpoint directory in the released DeepSeek-V4.1 layout
 * (docs/checkpoints.md): config.json, one or many safetensors shards with
 * model.safetensors.index.json, the released tensor names and dtypes.
 *
 * Loading maps every shard (runtime/load/safetensors.h checks each file's size
 * and each tensor's byte range against its header), checks the index (shard
 * names are plain file names in the directory, every entry is in the shard
 * it names and every shard tensor is in the index), verifies the per-tensor
 * content hashes a shard carries (`cedar.hash.<name>`, XXH3-64), and fills a
 * struct weights with cedar's internal tensors (runtime/load/weights.h) through
 * ONE mapping table (ckpt_map.c): F32 tensors of the same shape are used in
 * place in the mapping when 64-byte aligned; FP8 (E4M3 with E8M0 32x32 tile
 * scales), packed E2M1 experts (E8M0 per row group of 32) and BF16 are
 * dequantized to F32 at load (ckpt_load), or held in their stored formats
 * (ckpt_load_held: FP8 and BF16 in place, experts copied into FP4 stacks;
 * the engine's default); Engram tables are regrouped into cedar's rows
 * (E4M3 values then E8M0 scales), except under serving.engram.tier: mmap,
 * where each table stays in the shards' mappings as its two tensors (never
 * copied: struct weights' engram_scales, runtime/model/engram_tier.h) and its two
 * content hashes are not verified (that would read every row; `weights
 * check DIR` verifies them). `mtp.{k}.*` load as the DSpark drafter's
 * blocks k < model.dspark.blocks (the rows of every layer plus the drafter's
 * extras); drafter blocks past the plan's and vision tensors are recognised
 * and skipped with one counted note each. Every problem is collected, each
 * naming the file, the tensor and the reason; nothing is used from a
 * checkpoint with any problem.
 *
 * Writing (`cedar weights init --layout released`): synthetic weights
 * quantized into exactly that layout, sharded, with the index, config.json
 * (ckpt_config.h) and per-tensor hashes.
 *
 * Test: tests/test_checkpoint.c, tests/cli/checkpoint.sh.
 */
#ifndef CEDAR_RUNTIME_CHECKPOINT_H
#define CEDAR_RUNTIME_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/load/ckpt_config.h"
#include "runtime/load/safetensors.h"
#include "runtime/load/shards.h"
#include "runtime/load/weights.h"
#include "scheduler/plan.h"

#define CKPT_CONFIG "config.json"
#define CKPT_INDEX "model.safetensors.index.json"
#define CKPT_SINGLE "model.safetensors"
#define CKPT_INDEX_MAX_BYTES (256u << 20)
/* The tile of the FP8 block scales and the row group of the FP4 experts. */
#define CKPT_BLOCK 32


/* What a load did, for reports and `cedar bench model`. */
struct ckpt_load_stats {
  size_t n_shards, n_tensors;
  size_t skipped_mtp, skipped_vision;  /* recognised, not used by the plan (mtp: past its dspark.blocks) */
  size_t hashed, unhashed;             /* tensors whose content hash was verified / absent */
  size_t hash_skipped;                 /* the mmap tier's Engram tables: hash recorded, not read */
  uint64_t file_bytes, in_place_bytes, dequant_bytes, copied_bytes;
};

/* Read DIR/config.json and return the plan it implies (`plan_path` NULL),
 * or load plan_path and check it against the checkpoint: every mismatch
 * into pr (may be NULL), the count and the first in err, CEDAR_EFORMAT. */
int ckpt_plan(const char *dir, const char *plan_path, struct plan *p, struct weights_problems *pr, char *err,
              size_t err_len);

/* Fill w with plan p's tensors from the checkpoint in dir. Returns 0, or a
 * negative cedar_status with every problem in pr (may be NULL) and the count
 * and the first in err; w is then empty. stats may be NULL. verify_hashes
 * false skips the content hashes (`weights check --hash` records them). */
int ckpt_load(struct weights *w, const struct plan *p, const char *dir, bool verify_hashes,
              struct weights_problems *pr, struct ckpt_load_stats *stats, char *err, size_t err_len);
/* The same with stored true: each tensor held in its held format
 * (weights.h "held formats"; w->qw set), read from the shards' mappings in
 * place where it can be: FP8 linears (values and scales) and BF16 tensors
 * (one at an odd address copied) stay in the mappings, each layer's routed
 * experts (one released tensor per expert) are copied into one FP4 stack,
 * tensors held as F32 are dequantized or copied as ckpt_load does. No F32
 * arena for stored-quantized tensors. stats counts each (in_place_bytes,
 * copied_bytes, dequant_bytes). stored false: ckpt_load. */
int ckpt_load_held(struct weights *w, const struct plan *p, const char *dir, bool verify_hashes, bool stored,
                   struct weights_problems *pr, struct ckpt_load_stats *stats, char *err, size_t err_len);

/* Write w (synthetic F32 weights of plan p) as a released-layout checkpoint
 * into dir (created if missing; an existing checkpoint is replaced as a whole set,
 * its stale shards, single file or index removed: commit_stage in ckpt_write.c):
 * config.json, shards of about shard_bytes each (0: one shard,
 * model.safetensors, no index), the index, hashes in each shard's metadata.
 * When dequant_path is not NULL, also write the dequantized values as a
 * cedar weights file (the internal layout, weights_save), so a run on it
 * must equal a run on the checkpoint bit for bit. */
int ckpt_write(const struct weights *w, const struct plan *p, const char *dir, uint64_t shard_bytes,
               const char *dequant_path, char *err, size_t err_len);

/* `weights check --hash` on a checkpoint: add a content hash to every
 * tensor of every shard that has none (each shard rewritten atomically).
 * *added gets the count. */
int ckpt_record_hashes(const char *dir, size_t *added, char *err, size_t err_len);

/* ---- the mapping table (ckpt_map.c) ---------------------------------------- */

enum ckpt_conv {
  CKPT_FLOAT,   /* F32 or BF16, the same elements (a norm, the router, embed) */
  CKPT_FP8,     /* F8_E4M3 + `.scale` F8_E8M0 [ceil(rows/32), ceil(cols/32)], 2-D (wo_a: cedar's 3-D view) */
  CKPT_EXPERTS, /* (R, rows, cols) from R tensors `...{e}...` I8 [rows, cols/2] + `.scale` [rows, cols/32] */
  CKPT_BIAS2,   /* (2, R): rows `released` (text) and `released2` (image) */
  CKPT_ENGRAM,  /* cedar rows (E4M3 values, E8M0 scales) from `released` [rows, hd] + `released2` [rows, hd/32] */
  CKPT_ABSENT,  /* no tensor in the release: a plan that needs one mismatches it (`note` says why) */
};

struct ckpt_map_row {
  const char *internal;  /* cedar's name after `layers.{l}.` (or model-wide) */
  const char *released;  /* after the same prefix; `%d` = the expert */
  enum ckpt_conv conv;
  enum st_dtype dtype;   /* what the released layout stores (CKPT_FLOAT: the writer's; F32 or BF16 read) */
  const char *released2;
  const char *note;
};

/* The row for an internal name (with or without `layers.{l}.` or the
 * drafter's `mtp.{k}.`); NULL when the table has none. *layer gets l,
 * CKPT_MTP_LAYER + k, or -1. */
#define CKPT_MTP_LAYER 100000
const struct ckpt_map_row *ckpt_map_find(const char *internal, int *layer);
/* The table itself (docs/checkpoints.md prints it). */
const struct ckpt_map_row *ckpt_map_rows(size_t *n);
/* "layers.{l}." (or "mtp.{k}." for CKPT_MTP_LAYER + k) + fmt (with the
 * expert for `%d`) into out. */
void ckpt_map_name(char *out, size_t len, int layer, const char *fmt, int expert);
/* Whether a released name is a drafter (`mtp.`) or vision tensor. */
bool ckpt_is_mtp(const char *name);
bool ckpt_is_vision(const char *name);
/* Whether a released name is one of an Engram table's two tensors
 * (`layers.{l}.engram.embed.weight` or `.scale`). */
bool ckpt_is_engram_table(const char *name);

/* Codecs of the released dtypes (ckpt_map.c). */
float ckpt_bf16_to_f32(uint16_t b);
uint16_t ckpt_f32_to_bf16(float x); /* round to nearest even; NaN stays NaN */
/* FP8 tiles: q [rows, cols] E4M3, s [ceil(rows/32), ceil(cols/32)] E8M0. */
void ckpt_fp8_quant(uint8_t *q, uint8_t *s, const float *x, int64_t rows, int64_t cols);
void ckpt_fp8_dequant(float *x, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t cols);
/* FP4 row groups: q [rows, cols/2] (even column in the low nibble), s [rows, cols/32]. */
void ckpt_fp4_quant(uint8_t *q, uint8_t *s, const float *x, int64_t rows, int64_t cols);
void ckpt_fp4_dequant(float *x, const uint8_t *q, const uint8_t *s, int64_t rows, int64_t cols);

#endif

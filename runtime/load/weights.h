/* weights.h: a plan's weights: the tensor list of docs/weights.md, seeded
 * synthetic values, and safetensors save, check and load.
 *
 * One source of truth: weights_list_init enumerates, for a plan, every tensor
 * docs/weights.md names (name, dtype, shape, and how synthetic weights fill
 * it), following the plan's layer modes, ratios and flags; synthesis, save,
 * check and load all iterate over that list, and nothing else knows a tensor
 * name. Layer numbers come from the plan, never from here.
 *
 * Synthetic values [cedar] are counter-based: element i of tensor `name` is a
 * function of (seed, name, i) only, draw i of splitmix64 (ops/sample.h)
 * started at XXH3_64(name, seed). So a tensor never depends on the order in
 * which tensors are made, on other tensors' sizes, or on n_layers: two plans
 * with the same widths share every tensor they both name, bit for bit (the
 * weights of an alternative schedule differ from the default plan's only in
 * the tensors the schedule adds or drops). Scales and their reasons are at
 * the top of weights.c; in short, with unit-RMS inputs every projection
 * gives unit-RMS outputs, the sublayer outputs that are added to the
 * residual streams (attn.wo_b, ffn.*.w_down, engram.wkv) are scaled by
 * WEIGHTS_RESIDUAL_GAIN, and mHC starts as pre = 1/hc, post = 1, C close to
 * the identity.
 *
 * Fingerprint: XXH3_64 of a canonical text of the tensor list (every name,
 * dtype and shape) followed by the dimensions that change what the weights
 * mean without changing a shape: rope_dim, indexer rope_dim and position,
 * the compress ratio of each KV source, the Engram n-gram orders, hash seed,
 * compressed vocab, pad id and table_base, and the Engram row format (E4M3 +
 * E8M0 per 32). Not in it: the plan's name, serving settings, cache storage formats,
 * eps/theta/scales, and schedule facts that change no tensor (which Top-K a
 * reuse layer reads, candidate pools), so one weight file serves every plan
 * with the same tensors (e.g. plans/alt-no-pool.yaml and v41-mini).
 *
 * Load: st_open maps the file; a tensor whose data is 64-byte aligned in the
 * mapping is used in place, any other is copied into one 64-byte aligned
 * arena (the official layout aligns tensors to their element size only, so
 * today most tensors are copied; weights_copied_bytes says how many bytes).
 *
 * Errors: user errors (a plan too big, a bad file) return a negative
 * cedar_status with a message naming the tensor; a check collects every
 * problem (struct weights_problems) rather than stopping at the first.
 * Not here: the forward, dtype conversion, sharded checkpoints, real
 * checkpoints' names (a converter maps them to these).
 * Test: tests/test_weights.c (ctest -R weights), tests/cli/weights.sh.
 */
#ifndef CEDAR_RUNTIME_WEIGHTS_H
#define CEDAR_RUNTIME_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ops/qweight.h"
#include "runtime/load/safetensors.h"
#include "scheduler/plan.h"

#define WEIGHTS_NAME_MAX 64
/* Dimensions of the largest tensor (wo_a, the expert stacks). */
#define WEIGHTS_MAX_DIMS 3
/* Data pointers of a loaded or synthetic handle are aligned to this. */
#define WEIGHTS_ALIGN 64
/* Default --max-bytes of `cedar weights init`: 8 GiB. */
#define WEIGHTS_DEFAULT_MAX_BYTES ((uint64_t)8 << 30)
/* Engram rows: one E8M0 scale per this many E4M3 values (docs/weights.md). */
#define WEIGHTS_ENGRAM_BLOCK 32
/* The gain of projections whose output is added to the residual streams
 * (weights.c explains the choice). */
#define WEIGHTS_RESIDUAL_GAIN 0.125f

/* How synthetic weights fill a tensor; a is the amplitude. */
enum weights_init {
  WEIGHTS_UNIFORM = 0, /* uniform in (-a, a), never 0 */
  WEIGHTS_ONES,        /* 1 + uniform in (-a, a): RMSNorm and gate weights */
  WEIGHTS_CONST,       /* a exactly (sinks 0, mHC scale 1) */
  WEIGHTS_MHC_BASE,    /* mHC base logits (weights.c) + uniform in (-a, a) */
  WEIGHTS_ENGRAM_ROWS, /* rows of uniform (-a, a) values packed E4M3 + E8M0 */
};

struct weights_spec {
  char name[WEIGHTS_NAME_MAX];
  enum st_dtype dtype;
  int ndim;
  int64_t shape[WEIGHTS_MAX_DIMS];
  uint64_t nbytes;
  int layer;          /* -1 for model-wide tensors */
  enum weights_init init;
  float a;
  int hc;             /* WEIGHTS_MHC_BASE: streams */
  int row_values;     /* WEIGHTS_ENGRAM_ROWS: values per row (engram head_dim) */
};

/* The tensors a plan needs, in docs/weights.md order (model-wide, then
 * layer by layer). */
struct weights_list {
  struct weights_spec *t;
  size_t n;
  size_t *by_name;        /* (n) indices of t sorted by name */
  uint64_t total_bytes;
  uint64_t engram_bytes;  /* of which Engram tables */
  uint64_t fingerprint;
  char *plan_name;
  /* Set by weights_load under serving.engram.tier: mmap: the Engram tables
   * are read in place from the file's mapping (never copied) and their
   * content hashes are not checked at load (runtime/model/engram_tier.h). */
  bool engram_in_file;
};

/* Enumerate the plan's tensors. Returns 0, or CEDAR_EINVAL (a plan whose
 * widths the weights cannot take, e.g. an Engram head_dim that is not a
 * multiple of 32) or CEDAR_ENOMEM with a message in err; *l is then empty. */
int weights_list_init(struct weights_list *l, const struct plan *p, char *err, size_t err_len);
void weights_list_free(struct weights_list *l);
/* By name; NULL when the plan has no such tensor. */
const struct weights_spec *weights_list_find(const struct weights_list *l, const char *name);
/* "0123456789abcdef" (16 hex digits and a NUL). */
void weights_fingerprint_hex(uint64_t fp, char out[17]);

/* Fill one tensor's nbytes bytes at out with its synthetic values. */
void weights_fill(void *out, const struct weights_spec *s, uint64_t seed);

/* Every problem a check found, one message each ("name: what"). */
struct weights_problems {
  char **msg;
  size_t n, cap;
};
/* Print up to max_shown messages, then "... and N more". */
void weights_problems_print(const struct weights_problems *pr, FILE *f, size_t max_shown);
void weights_problems_free(struct weights_problems *pr);

/* Check an open file against the list: the fingerprint, every expected
 * tensor present with its dtype and shape, no other tensor. Appends one
 * message per problem to pr (may be NULL); returns the number found. */
size_t weights_check_file(const struct weights_list *l, const st_file_t *f, struct weights_problems *pr);

/* Per-tensor content hashes (weights_hash.c, issue 18 row 16): metadata key
 * WEIGHTS_HASH_PREFIX + name, value the XXH3-64 of the tensor's bytes as 16
 * hex digits. weights_save writes one per tensor; weights_check_file (and so
 * loading and `weights check`) verifies each that a file has; a file without
 * them is accepted, and weights_hash_record adds them (rewriting the file
 * atomically; *added counts them). */
#define WEIGHTS_HASH_PREFIX "cedar.hash."
void weights_hash_key(char *out, size_t len, const char *name);
void weights_hash_hex(char out[17], const void *data, uint64_t n);
int weights_hash_record(const char *path, size_t *added, char *err, size_t err_len);

/* A plan's weights in memory, looked up by name. */
struct weights {
  struct weights_list list;
  const void **data;      /* (list.n) WEIGHTS_ALIGN-aligned, in list order */
  bool synthetic;         /* made by weights_synth, or loaded with cedar.seed */
  uint64_t seed;          /* synthetic only */
  st_file_t *file;        /* loaded only */
  void *arena;            /* synthetic values, or copies of unaligned tensors */
  uint64_t arena_bytes;   /* its size (synthetic and checkpoint weights; else 0) */
  uint64_t copied_bytes;  /* loaded only: bytes copied out of the mapping */
  struct ckpt_shards *shards; /* loaded from a checkpoint directory (runtime/load/shards.h) */
  /* A checkpoint under serving.engram.tier: mmap: each Engram table stays
   * in the shards as its two released tensors: data[i] the E4M3 values
   * (rows, head_dim), engram_scales[i] the E8M0 scales (rows, head_dim /
   * 32), both in the mappings (runtime/model/engram_tier.h). NULL otherwise, and
   * NULL at every other tensor. */
  const void **engram_scales;
  struct weights_rows *part;  /* (list.n) a rank's part (weights_part), or NULL: every tensor whole */
  /* (list.n) each tensor as the model reads it (ops/qweight.h: its format,
   * elements data[i], scales), or NULL: every tensor held as F32 */
  struct op_qweight *qw;
};

/* A rank's part of the weights (runtime/dist/expert_par.h: a shard rank holds
 * only its experts): rows [lo, hi) of a tensor's first dimension. With a
 * part, data[i] points at row lo and only those rows exist (synthetic:
 * made; loaded: copied or mapped), so weights_get's pointer is row lo's. */
struct weights_rows {
  int64_t lo, hi;
};
struct weights_part {
  /* false: tensor s whole; true: only rows *r of it (may be empty) */
  bool (*rows)(const struct weights_spec *s, struct weights_rows *r, const void *ctx);
  const void *ctx;
};
/* weights_synth / weights_synth_no_engram / weights_load of a part (NULL: all). */
int weights_synth_part(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, bool no_engram,
                       const struct weights_part *part, char *err, size_t err_len);
int weights_load_part(struct weights *w, const struct plan *p, const char *path, const struct weights_part *part,
                      struct weights_problems *pr, char *err, size_t err_len);
/* Bytes w holds of tensor i (its part's rows, or all of it). */
uint64_t weights_held_bytes(const struct weights *w, size_t i);
/* The first row of dimension 0 w holds of tensor `name` (0 without a part). */
int64_t weights_row0(const struct weights *w, const char *name);

/* Synthetic weights for p. Refuses (CEDAR_EINVAL, message with the sizes)
 * when they would take more than max_bytes. */
int weights_synth(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, char *err,
                  size_t err_len);
/* The same without the Engram tables (their data NULL, not counted
 * against max_bytes): the mmap tier maps them from a file of their own
 * (runtime/model/engram_tier.h). */
int weights_synth_no_engram(struct weights *w, const struct plan *p, uint64_t seed, uint64_t max_bytes, char *err,
                            size_t err_len);
/* Write w as safetensors (atomically, st_write) with metadata cedar.plan,
 * cedar.fingerprint and, for synthetic weights, cedar.seed. */
int weights_save(const struct weights *w, const char *path, char *err, size_t err_len);
/* Open path and check it against p (weights_check_file). Returns 0, the
 * st_open status (CEDAR_EIO, CEDAR_EFORMAT, ...) for an unreadable file, or
 * CEDAR_EFORMAT when the check found problems (all of them in pr, which may
 * be NULL; the first and the count in err). */
int weights_load(struct weights *w, const struct plan *p, const char *path, struct weights_problems *pr,
                 char *err, size_t err_len);
void weights_free(struct weights *w);

/* What identifies these weights' values, for caches that must never be
 * reused with other weights (the prefix cache's disk tier and block keys):
 * the list fingerprint (names, shapes, meaning) and, for synthetic weights,
 * the seed; for loaded weights, an XXH3 of every tensor's bytes (one pass,
 * ~0.05 s for the mini plan's 339 MB), except under serving.engram.tier:
 * mmap (weights_list.engram_in_file), where reading the Engram tables
 * would read every row (196 GB in V4.1-Flash), the very thing the tier
 * avoids. There the tables count by what the files say of them: their
 * names, dtypes and shapes (in the fingerprint), and, of every file the
 * weights map (the weights file, or each shard), its identity (device,
 * inode, size, modification time in ns: st_file_id) and its whole
 * metadata (which holds the recorded content hashes of cedar-written
 * files). Rewriting or replacing a file changes the identity; a copy of
 * the same files has another one (a disk-tier miss, never a wrong hit);
 * an edit that keeps the inode, size and mtime (set back on purpose) is
 * not seen. The two tiers of the same weights have different identities,
 * so blocks are not shared between them. Only the prefix cache and its
 * disk tier use this (P/D runs without the prefix cache; its package
 * carries a state version, not this). */
uint64_t weights_identity(const struct weights *w);

/* ---- held formats (weights_held.c) ----
 * The release stores each tensor in one format (runtime/load/ckpt_map.c's
 * table, which `plan cost` sizes by): FP8 E4M3 with UE8M0 32x32 tiles (the
 * FP8 linears), E2M1 with UE8M0 per row group of 32 (routed experts), BF16,
 * F32. Synthetic values are stored values: weights_fill's draws passed
 * through their stored format (weights_store_values), so a tensor holds
 * exactly the same numbers as F32 and as stored. weights_hold_stored then
 * keeps them in that format (the default of `--seed`; `--weights-format
 * f32` skips it), and the model reads every linear through its view
 * (weights_qw; ops/qlinear.h, bitwise the F32 path). Held formats:
 * weights_held_fmt: FP8 and FP4 as stored; BF16 for the embedding, the head
 * and the router; the other BF16 tensors (norm vectors, the compressor's
 * and indexer's projections) widened to F32, counted apart in
 * weights_resident; a 3-D FP8 tensor whose slabs are not whole tile rows
 * (o_rank % 32) widened too. */
enum op_wfmt weights_stored_fmt(const struct weights_spec *s);
enum op_wfmt weights_held_fmt(const struct weights_spec *s);
/* x: n_rows rows of s's 2-D view (leading dims folded) replaced by their
 * stored values (quantized and decoded; BF16 rounded); F32: unchanged. */
void weights_store_values(float *x, const struct weights_spec *s, int64_t n_rows);
/* Re-hold F32-held weights (synthetic) in their held formats; the values
 * must be stored values (checked: a tensor that does not decode to exactly
 * its F32 values is refused with CEDAR_EINVAL). CEDAR_ENOMEM: w unchanged. */
int weights_hold_stored(struct weights *w, char *err, size_t err_len);
/* Tensor `name` as a (rows, cols) view (leading dims folded; a part's rows);
 * .data NULL when absent (or an Engram table, which is not a matrix). */
struct op_qweight weights_qw(const struct weights *w, const char *name);
/* Tensor i's values as F32 (weights_held_bytes(w, i) / 4 floats of the
 * F32 size): dequantized when it is held in another format. */
void weights_f32_values(const struct weights *w, size_t i, float *out);
enum op_wfmt weights_fmt_at(const struct weights *w, size_t i);
/* Resident bytes by held format (indexed by enum op_wfmt; Engram tables
 * in memory count as fp8, their stored rows). */
struct weights_resident {
  uint64_t bytes[4];       /* OP_W_F32, OP_W_BF16, OP_W_FP8, OP_W_FP4 */
  uint64_t total;          /* their sum */
  uint64_t widened;        /* F32 bytes of tensors stored in another format */
  uint64_t widened_stored; /* the stored bytes of those tensors */
  uint64_t engram_mapped;  /* Engram tables read from a file's mapping (not in total) */
};
void weights_resident(const struct weights *w, struct weights_resident *r);
/* One line: the resident bytes by format and, when plan_cost_bytes >= 0,
 * plan cost's stored-format figure beside them. */
void weights_resident_print(FILE *f, const struct weights_resident *r, int64_t plan_cost_bytes);

/* The data of tensor `name` (aligned to WEIGHTS_ALIGN), and its spec in
 * *spec when not NULL; NULL when the plan has no such tensor. */
const void *weights_get(const struct weights *w, const char *name, const struct weights_spec **spec);
/* The same for an F32 tensor; NULL when absent, not F32 or held in another
 * format (weights_qw). */
const float *weights_f32(const struct weights *w, const char *name);

#endif

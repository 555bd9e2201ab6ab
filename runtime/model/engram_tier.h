/* engram_tier.h: where the Engram tables live at run time
 * (serving.engram.tier, docs/runtime.md "Engram tiers").
 *
 *   memory  the tables are weights like any other: synthetic ones in the
 *           weights arena, loaded ones as weights_load places them.
 *   mmap    the tables stay in a memory-mapped file and are faulted in row
 *           by row by the Engram prefetch tasks (the graph's engram_rows
 *           nodes), which first ask the kernel for the rows' pages
 *           (madvise WILLNEED) and then gather them. The file is
 *             - the weights file itself with --weights: each table read in
 *               place from its mapping, never copied (weights_load);
 *             - for synthetic weights, a tables file of cedar's own:
 *               serving.engram.file, or by default
 *               $TMPDIR/cedar-engram-<fingerprint>-s<seed>.safetensors,
 *               written (atomically) when absent. It is a safetensors file
 *               holding exactly the layers' `engram.table` tensors (U8,
 *               rows x row bytes, E4M3 + E8M0 per 32) and the metadata
 *               cedar.engram.tables = 1, cedar.fingerprint (the weights'),
 *               cedar.seed and cedar.plan. Opening it checks the header
 *               (st_open: every tensor inside the file, so a truncated file
 *               is refused), the tag, fingerprint and seed, and every
 *               table's dtype and shape; any problem refuses the run with
 *               the reason and the fix, and the file is never rewritten
 *               behind the user's back. The bytes are not hashed at open
 *               (that would read every row, which the tier exists to
 *               avoid): a row index is bounded by the checked shape, so a
 *               damaged row gives wrong numbers, never a bad read.
 *             - a released-layout checkpoint with --model DIR: each table
 *               stays in the shards' mappings as its two released tensors
 *               (`layers.{l}.engram.embed.weight` F8_E4M3 [rows, head_dim]
 *               and `.scale` F8_E8M0 [rows, head_dim / 32], Appendix V),
 *               never copied (ckpt_load; struct weights' engram_scales).
 *               The gather (rt_engram_gather) puts a row's values and
 *               scales side by side, exactly the row the memory tier
 *               builds at load (checkpoint.c), and unpacks it with the same
 *               op_fp8_unpack, so both tiers give the same bits; the
 *               prefetch asks for the pages of both tensors. st_open has
 *               checked every tensor lies inside its shard and ckpt_load
 *               each table's dtype and shape, so a truncated or damaged
 *               shard is refused at open and a row index is bounded by the
 *               checked shape; the tables' content hashes (cedar-written
 *               checkpoints record them) are not verified at load, for the
 *               same reason as above (`cedar weights check DIR` does).
 *           The tables' bytes are not read by weights_identity either
 *           (weights.h says what identifies them instead).
 *           A file truncated by someone else while mapped gives SIGBUS on
 *           the next fault of a page past its new end, as any mapping does.
 *
 * Mapped tables get madvise(RANDOM) (no readahead around a faulting row:
 * the rows of a token are scattered over the table).
 *
 * Not here: the plan key (scheduler/plan_check.c, check_engram_tier), the
 * prefetch nodes (scheduler/graph.c) and their order (scheduler/policy.c).
 * Test: tests/test_engram_tier.c (ctest -R engram_tier), tests/cli/engram_tier.sh.
 */
#ifndef CEDAR_RUNTIME_ENGRAM_TIER_H
#define CEDAR_RUNTIME_ENGRAM_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/load/safetensors.h"
#include "runtime/load/weights.h"
#include "scheduler/plan.h"

struct rt_engram_tier {
  bool mmap;           /* the plan's tier is mmap */
  bool wrote;          /* the tables file was written by this open */
  char *path;          /* the mapped file (NULL: memory tier) */
  st_file_t *file;     /* the tables file we opened (synthetic weights), else NULL */
  int n_tables;        /* Engram modules */
  uint64_t table_bytes;/* all tables */
};

/* Put the tables of w where the plan's tier says. Memory tier: nothing to
 * do. mmap tier: with loaded weights, the tables already point into the
 * weights file's mapping (weights_load) or the shards' (ckpt_load: values
 * and scales); with synthetic weights (made by
 * weights_synth without their tables), open or write the tables file and
 * point w's tables into it. Returns 0, or CEDAR_EINVAL / CEDAR_EFORMAT /
 * CEDAR_EIO / CEDAR_EUNSUPPORTED with a message (path, reason, fix). */
int rt_engram_tier_open(struct rt_engram_tier *t, const struct plan *p, struct weights *w, char *err,
                        size_t err_len);
void rt_engram_tier_close(struct rt_engram_tier *t);

/* One Engram table as the gather reads it: cedar's packed rows (head_dim
 * E4M3 values then head_dim / block E8M0 scales each; scales NULL), or a
 * checkpoint's two tensors under the mmap tier (rows: head_dim values each,
 * scales: head_dim / block each). */
struct rt_engram_view {
  const uint8_t *rows;
  const uint8_t *scales;
  int64_t n_rows;
  int head_dim, block;
};

/* e[i, j*head_dim ...] = the dequantized row rows[i, j] (op_engram_gather's
 * contract, over either layout; the same bits from both). */
void rt_engram_gather(float *e, const struct rt_engram_view *v, const int64_t *rows, int n, int n_tables);

/* The prefetch's hint: the pages of rows[0..n) of a mapped table (both
 * tensors of a split one) are wanted now. */
void rt_engram_willneed(const struct rt_engram_view *v, const int64_t *rows, int n);

/* Drop the tables' pages from this process and, where the kernel allows,
 * from the page cache (for `cedar bench engram`'s cold runs). Returns the
 * bytes advised. Weights from a checkpoint: the tables' tensors in the
 * shards' mappings and the shards that hold them, in either tier (a page
 * that any mapping still holds stays in the page cache, so the bench drops
 * every variant's). */
uint64_t rt_engram_tier_evict(const struct rt_engram_tier *t, const struct weights *w);

#endif

/* disk_tier.h: the persistent tier of the global prefix cache (SPEC 5.3):
 * one file per cached block, written when the block enters the cache and
 * read back after a process restart.
 *
 * File `<dir>/<key as 16 hex digits>.blk`, little-endian:
 *   header   magic "CEDARBLK", version, header bytes, the plan-and-weights
 *            fingerprint, the block's key, its parent's key, its index,
 *            creation time (Unix seconds), the number of sources, then per
 *            source: layer, ratio, entries, entry bytes, XXH3 of its bytes;
 *            last, XXH3 of everything before it in the header.
 *   payload  per source, its entries of the block (entries x entry bytes).
 * A file is written to a unique temporary name in the same directory, fsynced,
 * renamed over the final name and the directory fsynced, so a crash leaves
 * either the old state or the whole new file. A file that is truncated,
 * corrupted (any checksum), from another fingerprint, of another layout
 * than the plan's, or older than the TTL is a miss: a warning, the file is
 * removed, and the block is recomputed; it is never used and never crashes
 * the process. A TTL of 0 hours means blocks never expire. Temporary files
 * that a killed writer left are removed by dt_init once 10 minutes old.
 *
 * Whether loading beats recomputing: the tier keeps running measurements
 * of its load throughput (bytes/s, including checks) and the caller's
 * recompute cost (seconds per block, from the prefills it ran);
 * dt_worth_loading compares the two for a block (docs/runtime.md).
 *
 * Not here: the in-memory cache (prefix_cache.h), which calls these.
 * Test: tests/test_disk_tier_*.c, tests/cli/serve_crash.sh.
 */
#ifndef CEDAR_RUNTIME_DISK_TIER_H
#define CEDAR_RUNTIME_DISK_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DT_MAGIC "CEDARBLK"
#define DT_VERSION 1u

struct dt_stats {
  int64_t written, write_failed, loaded, missing, rejected, expired;
  int64_t bytes_written, bytes_loaded;
  double load_seconds;        /* reading and checking loaded blocks */
};

struct dt_tier {
  char *dir;
  uint64_t fingerprint;
  double ttl_s;               /* serving.cache.global_ttl_hours */
  double recompute_s_per_block; /* measured by the caller; 0 = unknown (then loading is assumed to win) */
  struct dt_stats stats;
};

/* One source's part of a block, for writing and reading. */
struct dt_part {
  int layer, ratio;
  int n_entries;
  size_t entry_bytes;
  uint8_t *bytes;             /* (n_entries, entry_bytes) */
};

struct dt_block {
  uint64_t key, parent;
  int64_t index;
  int n_parts;
  struct dt_part part[64];
};

/* Create dir (and its parents) if needed. Returns 0, or CEDAR_EIO with a
 * message. */
int dt_init(struct dt_tier *t, const char *dir, uint64_t fingerprint, double ttl_hours, char *err, size_t err_len);
void dt_free(struct dt_tier *t);

/* Write a block atomically. Returns 0 or CEDAR_EIO (message in err; the
 * caller goes on without the disk copy). */
int dt_write(struct dt_tier *t, const struct dt_block *b, char *err, size_t err_len);

/* Read the block with this key. expect: the layout the plan gives (layer,
 * ratio, entries, entry bytes per part, bytes unset). Returns 0 and fills
 * out (parts' bytes malloc'd: dt_block_free), 1 when there is no file, or
 * CEDAR_EFORMAT when a file exists but is unusable (a warning is logged and
 * the file removed), or CEDAR_ENOMEM (the file is kept). */
int dt_read(struct dt_tier *t, uint64_t key, const struct dt_block *expect, struct dt_block *out);
void dt_block_free(struct dt_block *b);

/* Whether a file for this key exists (it may still be rejected on read). */
bool dt_has(const struct dt_tier *t, uint64_t key);

/* Whether loading a block of `bytes` is expected to be faster than
 * recomputing it, from the measured throughput and recompute cost. */
bool dt_worth_loading(const struct dt_tier *t, int64_t bytes);

#endif

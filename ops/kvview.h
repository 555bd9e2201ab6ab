/* kvview.h: how ops see cached state without owning it. The runtime owns the
 * paged global pools and the SWA rings (DESIGN.md decision 4); an op gets a
 * read-only view: where each entry's bytes are and how they are packed.
 *
 * Global KV source entry (docs/formats.md): the Main-KV part (main_fmt,
 * by default E2M1 + an E4M3 scale per 16) at main_off and the Indexer-K part
 * (idx_fmt, by default MXFP4) at idx_off inside one entry of entry_bytes;
 * entry e lives in page e / page_entries at slot e % page_entries. Both
 * parts are op_kv_pack'ed (ops/formats.h): any plan format.
 *
 * SWA ring: `n_slots` slots of entries in `fmt` (by default E4M3 + scales); slot s holds the
 * entry of absolute position pos[s] (-1 = empty). Slot and position are kept
 * apart (SPEC 3.6): visibility is decided on pos, never on the slot index.
 * n_slots is the ring's capacity, not the model's window W: a ring may be
 * larger (window + max draft for speculation, SPEC 7.8). The positions held
 * by the slots are distinct (the ring's owner keeps it so); attention's bound
 * of at most topk + W entries per query relies on it (SPEC 8.4.20).
 */
#ifndef CEDAR_OPS_KVVIEW_H
#define CEDAR_OPS_KVVIEW_H

#include <stddef.h>
#include <stdint.h>

#include "ops/formats.h"

struct op_kv_view {
  const uint8_t *const *pages; /* page table */
  int page_entries;            /* entries per page */
  size_t entry_bytes;          /* stride of one entry inside a page */
  size_t main_off, idx_off;    /* byte offsets of the two parts inside an entry */
  int64_t n_entries;           /* committed entries: valid indices are [0, n_entries) */
  int ratio;                   /* tokens per entry; entry j sits at position ratio*j */
  int main_w, idx_w;           /* widths: Main KV (head_dim), Indexer K (idx_dim) */
  struct op_kv_format main_fmt, idx_fmt; /* how each part is stored */
  /* CUDA kernels inside a graph segment (runtime/exec/devseg.h): the committed
   * count in device memory (the step's parameter block), read in place of
   * n_entries, which then only sizes the grid and the scratch (the pages
   * the segment's key covers). NULL everywhere else; the CPU ops never read
   * it. */
  const int64_t *n_dev;
};

static inline const uint8_t *op_kv_entry(const struct op_kv_view *v, int64_t e) {
  return v->pages[e / v->page_entries] + (size_t)(e % v->page_entries) * v->entry_bytes;
}

struct op_swa_view {
  const uint8_t *slots;  /* (n_slots, entry_bytes) */
  const int64_t *pos;    /* (n_slots): absolute position held by each slot, -1 = empty */
  int n_slots;
  size_t entry_bytes;
  int w;                 /* entry width (head_dim) */
  struct op_kv_format fmt; /* how an entry is stored (op_kv_pack) */
};

#endif

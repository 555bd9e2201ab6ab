/* kvview.h: how ops see cached state without owning it. The runtime owns the
 * paged global pools and the SWA rings (DESIGN.md decision 4); an op gets a
 * read-only view: where each entry's bytes are and how they are packed.
 *
 * Global KV source entry (docs/formats.md): the Main-KV part (E2M1 + E4M3
 * scale per main_block, op_fp4 layout) at main_off and the Indexer-K part
 * (MXFP4, op_mxfp4 layout) at idx_off inside one entry of entry_bytes; entry
 * e lives in page e / page_entries at slot e % page_entries.
 *
 * SWA ring: `n_slots` slots of FP8 entries (op_fp8 layout); slot s holds the
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
  int main_w, main_block;      /* Main KV: width (head_dim) and values per E4M3 scale */
  int idx_w, idx_block;        /* Indexer K: width and values per E8M0 scale */
  enum op_nibble_order nibble;
};

static inline const uint8_t *op_kv_entry(const struct op_kv_view *v, int64_t e) {
  return v->pages[e / v->page_entries] + (size_t)(e % v->page_entries) * v->entry_bytes;
}

struct op_swa_view {
  const uint8_t *slots;  /* (n_slots, entry_bytes) */
  const int64_t *pos;    /* (n_slots): absolute position held by each slot, -1 = empty */
  int n_slots;
  size_t entry_bytes;
  int w, block;          /* entry width (head_dim) and values per scale */
  enum op_scale_kind scale;
};

#endif

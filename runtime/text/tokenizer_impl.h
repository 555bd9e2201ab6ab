/* tokenizer_impl.h: the tokenizer's tables, shared by tokenizer_load.c (which
 * fills them from tokenizer.json) and tokenizer.c (encode and decode). Not
 * for use outside those two files. */
#ifndef CEDAR_RUNTIME_TOKENIZER_IMPL_H
#define CEDAR_RUNTIME_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

#define TOK_MAX_SPLITS 8
/* The piece cache: a direct-mapped table of short pieces' BPE results
 * (keyed by the piece's bytes, compared in full: a hit is exact). */
#define TOK_CACHE_SLOTS 16384
#define TOK_CACHE_BYTES 22
#define TOK_CACHE_IDS 12

struct tok_cache_entry {
  uint8_t len, n; /* piece bytes (0: empty), ids */
  uint8_t bytes[TOK_CACHE_BYTES];
  int32_t ids[TOK_CACHE_IDS];
};

struct tok_span {
  uint32_t off, len; /* into tokenizer.pool */
};

struct tokenizer {
  int n_ids;
  char *pool; /* every string, NUL-separated */
  size_t pool_len, pool_cap;
  struct tok_span *str; /* (n_ids) vocabulary form; len 0 and off 0: no token */
  struct tok_span *dec; /* (n_ids) decoded bytes */
  uint8_t *has, *added, *special; /* (n_ids) flags */
  int32_t byte_id[256]; /* the token of each single byte */
  /* vocabulary string -> id, open addressing on XXH3 */
  int32_t *vmap;
  uint32_t vmask;
  /* merge (left id, right id) -> rank, open addressing, one 8-byte slot a
   * probe: (left << 20 | right) + 1 in the low 40 bits (0 = empty), the rank
   * above (the result is rank_pair's). 2 MB for DeepSeek-V3's 127,741
   * merges at load 0.49, half the 16-byte slots' (docs/PERF.md). */
  uint64_t *merge;
  uint32_t mmask;
  int n_merges;
  int32_t *rank_pair; /* (n_merges, 3): left, right, result of each rank (-1: a repeat) */
  /* added-token trie over bytes: root edges direct, others hashed */
  int32_t root[256];      /* child of the root per byte, -1 none */
  int32_t *tnode_id;      /* (n_nodes) token ending here, -1 none */
  uint64_t *tkey;         /* ((node << 8 | byte) + 1), 0 = empty */
  int32_t *tchild;
  uint32_t tmask;
  int n_nodes, nodes_cap;
  /* pre-tokenizer */
  int n_split, jit; /* jit: every regex JIT-compiled (pcre2_jit_match skips the checks the input already passed) */
  pcre2_code *re[TOK_MAX_SPLITS];
  pcre2_match_data *md;
  struct tok_cache_entry *cache; /* (TOK_CACHE_SLOTS) */
  /* scratch of one encode */
  char *clean;
  size_t clean_len, clean_cap;
  int32_t *sym, *next, *prev;
  uint64_t *heap;
  size_t sym_cap, heap_cap;
};

#define TOK_ID_BITS 20 /* ids below 2^20, ranks below 2^24 (checked at load) */
#define TOK_KEY_MASK ((1ull << (2 * TOK_ID_BITS)) - 1)
static inline uint64_t tok_pair_key(int32_t a, int32_t b) {
  return ((uint64_t)(uint32_t)a << TOK_ID_BITS | (uint32_t)b) + 1;
}
/* Pair lookup: the rank (>= 0) of merging (a, b), or -1. */
static inline uint32_t tok_pair_hash(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return (uint32_t)k;
}
static inline int32_t tok_merge_find(const struct tokenizer *t, int32_t a, int32_t b) {
  uint64_t key = tok_pair_key(a, b);
  for (uint32_t i = tok_pair_hash(key) & t->mmask;; i = (i + 1) & t->mmask) {
    uint64_t s = t->merge[i];
    if ((s & TOK_KEY_MASK) == key) return (int32_t)(s >> (2 * TOK_ID_BITS));
    if (!s) return -1;
  }
}

/* GPT-2's byte-to-unicode map: the code point standing for byte b. */
static inline uint32_t tok_byte_cp(int b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return (uint32_t)b;
  int k = 0; /* rank among the remapped bytes */
  for (int c = 0; c < b; c++)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) k++;
  return 256u + (uint32_t)k;
}

/* Encode code point cp as UTF-8 into out (4 bytes room); returns the length. */
int tok_utf8_put(uint32_t cp, uint8_t *out);

#endif

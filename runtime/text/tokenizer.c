/* tokenizer.c: encoding (UTF-8 repair, added tokens, the Split regexes, BPE
 * merges by rank) and decoding (whole and streaming) for tokenizer.h. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/check.h"
#include "runtime/text/tokenizer_impl.h"

/* ---- UTF-8 ----------------------------------------------------------------- */

int tok_utf8_put(uint32_t cp, uint8_t *o) {
  if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
  if (cp < 0x800) return o[0] = (uint8_t)(0xc0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3f)), 2;
  if (cp < 0x10000)
    return o[0] = (uint8_t)(0xe0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)),
           o[2] = (uint8_t)(0x80 | (cp & 0x3f)), 3;
  o[0] = (uint8_t)(0xf0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
  o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f)), o[3] = (uint8_t)(0x80 | (cp & 0x3f));
  return 4;
}

/* Bytes of the longest well-formed prefix of a character at s (Unicode
 * Table 3-7): *need is the full length its lead byte asks for (0: the lead
 * is ill-formed). Returns how many bytes (lead included) are well formed. */
static int utf8_prefix(const uint8_t *s, size_t n, int *need) {
  uint8_t c = s[0];
  uint8_t lo = 0x80, hi = 0xbf;
  if (c < 0x80) return *need = 1, 1;
  if (c >= 0xc2 && c <= 0xdf) *need = 2;
  else if (c >= 0xe0 && c <= 0xef) *need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) *need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return *need = 0, 0;
  int k = 1;
  for (; k < *need && (size_t)k < n; k++) {
    uint8_t b = s[k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xbf)) break;
  }
  return k;
}

int tok_utf8_char_len(const uint8_t *s, size_t n) {
  if (!n) return 0;
  int need, k = utf8_prefix(s, n, &need);
  return need && k == need ? need : 0;
}

static int reserve(char **out, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  char *p = realloc(*out, c);
  if (!p) return CEDAR_ENOMEM;
  *out = p, *cap = c;
  return 0;
}

int tok_utf8_repair(const uint8_t *in, size_t len, char **out, size_t *out_len, size_t *out_cap) {
  if (reserve(out, out_cap, *out_len + len * 3 + 1)) return CEDAR_ENOMEM; /* each bad byte -> 3 */
  char *o = *out + *out_len;
  for (size_t i = 0; i < len;) {
    int need, k = utf8_prefix(in + i, len - i, &need);
    if (need && k == need) {
      memcpy(o, in + i, (size_t)k), o += k, i += (size_t)k;
    } else {
      memcpy(o, "\xef\xbf\xbd", 3), o += 3, i += k ? (size_t)k : 1; /* one U+FFFD per maximal subpart */
    }
  }
  *o = 0;
  *out_len = (size_t)(o - *out);
  return 0;
}

/* ---- BPE ------------------------------------------------------------------- */

/* Heap entries: rank << 32 | left position (positions < 2^32): the lowest
 * rank first, the leftmost among equal ranks. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0 && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
  uint64_t top = h[0], v = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c], i = c;
  }
  h[i] = v;
  return top;
}

static int grow_scratch(struct tokenizer *t, size_t n) {
  if (n <= t->sym_cap) return 0;
  size_t c = t->sym_cap ? t->sym_cap : 256;
  while (c < n) c *= 2;
  int32_t *a = realloc(t->sym, c * sizeof *a);
  if (a) t->sym = a;
  int32_t *b = a ? realloc(t->next, c * sizeof *b) : NULL;
  if (b) t->next = b;
  int32_t *p = b ? realloc(t->prev, c * sizeof *p) : NULL;
  if (p) t->prev = p;
  uint64_t *h = p ? realloc(t->heap, 3 * c * sizeof *h) : NULL;
  if (!h) return CEDAR_ENOMEM;
  t->heap = h, t->sym_cap = c, t->heap_cap = 3 * c;
  return 0;
}

static void push_pair(struct tokenizer *t, size_t *nh, int32_t i) {
  int32_t j = t->next[i];
  if (j < 0) return;
  int32_t r = tok_merge_find(t, t->sym[i], t->sym[j]);
  if (r >= 0) heap_push(t->heap, nh, (uint64_t)(uint32_t)r << 32 | (uint32_t)i);
}

static int append_ids(int32_t **ids, size_t *n, size_t *cap, size_t more) {
  if (*n + more <= *cap) return 0;
  size_t c = *cap ? *cap : 256;
  while (c < *n + more) c *= 2;
  int32_t *p = realloc(*ids, c * sizeof *p);
  if (!p) return CEDAR_ENOMEM;
  *ids = p, *cap = c;
  return 0;
}

/* One piece's bytes through BPE; the ids appended. */
static int bpe_piece(struct tokenizer *t, const uint8_t *s, size_t len, int32_t **ids, size_t *n, size_t *cap) {
  if (len == 1) {
    if (append_ids(ids, n, cap, 1)) return CEDAR_ENOMEM;
    (*ids)[(*n)++] = t->byte_id[s[0]];
    return 0;
  }
  struct tok_cache_entry *ce = NULL;
  if (len <= TOK_CACHE_BYTES) {
    ce = &t->cache[XXH3_64bits(s, len) & (TOK_CACHE_SLOTS - 1)];
    if (ce->len == len && !memcmp(ce->bytes, s, len)) {
      if (append_ids(ids, n, cap, ce->n)) return CEDAR_ENOMEM;
      memcpy(*ids + *n, ce->ids, ce->n * sizeof(int32_t));
      *n += ce->n;
      return 0;
    }
  }
  if (grow_scratch(t, len)) return CEDAR_ENOMEM;
  size_t nh = 0;
  for (size_t i = 0; i < len; i++) {
    t->sym[i] = t->byte_id[s[i]];
    t->prev[i] = (int32_t)i - 1;
    t->next[i] = i + 1 < len ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < len; i++) push_pair(t, &nh, (int32_t)i);
  while (nh) {
    uint64_t top = heap_pop(t->heap, &nh);
    int32_t i = (int32_t)(uint32_t)top;
    const int32_t *rp = t->rank_pair + 3 * (top >> 32); /* the pair this rank merges */
    int32_t j = t->next[i], res = rp[2];
    /* stale: i merged away (sym -1), or its pair changed since the push */
    if (t->sym[i] != rp[0] || j < 0 || t->sym[j] != rp[1]) continue;
    t->sym[i] = res;
    t->sym[j] = -1;
    t->next[i] = t->next[j];
    if (t->next[j] >= 0) t->prev[t->next[j]] = i;
    if (t->prev[i] >= 0) push_pair(t, &nh, t->prev[i]);
    push_pair(t, &nh, i);
  }
  if (append_ids(ids, n, cap, len)) return CEDAR_ENOMEM;
  size_t first = *n;
  for (int32_t i = 0; i >= 0; i = t->next[i]) (*ids)[(*n)++] = t->sym[i];
  if (ce && *n - first <= TOK_CACHE_IDS) {
    ce->len = (uint8_t)len, ce->n = (uint8_t)(*n - first);
    memcpy(ce->bytes, s, len);
    memcpy(ce->ids, *ids + first, ce->n * sizeof(int32_t));
  }
  return 0;
}

/* ---- pre-tokenizer ----------------------------------------------------------- */

/* Split step `level` over s[0, len): matches and gaps, in order, to the
 * next step; after the last step, BPE. */
static int split(struct tokenizer *t, int level, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap) {
  if (!len) return 0;
  if (level == t->n_split) return bpe_piece(t, (const uint8_t *)s, len, ids, n, cap);
  size_t prev = 0, at = 0;
  while (at <= len) {
    int rc = t->jit ? pcre2_jit_match(t->re[level], (PCRE2_SPTR)s, len, at, 0, t->md, NULL)
                    : pcre2_match(t->re[level], (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return CEDAR_EINVAL; /* match limit: cannot happen on these patterns; reported, not hidden */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    size_t ms = ov[0], me = ov[1];
    if (ms > prev && (rc = split(t, level + 1, s + prev, ms - prev, ids, n, cap))) return rc;
    if (me > ms) {
      if ((rc = split(t, level + 1, s + ms, me - ms, ids, n, cap))) return rc;
      prev = at = me;
    } else { /* an empty match: step one character on, as JavaScript's matchAll */
      if (ms >= len) break;
      int cl = tok_utf8_char_len((const uint8_t *)s + ms, len - ms);
      at = ms + (size_t)(cl ? cl : 1);
    }
  }
  return prev < len ? split(t, level + 1, s + prev, len - prev, ids, n, cap) : 0;
}

static int longest_added(const struct tokenizer *t, const uint8_t *s, size_t len, size_t *mlen) {
  int node = t->root[s[0]], best = -1;
  size_t k = 1;
  while (node > 0) {
    if (t->tnode_id[node] >= 0) best = t->tnode_id[node], *mlen = k;
    if (k == len) break;
    uint64_t key = ((uint64_t)node << 8 | s[k]) + 1;
    uint32_t i = tok_pair_hash(key) & t->tmask;
    node = -1;
    for (; t->tkey[i]; i = (i + 1) & t->tmask)
      if (t->tkey[i] == key) {
        node = t->tchild[i];
        break;
      }
    k++;
  }
  return best;
}

int tok_encode(struct tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap) {
  if (len > TOK_MAX_TEXT) return CEDAR_EINVAL; /* positions are int32 (the merge heap) after up to 3x repair */
  t->clean_len = 0;
  if (tok_utf8_repair((const uint8_t *)text, len, &t->clean, &t->clean_len, &t->clean_cap)) return CEDAR_ENOMEM;
  const uint8_t *s = (const uint8_t *)t->clean;
  size_t L = t->clean_len, start = 0;
  for (size_t i = 0; i < L;) {
    size_t mlen = 0;
    int id = t->root[s[i]] >= 0 ? longest_added(t, s + i, L - i, &mlen) : -1;
    if (id < 0) {
      i++;
      continue;
    }
    int rc = split(t, 0, (const char *)s + start, i - start, ids, n, cap);
    if (rc || (rc = append_ids(ids, n, cap, 1))) return rc;
    (*ids)[(*n)++] = id;
    i += mlen, start = i;
  }
  return split(t, 0, (const char *)s + start, L - start, ids, n, cap);
}

/* ---- decoding ---------------------------------------------------------------- */

const uint8_t *tok_id_bytes(const struct tokenizer *t, int id, size_t *len) {
  if (id < 0 || id >= t->n_ids || !t->has[id]) return *len = 0, NULL;
  *len = t->dec[id].len;
  return (const uint8_t *)t->pool + t->dec[id].off;
}

int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *out_len,
               size_t *out_cap, int *bad_id) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t l;
    if (!tok_id_bytes(t, ids[i], &l)) return *bad_id = ids[i], CEDAR_EINVAL;
    total += l;
  }
  uint8_t *raw = malloc(total + 1);
  if (!raw) return CEDAR_ENOMEM;
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (skip_special && t->special[ids[i]]) continue;
    size_t l;
    const uint8_t *b = tok_id_bytes(t, ids[i], &l);
    memcpy(raw + o, b, l), o += l;
  }
  int rc = tok_utf8_repair(raw, o, out, out_len, out_cap);
  free(raw);
  return rc;
}

int tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int id, char **out, size_t *out_len,
                    size_t *out_cap) {
  size_t l;
  const uint8_t *b = tok_id_bytes(t, id, &l);
  if (!b) return CEDAR_EINVAL;
  uint8_t *buf = malloc(l + 4);
  if (!buf) return CEDAR_ENOMEM;
  memcpy(buf, s->held, (size_t)s->n_held);
  memcpy(buf + s->n_held, b, l);
  size_t len = l + (size_t)s->n_held, keep = 0;
  /* Hold back a trailing sequence that is well formed so far but short. */
  for (size_t back = 1; back <= 3 && back <= len; back++) {
    const uint8_t *p = buf + len - back;
    if ((*p & 0xc0) == 0x80) continue; /* a continuation byte: look further back */
    int need, k = utf8_prefix(p, back, &need);
    if (need > (int)back && k == (int)back) keep = back;
    break;
  }
  int rc = tok_utf8_repair(buf, len - keep, out, out_len, out_cap);
  memcpy(s->held, buf + len - keep, keep);
  s->n_held = (int)keep;
  free(buf);
  return rc;
}

int tok_stream_finish(struct tok_stream *s, char **out, size_t *out_len, size_t *out_cap) {
  int rc = tok_utf8_repair(s->held, (size_t)s->n_held, out, out_len, out_cap);
  s->n_held = 0;
  return rc;
}

/* engram_map.c: the Engram token map from the tokenizer (see engram_map.h
 * for the procedure and its sources). */
#include "runtime/model/engram_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "base/check.h"
#include "base/log.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"

/* Unicode's White_Space property (PropList.txt): what Rust's str::trim and
 * the Strip normalizer remove. */
static int is_white_space(int32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* N(text) of engram_map.h into out (room for 4 bytes per code point of s);
 * returns its length. s is valid UTF-8 after NFKC + NFD. */
static size_t normalize_tail(const uint8_t *s, size_t n, uint8_t *out) {
  size_t o = 0;
  int in_ws = 0;
  for (size_t i = 0; i < n;) {
    int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &c);
    CEDAR_ASSERT(k > 0);
    i += (size_t)k;
    if (utf8proc_category(c) == UTF8PROC_CATEGORY_MN) continue; /* drop combining marks (Mn) */
    c = utf8proc_tolower(c);
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') { /* [ \t\r\n]+ -> one space */
      if (!in_ws) out[o++] = ' ';
      in_ws = 1;
      continue;
    }
    in_ws = 0;
    o += (size_t)utf8proc_encode_char(c, out + o);
  }
  if (o == 1 && out[0] == ' ') return 1; /* a lone space is kept as it is */
  /* strip White_Space at both ends */
  size_t b = 0, e = o;
  while (b < e) {
    int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate(out + b, (utf8proc_ssize_t)(e - b), &c);
    if (!is_white_space(c)) break;
    b += (size_t)k;
  }
  while (e > b) {
    size_t p = e - 1;
    while (p > b && (out[p] & 0xc0) == 0x80) p--;
    int32_t c;
    utf8proc_iterate(out + p, (utf8proc_ssize_t)(e - p), &c);
    if (!is_white_space(c)) break;
    e = p;
  }
  memmove(out, out + b, e - b);
  return e - b;
}

static int has_fffd(const char *s, size_t n) {
  for (size_t i = 0; i + 2 < n; i++)
    if ((uint8_t)s[i] == 0xef && (uint8_t)s[i + 1] == 0xbf && (uint8_t)s[i + 2] == 0xbd) return 1;
  return 0;
}

char *rt_engram_key(const uint8_t *bytes, size_t n, const char *raw, size_t *len) {
  char *text = NULL;
  size_t tl = 0, tc = 0;
  if (tok_utf8_repair(bytes, n, &text, &tl, &tc)) return NULL;
  if (has_fffd(text, tl)) { /* U+FFFD: the raw token string */
    free(text);
    *len = strlen(raw);
    char *k = malloc(*len + 1);
    if (k) memcpy(k, raw, *len + 1);
    return k;
  }
  utf8proc_uint8_t *nfkc = NULL, *nfd = NULL;
  /* utf8proc_map with STABLE|COMPOSE|COMPAT is NFKC; then NFD of that. */
  utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)tl, &nfkc,
                                    UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (r >= 0) r = utf8proc_map(nfkc, r, &nfd, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  free(nfkc);
  if (r < 0) { /* valid UTF-8 always maps; only memory can fail */
    free(text);
    return NULL;
  }
  uint8_t *out = malloc((size_t)r * 4 + 1);
  if (!out) return free(nfd), free(text), NULL;
  size_t o = normalize_tail(nfd, (size_t)r, out);
  free(nfd);
  if (o == 0) { /* empty after normalizing: the decoded text */
    free(out);
    *len = tl;
    return text;
  }
  free(text);
  out[o] = 0;
  *len = o;
  return (char *)out;
}

/* Keys -> first-appearance index, open addressing on XXH3. */
struct keyset {
  char **key;
  size_t *len;
  int32_t *slot; /* index into key, -1 empty */
  uint32_t mask;
  int n;
};

static int32_t keyset_add(struct keyset *s, char *k, size_t len, int *owned) {
  uint32_t i = (uint32_t)XXH3_64bits(k, len) & s->mask;
  for (; s->slot[i] >= 0; i = (i + 1) & s->mask)
    if (s->len[s->slot[i]] == len && !memcmp(s->key[s->slot[i]], k, len)) return *owned = 0, s->slot[i];
  s->key[s->n] = k, s->len[s->n] = len, s->slot[i] = s->n;
  return *owned = 1, s->n++;
}

int rt_engram_map_build(const struct tokenizer *t, int32_t **map, int *n_ids, int *n_distinct, char *err,
                        size_t err_len) {
  int n = tok_n_ids(t);
  struct keyset s = {0};
  s.mask = 1;
  while (s.mask < 2u * (uint32_t)n + 16) s.mask <<= 1;
  s.slot = malloc((size_t)s.mask * sizeof *s.slot);
  s.mask -= 1;
  s.key = malloc((size_t)n * sizeof *s.key);
  s.len = malloc((size_t)n * sizeof *s.len);
  int32_t *m = malloc((size_t)n * sizeof *m);
  int rc = 0;
  if (!s.slot || !s.key || !s.len || !m) rc = CEDAR_ENOMEM;
  else memset(s.slot, 0xff, ((size_t)s.mask + 1) * sizeof *s.slot);
  for (int id = 0; id < n && !rc; id++) {
    size_t bl, kl;
    const uint8_t *b = tok_id_bytes(t, id, &bl);
    const char *raw = tok_token_string(t, id);
    char *k = b ? rt_engram_key(b, bl, raw, &kl) : calloc(1, 1);
    if (!b) kl = 0;
    if (!k) {
      rc = CEDAR_ENOMEM;
      break;
    }
    int owned;
    m[id] = keyset_add(&s, k, kl, &owned);
    if (!owned) free(k);
  }
  for (int i = 0; i < s.n; i++) free(s.key[i]);
  free(s.key), free(s.len), free(s.slot);
  if (rc) {
    free(m);
    snprintf(err, err_len, "out of memory building the Engram token map");
    return rc;
  }
  *map = m, *n_ids = n, *n_distinct = s.n;
  return 0;
}

int rt_model_use_tokenizer(struct rt_model *M, const struct tokenizer *t, int released, char *err, size_t err_len) {
  if (!M->cmap) return 0; /* no Engram layer */
  int32_t *map = NULL;
  int n = 0, d = 0, rc = rt_engram_map_build(t, &map, &n, &d, err, err_len);
  if (rc) return rc;
  int want = M->p->model.engram_compressed_vocab;
  if (d == want) {
    rc = rt_model_set_cmap(M, map, n, d, "the tokenizer's normalized token map (Appendix V #18)", err, err_len);
  } else if (released) {
    snprintf(err, err_len, "the tokenizer's Engram token map has %d keys but the checkpoint's "
             "engram_compressed_vocab_size is %d: use the checkpoint's own tokenizer.json", d, want);
    rc = CEDAR_EINVAL;
  } else {
    LOG_WARN("the tokenizer's Engram token map has %d keys, model.engram.compressed_vocab is %d: keeping "
             "id mod compressed_vocab", d, want);
    M->cmap_source = "id mod compressed_vocab (the tokenizer's map does not fit this plan)";
  }
  free(map);
  return rc;
}

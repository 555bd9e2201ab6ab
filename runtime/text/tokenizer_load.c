/* tokenizer_load.c: read tokenizer.json (cJSON) into the tokenizer's tables:
 * the checks of each field tokenizer.h lists, the vocabulary and its hash,
 * the merges by rank, the added-token trie, the Split regexes (PCRE2 JIT),
 * the decoded bytes of every id. */
#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/check.h"
#include "base/file.h"
#include "runtime/text/tokenizer_impl.h"

#ifndef CEDAR_TOKENIZER_JSON
#define CEDAR_TOKENIZER_JSON ""
#endif

const char *tok_default_path(void) { return CEDAR_TOKENIZER_JSON[0] ? CEDAR_TOKENIZER_JSON : NULL; }

static int fail(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return -1;
}

static uint32_t pow2_above(size_t n) {
  uint32_t m = 1;
  while (m < 2 * n + 16) m <<= 1;
  return m;
}

/* Append s (len bytes) to the pool; returns its span. -1 len on ENOMEM. */
static struct tok_span pool_add(struct tokenizer *t, const char *s, size_t len) {
  if (t->pool_len + len + 1 > t->pool_cap) {
    size_t cap = t->pool_cap ? t->pool_cap * 2 : 1 << 20;
    while (cap < t->pool_len + len + 1) cap *= 2;
    char *p = realloc(t->pool, cap);
    if (!p) return (struct tok_span){0, UINT32_MAX};
    t->pool = p, t->pool_cap = cap;
  }
  struct tok_span sp = {(uint32_t)t->pool_len, (uint32_t)len};
  memcpy(t->pool + t->pool_len, s, len);
  t->pool[t->pool_len + len] = 0;
  t->pool_len += len + 1;
  return sp;
}

static int32_t vocab_find(const struct tokenizer *t, const char *s, size_t len) {
  for (uint32_t i = (uint32_t)XXH3_64bits(s, len) & t->vmask;; i = (i + 1) & t->vmask) {
    int32_t id = t->vmap[i];
    if (id < 0) return -1;
    if (t->str[id].len == len && !memcmp(t->pool + t->str[id].off, s, len)) return id;
  }
}

static void vocab_put(struct tokenizer *t, int32_t id) {
  const char *s = t->pool + t->str[id].off;
  uint32_t i = (uint32_t)XXH3_64bits(s, t->str[id].len) & t->vmask;
  while (t->vmap[i] >= 0) i = (i + 1) & t->vmask;
  t->vmap[i] = id;
}

/* ---- the fields that must hold what cedar implements --------------------- */

static const char *type_of(const cJSON *o) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
  return cJSON_IsString(ty) ? ty->valuestring : "(no type)";
}

static int is_false_or_absent(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return !v || cJSON_IsFalse(v) || cJSON_IsNull(v);
}

static int check_normalizer(const cJSON *n, char *err, size_t el) {
  if (!n || cJSON_IsNull(n)) return 0;
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
  if (!strcmp(type_of(n), "Sequence") && cJSON_IsArray(list) && cJSON_GetArraySize(list) == 0) return 0;
  return fail(err, el, "normalizer: type %s is not supported (cedar implements none or an empty Sequence)", type_of(n));
}

static int add_split(struct tokenizer *t, const cJSON *s, int i, char *err, size_t el) {
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
  const cJSON *rx = pat ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
  const cJSON *beh = cJSON_GetObjectItemCaseSensitive(s, "behavior");
  if (!cJSON_IsString(rx))
    return fail(err, el, "pre_tokenizer.pretokenizers[%d]: Split needs pattern.Regex (a String pattern is not "
                "supported)", i);
  if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated"))
    return fail(err, el, "pre_tokenizer.pretokenizers[%d]: Split behavior %s is not supported (only Isolated)", i,
                cJSON_IsString(beh) ? beh->valuestring : "(none)");
  if (!is_false_or_absent(s, "invert"))
    return fail(err, el, "pre_tokenizer.pretokenizers[%d]: Split invert true is not supported", i);
  if (t->n_split == TOK_MAX_SPLITS)
    return fail(err, el, "pre_tokenizer: more than %d Split steps", TOK_MAX_SPLITS);
  int code;
  PCRE2_SIZE at;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)rx->valuestring, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code,
                                 &at, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    return fail(err, el, "pre_tokenizer.pretokenizers[%d]: regex does not compile at offset %zu: %s", i, (size_t)at,
                (char *)msg);
  }
  /* JIT where PCRE2 has it; else the interpreter (slower, same matches) */
  int jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
  t->jit = t->n_split == 0 ? jit : t->jit && jit;
  t->re[t->n_split++] = re;
  return 0;
}

static int check_pre_tokenizer(struct tokenizer *t, const cJSON *p, char *err, size_t el) {
  if (!p || strcmp(type_of(p), "Sequence"))
    return fail(err, el, "pre_tokenizer: type %s is not supported (cedar implements a Sequence of Split steps "
                "then ByteLevel)", p ? type_of(p) : "null");
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
  int n = cJSON_GetArraySize(list), i = 0, byte_level = 0;
  for (const cJSON *s = list ? list->child : NULL; s; s = s->next, i++) {
    if (byte_level) return fail(err, el, "pre_tokenizer.pretokenizers[%d]: a step after ByteLevel is not supported", i);
    if (!strcmp(type_of(s), "Split")) {
      if (add_split(t, s, i, err, el)) return -1;
    } else if (!strcmp(type_of(s), "ByteLevel")) {
      if (!is_false_or_absent(s, "add_prefix_space") || !is_false_or_absent(s, "use_regex"))
        return fail(err, el, "pre_tokenizer.pretokenizers[%d]: ByteLevel with add_prefix_space or use_regex true is "
                    "not supported", i);
      byte_level = 1;
    } else {
      return fail(err, el, "pre_tokenizer.pretokenizers[%d]: type %s is not supported", i, type_of(s));
    }
  }
  if (!byte_level || n == 0) return fail(err, el, "pre_tokenizer: the Sequence must end with ByteLevel");
  return 0;
}

static int check_model(const cJSON *m, char *err, size_t el) {
  if (!m || strcmp(type_of(m), "BPE")) return fail(err, el, "model: type %s is not supported (only BPE)", type_of(m));
  static const char *const off[] = {"dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix",
                                    "ignore_merges"};
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, off[i]);
    if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
      return fail(err, el, "model.%s is set; cedar's BPE does not implement it", off[i]);
  }
  return 0;
}

static int check_decoders(const cJSON *root, char *err, size_t el) {
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  if (!d || strcmp(type_of(d), "ByteLevel"))
    return fail(err, el, "decoder: type %s is not supported (only ByteLevel)", d ? type_of(d) : "null");
  const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
  if (pp && !cJSON_IsNull(pp) && strcmp(type_of(pp), "ByteLevel"))
    return fail(err, el, "post_processor: type %s is not supported (null or ByteLevel)", type_of(pp));
  return 0;
}

/* ---- tables -------------------------------------------------------------- */

static int grow_ids(struct tokenizer *t, int n) {
  if (n <= t->n_ids) return 0;
  struct tok_span *s = realloc(t->str, (size_t)n * sizeof *s), *d = NULL;
  if (s) t->str = s;
  if (!s || !(d = realloc(t->dec, (size_t)n * sizeof *d))) return -1;
  t->dec = d;
  uint8_t *f[3] = {t->has, t->added, t->special};
  for (int k = 0; k < 3; k++) {
    uint8_t *p = realloc(f[k], (size_t)n);
    if (!p) return -1;
    memset(p + t->n_ids, 0, (size_t)(n - t->n_ids));
    f[k] = p;
  }
  t->has = f[0], t->added = f[1], t->special = f[2];
  memset(t->str + t->n_ids, 0, (size_t)(n - t->n_ids) * sizeof *s);
  t->n_ids = n;
  return 0;
}

static int read_vocab(struct tokenizer *t, const cJSON *vocab, const cJSON *added, char *err, size_t el) {
  int max_id = -1, n = 0;
  for (const cJSON *v = vocab->child; v; v = v->next, n++) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e8)
      return fail(err, el, "model.vocab: \"%s\" has no valid id", v->string);
    if (v->valueint > max_id) max_id = v->valueint;
  }
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 1e8)
      return fail(err, el, "added_tokens: an entry has no valid id");
    if (id->valueint > max_id) max_id = id->valueint;
    n++;
  }
  if (max_id < 0) return fail(err, el, "model.vocab is empty");
  if (grow_ids(t, max_id + 1)) return fail(err, el, "out of memory");
  t->vmask = pow2_above((size_t)n) - 1;
  if (!(t->vmap = malloc(((size_t)t->vmask + 1) * sizeof *t->vmap))) return fail(err, el, "out of memory");
  memset(t->vmap, 0xff, ((size_t)t->vmask + 1) * sizeof *t->vmap);
  for (const cJSON *v = vocab->child; v; v = v->next) {
    int id = v->valueint;
    if (t->has[id]) return fail(err, el, "model.vocab: id %d appears twice", id);
    t->str[id] = pool_add(t, v->string, strlen(v->string));
    if (t->str[id].len == UINT32_MAX) return fail(err, el, "out of memory");
    t->has[id] = 1;
    vocab_put(t, id);
  }
  return 0;
}

static int trie_child(struct tokenizer *t, int node, uint8_t b, int make) {
  if (node == 0 && t->root[b] >= 0) return t->root[b];
  uint64_t key = ((uint64_t)node << 8 | b) + 1;
  uint32_t i = tok_pair_hash(key) & t->tmask;
  for (; t->tkey[i]; i = (i + 1) & t->tmask)
    if (t->tkey[i] == key) return t->tchild[i];
  if (!make) return -1;
  if (t->n_nodes == t->nodes_cap) return -2;
  int c = t->n_nodes++;
  t->tnode_id[c] = -1;
  if (node == 0) t->root[b] = c;
  else t->tkey[i] = key, t->tchild[i] = c;
  return c;
}

static int read_added(struct tokenizer *t, const cJSON *added, char *err, size_t el) {
  size_t bytes = 1;
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
    if (!cJSON_IsString(c) || !c->valuestring[0]) return fail(err, el, "added_tokens: an entry has no content");
    bytes += strlen(c->valuestring);
  }
  t->nodes_cap = (int)bytes;
  t->tmask = pow2_above(bytes) - 1;
  t->tnode_id = malloc(bytes * sizeof *t->tnode_id);
  t->tkey = calloc((size_t)t->tmask + 1, sizeof *t->tkey);
  t->tchild = malloc(((size_t)t->tmask + 1) * sizeof *t->tchild);
  if (!t->tnode_id || !t->tkey || !t->tchild) return fail(err, el, "out of memory");
  memset(t->root, 0xff, sizeof t->root);
  t->n_nodes = 1, t->tnode_id[0] = -1;
  int i = 0;
  for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
    const char *c = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
    int id = cJSON_GetObjectItemCaseSensitive(a, "id")->valueint;
    static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
    for (int k = 0; k < 3; k++)
      if (!is_false_or_absent(a, flags[k]))
        return fail(err, el, "added_tokens[%d] (%s): %s true is not supported", i, c, flags[k]);
    size_t len = strlen(c);
    if (t->has[id] && (t->str[id].len != len || memcmp(t->pool + t->str[id].off, c, len)))
      return fail(err, el, "added_tokens[%d]: id %d is \"%s\" in model.vocab but \"%s\" here", i, id,
                  t->pool + t->str[id].off, c);
    if (!t->has[id]) {
      t->str[id] = pool_add(t, c, len);
      if (t->str[id].len == UINT32_MAX) return fail(err, el, "out of memory");
      t->has[id] = 1;
    }
    t->added[id] = 1;
    t->special[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
    int node = 0;
    for (size_t k = 0; k < len; k++) node = trie_child(t, node, (uint8_t)c[k], 1);
    CEDAR_ASSERT(node > 0);
    t->tnode_id[node] = id;
  }
  return 0;
}

/* One merge "a b" (old format) or ["a", "b"]: its ids and result. */
static int read_merge(struct tokenizer *t, const cJSON *m, int rank, char *err, size_t el) {
  char buf[1024];
  const char *a, *b;
  size_t la, lb;
  if (cJSON_IsString(m)) {
    const char *s = m->valuestring, *sp = strchr(s, ' ');
    if (!sp || strchr(sp + 1, ' ')) return fail(err, el, "model.merges[%d]: \"%s\" is not two tokens", rank, s);
    a = s, la = (size_t)(sp - s), b = sp + 1, lb = strlen(b);
  } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
             cJSON_IsString(m->child->next)) {
    a = m->child->valuestring, la = strlen(a), b = m->child->next->valuestring, lb = strlen(b);
  } else {
    return fail(err, el, "model.merges[%d] is neither \"a b\" nor [a, b]", rank);
  }
  if (la + lb >= sizeof buf) return fail(err, el, "model.merges[%d]: tokens longer than %zu bytes", rank, sizeof buf);
  memcpy(buf, a, la), memcpy(buf + la, b, lb);
  int32_t ia = vocab_find(t, a, la), ib = vocab_find(t, b, lb), ir = vocab_find(t, buf, la + lb);
  if (ia < 0 || ib < 0 || ir < 0)
    return fail(err, el, "model.merges[%d]: \"%.*s\" + \"%.*s\" names a token not in model.vocab", rank, (int)la, a,
                (int)lb, b);
  uint64_t key = tok_pair_key(ia, ib);
  uint32_t i = tok_pair_hash(key) & t->mmask;
  for (; t->merge[i]; i = (i + 1) & t->mmask)
    if ((t->merge[i] & TOK_KEY_MASK) == key) return 0; /* a repeated merge keeps its first (lowest) rank */
  t->merge[i] = key | (uint64_t)rank << (2 * TOK_ID_BITS);
  t->rank_pair[3 * rank] = ia, t->rank_pair[3 * rank + 1] = ib, t->rank_pair[3 * rank + 2] = ir;
  return 0;
}

static int read_merges(struct tokenizer *t, const cJSON *merges, char *err, size_t el) {
  int n = cJSON_GetArraySize(merges), r = 0;
  if (t->n_ids > (1 << TOK_ID_BITS) || n >= (1 << 24))
    return fail(err, el, "%d ids and %d merges: cedar's merge table holds ids below 2^%d and ranks below 2^24",
                t->n_ids, n, TOK_ID_BITS);
  t->mmask = pow2_above((size_t)n) - 1;
  t->merge = calloc((size_t)t->mmask + 1, sizeof *t->merge);
  t->rank_pair = malloc((size_t)(n > 0 ? n : 1) * 3 * sizeof *t->rank_pair);
  if (!t->merge || !t->rank_pair) return fail(err, el, "out of memory");
  memset(t->rank_pair, 0xff, (size_t)(n > 0 ? n : 1) * 3 * sizeof *t->rank_pair);
  for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next, r++)
    if (read_merge(t, m, r, err, el)) return -1;
  t->n_merges = n;
  return 0;
}

/* The byte tokens, and every id's decoded bytes (ByteLevel decoder). */
static int byte_tables(struct tokenizer *t, char *err, size_t el) {
  int32_t cp_byte[512];
  memset(cp_byte, 0xff, sizeof cp_byte);
  for (int b = 0; b < 256; b++) {
    uint8_t u[4];
    uint32_t cp = tok_byte_cp(b);
    int n = tok_utf8_put(cp, u);
    cp_byte[cp] = b;
    if ((t->byte_id[b] = vocab_find(t, (const char *)u, (size_t)n)) < 0)
      return fail(err, el, "model.vocab lacks the byte-level token of byte 0x%02x: not a byte-level BPE", b);
  }
  char *buf = malloc(1 << 16);
  if (!buf) return fail(err, el, "out of memory");
  for (int id = 0; id < t->n_ids; id++) {
    if (!t->has[id]) {
      t->dec[id] = (struct tok_span){0, 0};
      continue;
    }
    const uint8_t *s = (const uint8_t *)t->pool + t->str[id].off;
    size_t len = t->str[id].len, o = 0, k = 0;
    int raw = 0;
    while (k < len && !raw) {
      int cl = tok_utf8_char_len(s + k, len - k);
      uint32_t cp = 0;
      if (cl == 1) cp = s[k];
      else if (cl == 2) cp = (s[k] & 0x1fu) << 6 | (s[k + 1] & 0x3fu);
      if (cl == 0 || cl > 2 || cp >= 512 || cp_byte[cp] < 0 || o >= (1 << 16)) raw = 1;
      else buf[o++] = (char)cp_byte[cp], k += (size_t)cl;
    }
    t->dec[id] = raw ? t->str[id] : pool_add(t, buf, o);
    if (t->dec[id].len == UINT32_MAX) return free(buf), fail(err, el, "out of memory");
  }
  free(buf);
  return 0;
}

static char *read_file(const char *path, size_t *len, char *err, size_t el) {
  return cedar_read_all(path, CEDAR_TEXT_MAX, len, err, el); /* base/file.h: bounded, no FIFO or device */
}

struct tokenizer *tok_load(const char *path, char *err, size_t el) {
  size_t len;
  char *text = read_file(path, &len, err, el);
  if (!text) return NULL;
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (!root) return fail(err, el, "%s: not valid JSON", path), NULL;
  struct tokenizer *t = calloc(1, sizeof *t);
  char why[512] = "out of memory";
  int rc = !t;
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  const cJSON *vocab = model ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
  if (!rc) rc = check_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), why, sizeof why) ||
                check_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), why, sizeof why) ||
                check_model(model, why, sizeof why) || check_decoders(root, why, sizeof why);
  if (!rc && !cJSON_IsObject(vocab)) rc = fail(why, sizeof why, "model.vocab is missing");
  if (!rc && added && !cJSON_IsArray(added)) rc = fail(why, sizeof why, "added_tokens is not a list");
  if (!rc) rc = read_vocab(t, vocab, added, why, sizeof why) || read_added(t, added, why, sizeof why) ||
                read_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), why, sizeof why) ||
                byte_tables(t, why, sizeof why);
  if (!rc && (!(t->md = pcre2_match_data_create(1, NULL)) || !(t->cache = calloc(TOK_CACHE_SLOTS, sizeof *t->cache))))
    rc = fail(why, sizeof why, "out of memory");
  cJSON_Delete(root);
  if (rc) {
    fail(err, el, "%s: %s", path, why);
    tok_free(t);
    return NULL;
  }
  return t;
}

void tok_free(struct tokenizer *t) {
  if (!t) return;
  for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->re[i]);
  pcre2_match_data_free(t->md);
  free(t->pool), free(t->str), free(t->dec), free(t->has), free(t->added), free(t->special);
  free(t->vmap), free(t->merge), free(t->rank_pair), free(t->cache);
  free(t->tnode_id), free(t->tkey), free(t->tchild);
  free(t->clean), free(t->sym), free(t->next), free(t->prev), free(t->heap);
  free(t);
}

int tok_n_ids(const struct tokenizer *t) { return t->n_ids; }

int tok_added_id(const struct tokenizer *t, const char *text) {
  int node = 0;
  for (const char *p = text; *p && node >= 0; p++) node = trie_child((struct tokenizer *)t, node, (uint8_t)*p, 0);
  return node > 0 ? t->tnode_id[node] : -1;
}

int tok_is_special(const struct tokenizer *t, int id) { return id >= 0 && id < t->n_ids && t->special[id]; }

const char *tok_token_string(const struct tokenizer *t, int id) {
  return id >= 0 && id < t->n_ids && t->has[id] ? t->pool + t->str[id].off : NULL;
}

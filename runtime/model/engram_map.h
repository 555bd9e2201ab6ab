/* engram_map.h: the Engram token map (Appendix V #18, issue 13 section 2):
 * token id -> compressed id, built from the tokenizer.
 *
 * For each id in order (0 .. tok_n_ids - 1):
 *   text = the id decoded alone (ill-formed UTF-8 -> U+FFFD);
 *   if text holds U+FFFD: key = the raw token string (the byte-level form);
 *   else key = N(text), or text itself when N(text) is empty, where N is
 *     NFKC, then NFD, then drop every combining mark of category Mn, then
 *     lowercase (per code point, utf8proc_tolower), then each run of
 *     [ \t\r\n] -> one space; a result that is exactly " " stays " ";
 *     otherwise strip White_Space (Unicode's property) at both ends;
 *   the compressed id of a key is the order of its first appearance.
 * The Unicode work is utf8proc's (Debian libutf8proc), not a hand table.
 * On the npm DeepSeek-V3 tokenizer this gives 99045 keys (tests/
 * test_engram_map.c checks that, and the whole map against Python's
 * unicodedata). An id with no token (a gap in the vocabulary) has the key
 * "" [cedar].
 *
 * The engine's use: rt_model_set_cmap(M, map, n_ids, n_distinct, ...)
 * (runtime/model/model.h), which refuses n_distinct != compressed_vocab.
 * Test: tests/test_engram_map.c (ctest -R engram_map).
 */
#ifndef CEDAR_RUNTIME_ENGRAM_MAP_H
#define CEDAR_RUNTIME_ENGRAM_MAP_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* The key of one id's decoded bytes (see above), malloc'ed, NUL-terminated,
 * length in *len; raw is the token string used when the text holds
 * U+FFFD. NULL on allocation failure. */
char *rt_engram_key(const uint8_t *bytes, size_t n, const char *raw, size_t *len);

/* Build the map: *map (malloc'ed, tok_n_ids(t) entries), *n_distinct keys.
 * Returns 0, or CEDAR_ENOMEM / CEDAR_EINVAL with err set. */
int rt_engram_map_build(const struct tokenizer *t, int32_t **map, int *n_ids, int *n_distinct, char *err,
                        size_t err_len);

/* The engine's call: build t's map and give it to M (rt_model_set_cmap)
 * when its size is model.engram.compressed_vocab. A different size is an
 * error (CEDAR_EINVAL, err says both sizes) for a released checkpoint
 * (released true); otherwise M keeps id mod compressed_vocab and a warning
 * says so. No Engram layer: nothing to do. Returns 0 or a cedar_status. */
struct rt_model;
int rt_model_use_tokenizer(struct rt_model *M, const struct tokenizer *t, int released, char *err, size_t err_len);

#endif

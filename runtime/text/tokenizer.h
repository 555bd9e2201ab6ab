/* tokenizer.h: the DeepSeek-V3-family tokenizer (issue 13 section 3): a
 * byte-level BPE read from a Hugging Face tokenizer.json.
 *
 * What tokenizer.json says, and what cedar does with it (anything else is
 * refused at load with the field and the reason, never ignored):
 *   - normalizer: null or an empty Sequence (nothing to do);
 *   - pre_tokenizer: a Sequence of Split {Regex, behavior Isolated, invert
 *     false} steps, then ByteLevel {add_prefix_space false, use_regex
 *     false}. Each Split runs its regex (PCRE2, UTF + UCP, JIT) over every
 *     piece the step before produced; matches and the gaps between them both
 *     become pieces, in order;
 *   - model: BPE without dropout, byte fallback, subword prefix/suffix or
 *     ignore_merges; each piece's bytes become the byte-level alphabet's
 *     tokens (the GPT-2 byte-to-unicode map), then the pair of lowest merge
 *     rank is merged, leftmost first among equals, until none is left;
 *   - added_tokens (special or not, lstrip/rstrip/single_word false): found
 *     in the text before anything else, leftmost-longest, and emitted as
 *     their ids; the text between them goes through the pipeline above;
 *   - post_processor: null or ByteLevel (offsets only: ids unchanged);
 *   - decoder: ByteLevel: each token's characters back to bytes through the
 *     inverse map; a token with a character outside it (the added tokens'
 *     text) is its own UTF-8 bytes.
 * Input text that is not valid UTF-8 is first repaired: each maximal
 * ill-formed subsequence becomes U+FFFD (Unicode 15 s3.9, as a browser's
 * TextDecoder does). Known divergence from the JS implementation: `\s` is
 * PCRE2's Unicode space (as the Rust reference's), so U+FEFF is not a space
 * here while JavaScript's \s counts it.
 *
 * Not thread-safe per object for encode (scratch buffers are owned by the
 * tokenizer); decode is const. Test: tests/test_tokenizer.c, tests/cli/
 * tokenizer_js.sh (against @lenml/tokenizers), tests/fuzz/fuzz_tokenizer.c.
 */
#ifndef CEDAR_RUNTIME_TOKENIZER_H
#define CEDAR_RUNTIME_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* The tokenizer.json the build found in the npm cache (make install-deps),
 * or NULL when the build found none. */
const char *tok_default_path(void);

/* Load tokenizer.json at path. NULL on failure with err set (the field and
 * the reason, or the file error). */
struct tokenizer *tok_load(const char *path, char *err, size_t err_len);
void tok_free(struct tokenizer *t);

/* ids = 1 + the largest token id (vocabulary and added tokens). */
int tok_n_ids(const struct tokenizer *t);
/* The id of an added/special token's exact text, or -1. */
int tok_added_id(const struct tokenizer *t, const char *text);
/* 1 when id is an added token marked special. */
int tok_is_special(const struct tokenizer *t, int id);
/* The vocabulary string of id (byte-level alphabet; an added token's text),
 * or NULL for an id with no token. */
const char *tok_token_string(const struct tokenizer *t, int id);

/* Encode len bytes of text (any bytes, at most TOK_MAX_TEXT) into ids, no
 * BOS/EOS added. *ids is a malloc'ed array of *n ids (realloc'ed from the
 * caller's, may start NULL with *cap 0). Returns 0, CEDAR_EINVAL (text
 * longer than TOK_MAX_TEXT) or CEDAR_ENOMEM. */
#define TOK_MAX_TEXT ((size_t)1 << 29)
int tok_encode(struct tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap);

/* The bytes of one id as the decoder gives them (not necessarily UTF-8 on
 * its own), or NULL with *len 0 for an id with no token. */
const uint8_t *tok_id_bytes(const struct tokenizer *t, int id, size_t *len);

/* Decode n ids: the bytes appended to a malloc'ed *out (*out_len, *out_cap
 * as for tok_encode; NUL-terminated) then repaired to UTF-8 (U+FFFD for
 * ill-formed bytes) as Hugging Face's decode does. skip_special drops
 * special tokens. Returns 0, CEDAR_EINVAL (an id with no token: *bad_id
 * set) or CEDAR_ENOMEM. */
int tok_decode(const struct tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *out_len, size_t *out_cap, int *bad_id);

/* Streaming decode: feed ids one by one; complete UTF-8 characters come
 * out, an incomplete trailing sequence is held back until its bytes arrive
 * (or tok_stream_finish, which repairs what is left). */
struct tok_stream {
  uint8_t held[4];
  int n_held;
};
/* Append the text that id completes to *out (as tok_decode). Returns 0,
 * CEDAR_EINVAL (no such id) or CEDAR_ENOMEM. */
int tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int id, char **out, size_t *out_len,
                    size_t *out_cap);
int tok_stream_finish(struct tok_stream *s, char **out, size_t *out_len, size_t *out_cap);

/* Repair len bytes into valid UTF-8 (each maximal ill-formed subsequence ->
 * U+FFFD), appended to *out. Returns 0 or CEDAR_ENOMEM. */
int tok_utf8_repair(const uint8_t *in, size_t len, char **out, size_t *out_len, size_t *out_cap);
/* Length of the valid UTF-8 character at s (n bytes left), 0 if ill-formed
 * or incomplete. */
int tok_utf8_char_len(const uint8_t *s, size_t n);

#endif

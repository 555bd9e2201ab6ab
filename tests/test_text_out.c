/* test_text_out.c: runtime/text/text_out.h, generated ids to streamed text with
 * EOS and stop strings, on a byte tokenizer written here (id b < 256 is
 * byte b; 256 is "<eos>", special; 257 is "<sep>", special), so every
 * split of a UTF-8 character and of a stop string across ids can be made.
 *
 * What it checks:
 *   - a character split across ids is emitted whole, once complete;
 *     EOS ends with its text left out; max-new flushes what was held;
 *   - a stop string split across ids: nothing of it is emitted, the text is
 *     cut before it; a proper prefix of a stop string is held back and
 *     released when the next id rules it out; equal starts take the longer
 *     stop; a stop string completed by the final repair (U+FFFD) counts;
 *   - special tokens other than EOS print as their text; an id with no
 *     token ends with TEXT_ERROR and the id;
 *   - 2000 random id streams (letters, multi-byte pieces, bytes that are not
 *     UTF-8, <sep>) with random stop strings: the emitted pieces concatenate
 *     to the final text, and the final text and the id it ended at equal a
 *     reference built from whole decodes (tok_decode of each prefix of the
 *     ids: the first prefix whose text holds a stop string, cut at the
 *     earliest start there).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/text/text_out.h"
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

static struct tokenizer *byte_tokenizer(void) {
  static char buf[1 << 15];
  size_t o = 0;
  o += (size_t)snprintf(buf + o, sizeof buf - o,
                        "{\"version\":\"1.0\",\"added_tokens\":["
                        "{\"id\":256,\"content\":\"<eos>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                        "\"normalized\":false,\"special\":true},"
                        "{\"id\":257,\"content\":\"<sep>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
                        "\"normalized\":false,\"special\":true}],"
                        "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+\"},\"behavior\":\"Isolated\","
                        "\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
                        "\"use_regex\":false}]},\"post_processor\":null,"
                        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"dropout\":null,"
                        "\"unk_token\":null,\"vocab\":{");
  for (int b = 0; b < 256; b++) {
    char c[3] = {0};
    byte_char(b, c);
    o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"%s%s\":%d", b ? "," : "", c[0] == '"' || c[0] == '\\' ? "\\" : "",
                          c, b);
  }
  o += (size_t)snprintf(buf + o, sizeof buf - o, "},\"merges\":[]}}");
  char path[128], err[512];
  snprintf(path, sizeof path, "/tmp/cedar_test_text_out_%d.json", (int)getpid());
  FILE *f = fopen(path, "w");
  fwrite(buf, 1, o, f);
  fclose(f);
  struct tokenizer *t = tok_load(path, err, sizeof err);
  unlink(path);
  EXPECT(t != NULL, "byte tokenizer: %s", err);
  return t;
}

struct sink {
  char buf[4096];
  size_t n;
  int calls;
};

static void collect(void *user, const char *s, size_t n) {
  struct sink *k = user;
  memcpy(k->buf + k->n, s, n);
  k->n += n;
  k->buf[k->n] = 0;
  k->calls++;
}

static void start(struct text_out *o, struct tokenizer *t, const char *const *stops, int n, struct sink *k) {
  memset(o, 0, sizeof *o);
  memset(k, 0, sizeof *k);
  o->tok = t, o->eos_id = 256, o->stops = stops, o->n_stops = n, o->emit = collect, o->user = k;
  text_out_init(o);
}

/* Push the bytes of s as ids; returns the index of the id that ended it, or -1. */
static int push_bytes(struct text_out *o, const char *s) {
  for (int i = 0; s[i]; i++)
    if (text_out_push(o, (unsigned char)s[i])) return i;
  return -1;
}

static void test_cases(struct tokenizer *t) {
  struct text_out o;
  struct sink k;
  start(&o, t, NULL, 0, &k);
  text_out_push(&o, 'h');
  text_out_push(&o, 0xc3);
  EXPECT(k.n == 1, "the first byte of é is held (%zu emitted)", k.n);
  text_out_push(&o, 0xa9);
  EXPECT(k.n == 3 && !strcmp(k.buf, "hé"), "é emitted once complete: '%s'", k.buf);
  EXPECT(text_out_push(&o, 256) == 1 && o.end == TEXT_EOS && !strcmp(o.text, "hé") && !strcmp(k.buf, "hé"),
         "EOS ends, its text left out: end %d '%s'", o.end, o.text);
  EXPECT(text_out_push(&o, 'x') == 1 && !strcmp(o.text, "hé"), "nothing after the end");
  text_out_free(&o);

  const char *s1[] = {"lo w"};
  start(&o, t, s1, 1, &k);
  int at = push_bytes(&o, "hello world");
  EXPECT(at == 6 && o.end == TEXT_STOP && o.stop == 0 && !strcmp(o.text, "hel") && !strcmp(k.buf, "hel"),
         "stop 'lo w' ends at id 6 with 'hel': at %d end %d text '%s' emitted '%s'", at, o.end, o.text, k.buf);
  text_out_free(&o);

  const char *s2[] = {"xyz"};
  start(&o, t, s2, 1, &k);
  push_bytes(&o, "abxy");
  EXPECT(!strcmp(k.buf, "ab"), "a prefix of a stop string is held: '%s'", k.buf);
  push_bytes(&o, "q");
  EXPECT(!strcmp(k.buf, "abxyq"), "released when ruled out: '%s'", k.buf);
  push_bytes(&o, "xy");
  text_out_finish(&o);
  EXPECT(o.end == TEXT_MAX_NEW && !strcmp(k.buf, "abxyqxy") && !strcmp(o.text, "abxyqxy"), "max-new flushes: '%s'",
         k.buf);
  text_out_free(&o);

  const char *s3[] = {"ab", "abc", "b"};
  start(&o, t, s3, 3, &k);
  EXPECT(text_out_push(&o, 'a') == 0, "'a' alone is only a prefix");
  EXPECT(text_out_push(&o, 'b') == 1 && o.stop == 0 && !strcmp(o.text, ""), "'ab' completes first: stop %d", o.stop);
  text_out_free(&o);

  const char *s4[] = {"\xef\xbf\xbd"};
  start(&o, t, s4, 1, &k);
  push_bytes(&o, "ok\xe4\xb8");
  EXPECT(o.end == TEXT_RUNNING && !strcmp(k.buf, "ok"), "a partial character is no U+FFFD yet");
  text_out_finish(&o);
  EXPECT(o.end == TEXT_STOP && !strcmp(o.text, "ok"), "the final repair's U+FFFD meets the stop: end %d", o.end);
  text_out_free(&o);

  start(&o, t, NULL, 0, &k);
  text_out_push(&o, 'a');
  text_out_push(&o, 257);
  EXPECT(!strcmp(k.buf, "a<sep>"), "a special token other than EOS prints as its text: '%s'", k.buf);
  EXPECT(text_out_push(&o, 9999) == 1 && o.end == TEXT_ERROR && o.bad_id == 9999 && o.err,
         "an id with no token ends with TEXT_ERROR");
  EXPECT(!strcmp(text_end_name(o.end), "error"), "name");
  text_out_free(&o);
}

static uint64_t lcg = 88172645463325252ull;
static unsigned rnd(unsigned n) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return (unsigned)(lcg >> 33) % n;
}

/* The reference: the first prefix ids[0..i] whose whole decode holds a stop
 * string, cut at the earliest start (longer on equal starts). */
static int reference(struct tokenizer *t, const int32_t *ids, int n, const char *const *stops, int ns, char *out) {
  char *d = NULL;
  size_t len = 0, cap = 0;
  int bad;
  for (int i = 0; i < n; i++) {
    if (ids[i] == 256) { /* EOS: the text so far, the trailing partial repaired */
      len = 0;
      tok_decode(t, ids, (size_t)i, 0, &d, &len, &cap, &bad);
      strcpy(out, d);
      free(d);
      return i;
    }
    len = 0;
    tok_decode(t, ids, (size_t)i + 1, 0, &d, &len, &cap, &bad);
    char *best = NULL;
    size_t best_len = 0;
    for (int k = 0; k < ns; k++) {
      char *p = strstr(d, stops[k]);
      if (p && (!best || p < best || (p == best && strlen(stops[k]) > best_len))) best = p, best_len = strlen(stops[k]);
    }
    if (best) {
      *best = 0;
      strcpy(out, d);
      free(d);
      return i;
    }
  }
  len = 0;
  tok_decode(t, ids, (size_t)n, 0, &d, &len, &cap, &bad);
  strcpy(out, d);
  free(d);
  return -1;
}

static void test_random(struct tokenizer *t) {
  static const char *pieces[] = {"a", "b", "c", " ", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xff", "\xe4\xb8"};
  static const char *pool[] = {"ab", "ba", "cc", "a c", "\xc3\xa9" "b", "\xe4\xb8\xad\xe4", "aaa", "<sep>b"};
  int failures = 0, ended_by_stop = 0;
  for (int rep = 0; rep < 2000 && failures < 5; rep++) {
    int32_t ids[64];
    int n = 0;
    while (n < 40) {
      unsigned r = rnd(20);
      if (r == 0) {
        ids[n++] = 257;
      } else if (r == 1 && rep % 4 == 0) {
        ids[n++] = 256;
      } else {
        const char *p = pieces[rnd(9)];
        for (int i = 0; p[i] && n < 40; i++) ids[n++] = (unsigned char)p[i];
      }
    }
    const char *stops[3];
    int ns = (int)rnd(4);
    for (int k = 0; k < ns; k++) stops[k] = pool[rnd(8)];
    char want[1024];
    int want_at = reference(t, ids, n, stops, ns, want);
    struct text_out o;
    struct sink k;
    start(&o, t, stops, ns, &k);
    int at = -1;
    for (int i = 0; i < n && at < 0; i++)
      if (text_out_push(&o, ids[i])) at = i;
    text_out_finish(&o);
    ended_by_stop += o.end == TEXT_STOP;
    bool ok = at == want_at && !strcmp(o.text, want) && k.n == o.len && !memcmp(k.buf, o.text, o.len);
    if (!ok) failures++;
    EXPECT(ok, "rep %d: ended at %d (reference %d), text '%s' (reference '%s'), emitted '%s'", rep, at, want_at, o.text,
           want, k.buf);
    text_out_free(&o);
  }
  EXPECT(ended_by_stop > 300, "only %d random streams ended at a stop string", ended_by_stop);
}

int main(void) {
  struct tokenizer *t = byte_tokenizer();
  if (!t) return h_report("text_out");
  test_cases(t);
  test_random(t);
  tok_free(t);
  return h_report("text_out");
}

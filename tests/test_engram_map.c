/* test_engram_map.c: the Engram token map (runtime/model/engram_map.h).
 *
 * What it is:
 *   - keys of hand-made texts: case, accents (NFD + Mn), compatibility forms
 *     (NFKC: the fi ligature, full-width letters, the ideographic space),
 *     whitespace runs -> one space, a lone space kept, strip, empty ->
 *     the text itself, U+FFFD -> the raw token string;
 *   - on the npm DeepSeek-V3 tokenizer (skipped without it): 128815 ids
 *     give 99045 keys (issue 13), ids by first appearance, and the whole map
 *     equal to one computed by Python's unicodedata (NFKC, NFD, category
 *     Mn, str.lower, re.sub, str.strip) from the ids' decoded bytes and
 *     token strings, which this test dumps (skipped without python3);
 *   - rt_model_use_tokenizer (the engine's call): the map taken when its
 *     size is compressed_vocab, refused for a released checkpoint of
 *     another size, id mod compressed_vocab kept (and said) otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "runtime/model/engram_map.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "scheduler/plan.h"
#include "tests/harness.h"

static void key_is(const char *text, const char *raw, const char *want) {
  size_t len;
  char *k = rt_engram_key((const uint8_t *)text, strlen(text), raw, &len);
  EXPECT(k && len == strlen(want) && !memcmp(k, want, len), "key of '%s' is '%s', want '%s'", text, k ? k : "(null)",
         want);
  free(k);
}

static void check_keys(void) {
  key_is(" Hello", "", "hello");
  key_is("\xc3\x89t\xc3\xa9", "", "ete");                   /* Été: accents dropped */
  key_is("\xef\xac\x81", "", "fi");                          /* the ligature fi (NFKC) */
  key_is("\xef\xbc\xa1\xef\xbc\xa2", "", "ab");              /* full-width AB */
  key_is("\t\n", "", " ");                                   /* a run -> one lone space, kept */
  key_is("   ", "", " ");
  key_is("\xe3\x80\x80", "", " ");                           /* ideographic space: NFKC -> space */
  key_is(" a  b\t", "", "a b");                              /* collapse, then strip */
  key_is("\xc2\xa0x\xe2\x80\x83", "", "x");                  /* NBSP -> space (NFKC), em space -> space */
  key_is("\xcc\x81", "", "\xcc\x81");                        /* a lone combining acute: empty -> the text */
  key_is("\xe4\xbd\xa0\xe5\xa5\xbd", "", "\xe4\xbd\xa0\xe5\xa5\xbd");
  key_is("\xe2\x80\x8b", "", "\xe2\x80\x8b");                /* zero-width space: not White_Space */
  key_is("\xe2", "\xc3\xa2", "\xc3\xa2");                    /* a partial character: U+FFFD -> raw */
  key_is("\xef\xbf\xbd", "\xc3\xaf\xc2\xbf\xc2\xbd", "\xc3\xaf\xc2\xbf\xc2\xbd"); /* U+FFFD itself -> raw */
}

/* rt_model_use_tokenizer on a model with only the fields it reads: the map
 * is taken when its size is compressed_vocab (ids past the tokenizer take
 * the pad's key), refused for a released checkpoint otherwise, and kept as
 * id mod compressed_vocab with a note for a plan of another size. */
static void reset_model(struct rt_model *M, struct plan *p, int cvocab) {
  p->model.vocab = 129280, p->model.engram_compressed_vocab = cvocab, p->model.engram_pad_id = 2;
  M->p = p;
  for (int i = 0; i < 129280; i++) M->cmap[i] = i % cvocab;
  M->cmap_source = "modulo";
}

static void check_engine_use(const struct tokenizer *t, const int32_t *map, int n) {
  static struct plan p;
  struct rt_model M = {0};
  M.cmap = malloc(sizeof(int32_t) * 129280);
  char err[512] = "";
  reset_model(&M, &p, 99045);
  EXPECT(rt_model_use_tokenizer(&M, t, 1, err, sizeof err) == 0, "the map fits: %s", err);
  int same = 1;
  for (int i = 0; i < 129280; i++) same &= M.cmap[i] == (i < n ? map[i] : map[2]);
  EXPECT(same, "the model's map is the tokenizer's (padding ids take the pad's key)");
  EXPECT(strstr(M.cmap_source, "tokenizer") != NULL, "the source names the tokenizer: %s", M.cmap_source);
  reset_model(&M, &p, 99092); /* the release's size: this tokenizer is not V4.1's own */
  EXPECT(rt_model_use_tokenizer(&M, t, 1, err, sizeof err) == CEDAR_EINVAL && strstr(err, "99045") &&
             strstr(err, "99092"),
         "a released checkpoint refuses a map of another size: %s", err);
  EXPECT(rt_model_use_tokenizer(&M, t, 0, err, sizeof err) == 0 && M.cmap[100000] == 100000 % 99092 &&
             strstr(M.cmap_source, "id mod"),
         "a synthetic plan keeps id mod compressed_vocab and says so");
  free(M.cmap);
}

static void check_npm(void) {
  const char *path = tok_default_path();
  if (!path) {
    printf("SKIP part: no npm tokenizer found by this build (make install-deps)\n");
    return;
  }
  char err[512];
  struct tokenizer *t = tok_load(path, err, sizeof err);
  EXPECT(t != NULL, "tokenizer: %s", t ? "" : err);
  if (!t) return;
  int32_t *map = NULL;
  int n = 0, d = 0;
  EXPECT(rt_engram_map_build(t, &map, &n, &d, err, sizeof err) == 0, "map builds: %s", err);
  EXPECT(n == 128815, "ids %d", n);
  EXPECT(d == 99045, "the npm V3 tokenizer gives 99045 keys (issue 13); got %d", d);
  int seen = 0, order = 1;
  for (int i = 0; i < n; i++) { /* first appearance: a new key is the next number */
    if (map[i] == seen) seen++;
    else order &= map[i] >= 0 && map[i] < seen;
  }
  EXPECT(order && seen == d, "ids numbered by first appearance");
  check_engine_use(t, map, n);
  /* Python's unicodedata, from the same decoded bytes */
  char dump[64], cmd[4096];
  snprintf(dump, sizeof dump, "/tmp/cedar_engram_map_%d.txt", (int)getpid()); /* one per process: ctest -j */
  FILE *f = fopen(dump, "w");
  for (int i = 0; f && i < n; i++) {
    size_t l;
    const uint8_t *b = tok_id_bytes(t, i, &l);
    for (size_t k = 0; k < l; k++) fprintf(f, "%02x", b[k]);
    fputc(' ', f);
    for (const char *p = tok_token_string(t, i); p && *p; p++) fprintf(f, "%02x", (uint8_t)*p);
    fprintf(f, " %d\n", map[i]);
  }
  if (f) fclose(f);
  static const char *py =
      "/usr/bin/python3 -c '\n"
      "import unicodedata, re\n"
      "keys = {}; bad = 0; n = 0\n"
      "for line in open(\"%s\"):\n"
      "    a, b, c = line.split(\" \")\n"
      "    text = bytes.fromhex(a).decode(\"utf-8\", \"replace\")\n"
      "    if \"\\ufffd\" in text: k = bytes.fromhex(b).decode(\"utf-8\")\n"
      "    else:\n"
      "        s = unicodedata.normalize(\"NFD\", unicodedata.normalize(\"NFKC\", text))\n"
      "        s = re.sub(\"[ \\t\\r\\n]+\", \" \", \"\".join(ch for ch in s if unicodedata.category(ch) != \"Mn\").lower())\n"
      "        s = s if s == \" \" else s.strip()\n"
      "        k = s or text\n"
      "    bad += keys.setdefault(k, len(keys)) != int(c); n += 1\n"
      "print(n, len(keys), bad)\n"
      "' 2>&1";
  snprintf(cmd, sizeof cmd, py, dump);
  FILE *p = popen(cmd, "r");
  int pn = -1, pd = -1, pbad = -1;
  if (p && fscanf(p, "%d %d %d", &pn, &pd, &pbad) == 3) {
    EXPECT(pn == n && pd == d && pbad == 0, "Python's unicodedata: %d ids, %d keys, %d ids mapped differently", pn,
           pd, pbad);
    printf("engram_map: Python's unicodedata agrees on all %d ids (%d keys)\n", pn, pd);
  } else {
    printf("SKIP part: python3 did not run the cross-check\n");
  }
  if (p) pclose(p);
  remove(dump);
  free(map);
  tok_free(t);
}

int main(void) {
  check_keys();
  check_npm();
  return h_report("engram_map");
}

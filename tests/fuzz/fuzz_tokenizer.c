/* fuzz_tokenizer.c: libFuzzer target for the tokenizer's encoder and
 * decoders (runtime/text/tokenizer.h) on the DeepSeek-V3 tokenizer.json the build
 * found in the npm cache. Any bytes must encode without a crash, hang or
 * leak, and decode back to themselves with U+FFFD for ill-formed UTF-8
 * (decode(encode(x)) == repair(x)); streaming decode must give the same
 * text. A mismatch aborts. Without the npm tokenizer (make install-deps)
 * it says so once and checks nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/text/tokenizer.h"

static struct tokenizer *tok;
static int tried;

static void done(void) { tok_free(tok); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!tried) {
    tried = 1;
    char err[512];
    const char *path = tok_default_path();
    if (!path) fprintf(stderr, "fuzz_tokenizer: no npm tokenizer in this build: nothing is fuzzed\n");
    else if (!(tok = tok_load(path, err, sizeof err))) fprintf(stderr, "fuzz_tokenizer: %s\n", err), abort();
    atexit(done);
  }
  if (!tok) return 0;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  char *want = NULL, *got = NULL, *st = NULL;
  size_t wl = 0, wc = 0, gl = 0, gc = 0, sl = 0, sc = 0;
  int bad;
  if (tok_encode(tok, (const char *)data, size, &ids, &n, &cap) ||
      tok_utf8_repair(data, size, &want, &wl, &wc) || tok_decode(tok, ids, n, 0, &got, &gl, &gc, &bad))
    abort();
  if (gl != wl || memcmp(got, want, wl)) abort();
  struct tok_stream s = {0};
  for (size_t i = 0; i < n; i++)
    if (tok_stream_push(tok, &s, ids[i], &st, &sl, &sc)) abort();
  if (tok_stream_finish(&s, &st, &sl, &sc) || sl != wl || memcmp(st, want, wl)) abort();
  free(ids), free(want), free(got), free(st);
  return 0;
}

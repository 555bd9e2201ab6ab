/* fuzz_serve_request.c: libFuzzer target for cedar serve's request parser
 * (serve/request.h): any bytes as a completions body and as a chat body
 * must parse into checked fields or be refused with a message (400), never
 * crash, hang or leak; a chat request that parses renders through a
 * DeepSeek-form chat format. Build with -DCEDAR_FUZZ=ON (clang); seeds in
 * tests/fuzz/corpus_serve_request/. The HTTP headers are libmicrohttpd's to
 * parse; the one cedar reads (Authorization) is compared as bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512];
  struct srv_limits lim = {4096, 32768, 129280};
  struct chat_format f = {.bos = "<bos>", .eos = "<eos>", .user = "<U>", .assistant = "<A>"};
  for (int k = 0; k < 2; k++) {
    struct srv_params p;
    int rc = srv_params_parse(&p, k ? SRV_CHAT : SRV_COMPLETIONS, (const char *)data, size, &lim, err, sizeof err);
    if (rc && (rc != 400 || !err[0])) abort(); /* a refusal always says why */
    if (!rc && k) {
      size_t len = 0;
      char *t = srv_chat_render(&p, &f, &len, err, sizeof err);
      if (!t || len < strlen("<bos><U><A>")) abort();
      free(t);
    }
    if (!rc && !k && !p.prompt && !p.ids) abort();
    srv_params_free(&p);
  }
  return 0;
}

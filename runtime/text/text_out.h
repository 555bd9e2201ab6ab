/* text_out.h: generated ids to text as they come (issue 13 section 4): the
 * tokenizer's streaming decode (a partial UTF-8 sequence waits for its next
 * bytes), the end of generation at EOS or at a stop string, and why it
 * ended. rt_gen_opts.on_token takes text_out_on_token.
 *
 * Rules [cedar, as OpenAI's and vLLM's `stop`]:
 *   - EOS: the id eos_id ends the request; its text is not part of the
 *     output (the id stays in the generated ids).
 *   - A stop string ends the request as soon as the decoded text contains
 *     it; the text is cut before its first occurrence (the earliest start
 *     over all stop strings; the longer one on equal starts), and the id
 *     that completed it stays in the generated ids.
 *   - Streaming: text goes to emit as soon as it cannot be the start of a
 *     stop string: a tail of the text that is a proper prefix of some stop
 *     string is held back until the next id decides it. So the text emitted,
 *     concatenated, equals the whole output decoded at once (tok_decode of
 *     the ids without EOS, up to the stop string).
 *   - Special tokens other than EOS are decoded as their text.
 *
 * Test: tests/test_text_out.c (stop strings split across ids, held-back
 * prefixes, UTF-8 split across ids, EOS) and tests/cli/run_text.sh.
 */
#ifndef CEDAR_RUNTIME_TEXT_OUT_H
#define CEDAR_RUNTIME_TEXT_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/text/tokenizer.h"

enum text_end { TEXT_RUNNING = 0, TEXT_MAX_NEW, TEXT_EOS, TEXT_STOP, TEXT_ERROR };

struct text_out {
  /* set by the caller */
  const struct tokenizer *tok;
  int eos_id;                       /* -1: none */
  const char *const *stops;         /* stop strings (non-empty), n_stops of them */
  int n_stops;
  void (*emit)(void *user, const char *s, size_t n); /* streamed text, or NULL */
  void *user;
  /* state */
  struct tok_stream st;
  char *text;                       /* the output so far (decoded, NUL-terminated) */
  size_t len, cap, emitted;         /* bytes of text; of them passed to emit */
  enum text_end end;
  int stop;                         /* TEXT_STOP: which stop string */
  int err;                          /* TEXT_ERROR: an id with no token (CEDAR_EINVAL, bad_id) */
  int32_t bad_id;
};

/* Ready t after setting its caller fields (the state is zeroed here). */
void text_out_init(struct text_out *t);
/* One generated id: returns 1 when the request ends here (EOS, a stop
 * string, or an id the tokenizer has no token for: t->err), else 0. */
int text_out_push(struct text_out *t, int32_t id);
/* rt_gen_opts.on_token: user is the struct text_out. */
int text_out_on_token(void *user, int32_t id);
/* The request ended (max_new when nothing else ended it): repair a held
 * partial character, apply the stop strings to it, emit the rest. */
void text_out_finish(struct text_out *t);
void text_out_free(struct text_out *t);

/* "max-new", "eos", "stop", "error" (an id with no token) */
const char *text_end_name(enum text_end e);

#endif

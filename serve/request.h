/* request.h: the body of an OpenAI-style completions or chat request,
 * parsed and checked into typed fields before anything runs (issue 27).
 *
 * Accepted fields: model, prompt (completions: a string, or an array of
 * token ids), messages (chat: {role: system|user|assistant, content:
 * string}, ending with a user message), max_tokens (chat also
 * max_completion_tokens), temperature, top_p, top_k, seed, stop (a string
 * or up to SRV_MAX_STOPS strings), repetition_penalty, stream,
 * stream_options.include_usage, n (1 only), and cedar's return_token_ids.
 * A field given as null counts as absent. Any other field is refused with
 * its name (a parameter cedar would otherwise silently ignore), and so is a
 * value of the wrong type or out of range, and a key given twice.
 * Malformed JSON is refused with the byte, line and column where the
 * parser stopped.
 *
 * Pure: no engine, no I/O, no globals; the fuzz target calls it on any
 * bytes (tests/fuzz/fuzz_serve_request.c).
 * Test: tests/cli/serve.sh (each refusal through HTTP), the fuzz target.
 */
#ifndef CEDAR_SERVE_REQUEST_H
#define CEDAR_SERVE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/text/chat_template.h"

#define SRV_MAX_STOPS 16
#define SRV_MAX_MESSAGES 256

enum srv_kind { SRV_COMPLETIONS = 0, SRV_CHAT };
enum srv_role { SRV_SYSTEM = 0, SRV_USER, SRV_ASSISTANT };

struct srv_msg {
  enum srv_role role;
  char *content;
};

struct srv_params {
  enum srv_kind kind;
  char *model;               /* or NULL */
  char *prompt;              /* completions: the text, or NULL when ids are given */
  int32_t *ids;              /* completions: the prompt as token ids (n_ids), or NULL */
  int64_t n_ids;
  struct srv_msg *msg;       /* chat (n_msg) */
  int n_msg;
  int max_tokens;            /* 0: not given */
  float temperature;         /* default 1 (OpenAI's) */
  float top_p;               /* default 1 */
  int top_k;                 /* 0: off (-1 is accepted as off, vLLM's spelling) */
  float rep_penalty;         /* default 1: off */
  bool has_seed;
  uint64_t seed;
  char *stop[SRV_MAX_STOPS];
  int n_stop;
  bool stream, include_usage, return_token_ids;
};

/* The limits a body is checked against. */
struct srv_limits {
  int max_tokens_limit;      /* max_tokens above it is refused */
  int64_t max_prompt_ids;    /* a prompt of more ids is refused */
  int vocab;                 /* a prompt id must be below it */
};

/* Parse len bytes of body (not NUL-terminated) as a request of kind.
 * Returns 0, or 400 with a message in err that names the field or the
 * position; p is then empty (srv_params_free is still safe). */
int srv_params_parse(struct srv_params *p, enum srv_kind kind, const char *body, size_t len,
                     const struct srv_limits *lim, char *err, size_t err_len);
void srv_params_free(struct srv_params *p);

/* The chat prompt's text in the format of f (runtime/text/chat_template.h):
 * bos, the system message, then each user turn as U + content + A and each
 * assistant turn as content + eos (the template's closing of an assistant
 * turn), ending with the generation prompt after the last user message.
 * Malloc'ed, *len bytes; NULL with err when f has no template cedar renders
 * or no bos/eos. */
char *srv_chat_render(const struct srv_params *p, const struct chat_format *f, size_t *len, char *err,
                      size_t err_len);

#endif

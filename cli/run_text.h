/* run_text.h: text in and out for `cedar run` and `cedar serve-sim` (issue
 * 13 section 4): which tokenizer, the prompt through the chat template
 * (runtime/text/chat_template.h) or as raw text, the check of its ids against the
 * plan's vocab, EOS from tokenizer_config.json, and the streamed output
 * (runtime/text/text_out.h) printed and reported.
 *
 * The tokenizer: --tokenizer PATH, else a checkpoint directory's own
 * DIR/tokenizer.json (--model DIR), else the npm cache the build found
 * (`make install-deps`). Its tokenizer_config.json is the one in the same
 * directory. Ids never map into a smaller vocabulary: a prompt with an id
 * >= the plan's vocab is refused, naming both sizes.
 * Test: tests/cli/run_text.sh, tests/cli/serve_sim_text.sh.
 */
#ifndef CEDAR_CLI_RUN_TEXT_H
#define CEDAR_CLI_RUN_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "runtime/text/chat_template.h"
#include "runtime/text/text_out.h"
#include "runtime/text/tokenizer.h"

struct cJSON;

struct run_text {
  struct tokenizer *tok;
  char tok_path[4096];
  struct chat_format chat;   /* bos/eos/template; chat.path[0] == 0 when no tokenizer_config.json was found */
  bool have_config;
  int eos_id;                /* -1 when the config names no EOS the tokenizer knows */
};

/* Open the tokenizer (rules above) and its tokenizer_config.json (absent:
 * no template, no EOS; a malformed one is an error). Returns 0, or 1 after
 * printing "cedar <cmd>: ..." on stderr. */
int run_text_open(struct run_text *t, const char *cmd, const char *tokenizer, const char *model);
void run_text_close(struct run_text *t);

/* The prompt's ids: raw = text encoded as is; else the chat template's
 * single turn (system may be NULL). No BOS is added beyond the template's.
 * Returns 0, or CEDAR_EINVAL with err (the template outside cedar's subset,
 * an empty prompt). *ids is malloc'ed; so is *rendered (the text encoded)
 * when rendered is not NULL. */
int run_text_prompt(struct run_text *t, const char *text, bool raw, const char *system, int32_t **ids, int64_t *n,
                    char **rendered, char *err, size_t len);

/* One user turn of a conversation whose ids so far end with last_id (-1:
 * none, the first turn): the first turn is run_text_prompt's; a later one
 * is U + text + A (rules of runtime/text/chat_template.h) after an EOS when
 * last_id is not EOS, as the template closes an assistant turn
 * ('<｜Assistant｜>' + content + EOS). raw: the text encoded as is. */
int run_text_turn(struct run_text *t, const char *text, bool raw, int32_t last_id, int32_t **ids, int64_t *n,
                  char *err, size_t len);

/* CEDAR_EINVAL with err when an id is >= vocab (both sizes named), else 0. */
int run_text_fits(const struct run_text *t, const int32_t *ids, int64_t n, int vocab, const char *plan, char *err,
                  size_t len);

/* Output set up for a request: stops (n_stops), EOS, and with to_stdout
 * the text written to stdout as it comes (flushed per id). */
void run_text_out(struct run_text *t, struct text_out *o, const char *const *stops, int n_stops, bool to_stdout);

/* How the request ended, for the report: "max-new (16 tokens)", "EOS (id 1)",
 * "stop string 1 \"\\n\\n\"". */
void run_text_end(const struct text_out *o, int n_tokens, char *buf, size_t len);
/* The report's line: "prompt N tokens (format)[: ids]; generated M, ended
 * by <run_text_end>[: ids]" (ids with --ids). */
void run_text_report(const struct text_out *o, const char *format, const int32_t *prompt, int64_t n,
                     const int32_t *gen, int n_gen, bool ids);
/* The same as JSON fields: "prompt_format", "prompt_ids" (with ids),
 * "text", "end" ("max-new", "eos", "stop", "error"), "stop_string" when a
 * stop string ended it, "bad_id" for an id with no token. */
void run_text_json(struct cJSON *j, const struct text_out *o, const char *format, const int32_t *prompt, int64_t n,
                   bool ids);

/* "prompt_ids": [...] (--ids with an ids prompt). */
void run_text_ids_json(struct cJSON *j, const int32_t *prompt, int64_t n);

/* `cedar run --help`'s lines for the text options. */
extern const char run_text_usage[];

#endif

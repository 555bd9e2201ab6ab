/* chat_template.h: the DeepSeek chat format read from a tokenizer_config.json
 * (issue 13 section 4): the bos and eos tokens and the single-turn rendering
 * its `chat_template` defines, without a Jinja engine.
 *
 * What is read: `bos_token` and `eos_token` (a string, or an object with
 * "content"), and `chat_template` (a string, or a list of {"name",
 * "template"} from which "default" is taken).
 *
 * The subset [cedar]: cedar renders one turn, a user message with an
 * optional system message before it and the generation prompt after it,
 * which is what `apply_chat_template(messages, add_generation_prompt=True)`
 * renders for [{system}?, {user}]. It accepts a template only when every
 * piece of that rendering is written in it in the DeepSeek-V3 form, and then
 * takes the literals from the template itself:
 *   1. no text outside {% %}, {{ }} and {# #} tags (all output comes from
 *      {{ }} expressions);
 *   2. the first output is `{{bos_token}}`, directly followed by
 *      `{{ns.system_prompt}}`, and the system prompt is built as
 *      `ns.system_prompt + message['content']` in the `role == 'system'`
 *      branch (one system message: its content);
 *   3. the `role == 'user'` branch outputs `{{'U' + message['content']}}`;
 *   4. `{% if add_generation_prompt ... %}{{'A'}}` outputs the generation
 *      prompt A.
 * The rendering is then bos + system + U + user + A, byte for byte. Jinja
 * string escapes (\n \t \r \\ \' \") in U and A are decoded. Any other
 * template (more turns, tools, a different layout) is refused with the
 * piece that is missing: give the prompt in its final form (--raw).
 * Special-token text inside the user's or the system's content is matched
 * as special tokens by the encoder, as Hugging Face's does.
 *
 * Test: tests/test_chat_template.c (the recognizer on good and bad
 * templates), tests/cli/run_text.sh (the bytes and ids against
 * @lenml/tokenizers' apply_chat_template under node).
 */
#ifndef CEDAR_RUNTIME_CHAT_TEMPLATE_H
#define CEDAR_RUNTIME_CHAT_TEMPLATE_H

#include <stddef.h>

struct chat_format {
  char *bos, *eos;        /* the tokens' text; NULL when the config names none */
  char *user, *assistant; /* U and A above; NULL when the template is not in the subset */
  char why[256];          /* when user is NULL: which piece of the subset the template lacks */
  char path[4096];        /* the tokenizer_config.json read */
};

/* The tokenizer_config.json beside tokenizer.json at tokenizer_path (the
 * same directory) into out. Returns 0, or -1 when the name does not fit. */
int chat_config_beside(const char *tokenizer_path, char *out, size_t out_len);

/* Read path into f. Returns 0, or a negative cedar_status with err (the
 * file, the field and the reason). A template outside the subset is not an
 * error here: f->user stays NULL and f->why says what is missing. */
int chat_format_load(struct chat_format *f, const char *path, char *err, size_t err_len);
void chat_format_free(struct chat_format *f);

/* Recognize a template's text (the rules above) into f->user, f->assistant
 * (or f->why). Returns 0 when it is in the subset, -1 otherwise. */
int chat_template_parse(struct chat_format *f, const char *tmpl);

/* bos + system + U + user + A as a malloc'ed NUL-terminated string (*len
 * bytes); system may be NULL (empty). NULL when the template is not in the
 * subset or the config has no bos token. */
char *chat_render(const struct chat_format *f, const char *system, const char *user, size_t *len);

#endif

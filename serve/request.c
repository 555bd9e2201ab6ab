/* request.c: an OpenAI-style request body into struct srv_params, every
 * field checked (request.h). */
#include "serve/request.h"

#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "runtime/text/tokenizer.h"

static int bad(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return 400;
}

/* Where the parser stopped, as byte, line and column (1-based). */
static int bad_json(const char *body, size_t len, const char *end, char *err, size_t err_len) {
  size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : len;
  size_t line = 1, col = 1;
  for (size_t i = 0; i < at; i++) {
    if (body[i] == '\n') line++, col = 1;
    else col++;
  }
  return bad(err, err_len, "the body is not valid JSON: the parser stopped at byte %zu (line %zu, column %zu); send "
             "one JSON object", at, line, col);
}

/* A number that is a whole integer in [lo, hi]. */
static bool whole(const cJSON *v, double lo, double hi, double *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d != floor(d) || d < lo || d > hi) return false;
  *out = d;
  return true;
}

static bool real(const cJSON *v, double lo, double hi, bool lo_open, double *out) {
  if (!cJSON_IsNumber(v)) return false;
  double d = v->valuedouble;
  if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo)) return false;
  *out = d;
  return true;
}

static char *dup_string(const cJSON *v) { return cedar_xstrdup(v->valuestring); }

/* Whether a string is well-formed UTF-8 (JSON text must be; the parser
 * passes raw bytes through). */
static bool utf8_ok(const char *s) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    int k = tok_utf8_char_len((const uint8_t *)s + i, n - i);
    if (k <= 0) return false;
    i += (size_t)k;
  }
  return true;
}

/* Every string in v (any depth) well-formed UTF-8; else the 400 naming where. */
static int check_utf8(const cJSON *v, const char *where, char *err, size_t n) {
  if (cJSON_IsString(v) && !utf8_ok(v->valuestring))
    return bad(err, n, "%s holds bytes that are not UTF-8; JSON text must be UTF-8", where);
  if (v->string && !utf8_ok(v->string)) return bad(err, n, "a key holds bytes that are not UTF-8");
  for (const cJSON *c = v->child; c; c = c->next)
    if (check_utf8(c, where, err, n)) return 400;
  return 0;
}

static int parse_prompt(struct srv_params *p, const cJSON *v, const struct srv_limits *lim, char *err, size_t n) {
  if (cJSON_IsString(v)) {
    if (!*v->valuestring) return bad(err, n, "\"prompt\" is empty");
    p->prompt = dup_string(v);
    return 0;
  }
  if (!cJSON_IsArray(v))
    return bad(err, n, "\"prompt\" must be a string or an array of token ids (several prompts in one request are "
               "not supported: send one request each)");
  int k = cJSON_GetArraySize(v);
  if (k < 1) return bad(err, n, "\"prompt\" is an empty array");
  if (k > lim->max_prompt_ids)
    return bad(err, n, "\"prompt\" holds %d ids; this server takes at most %lld", k, (long long)lim->max_prompt_ids);
  p->ids = cedar_xmalloc(sizeof(int32_t) * (size_t)k);
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    double d;
    if (!whole(e, 0, (double)lim->vocab - 1, &d))
      return bad(err, n, "\"prompt\"[%lld] must be a token id in [0, %d) (several prompts in one request are not "
                 "supported)", (long long)p->n_ids, lim->vocab);
    p->ids[p->n_ids++] = (int32_t)d;
  }
  return 0;
}

static int parse_messages(struct srv_params *p, const cJSON *v, char *err, size_t n) {
  if (!cJSON_IsArray(v)) return bad(err, n, "\"messages\" must be an array of {\"role\", \"content\"}");
  int k = cJSON_GetArraySize(v);
  if (k < 1 || k > SRV_MAX_MESSAGES) return bad(err, n, "\"messages\" must hold 1 to %d messages", SRV_MAX_MESSAGES);
  p->msg = cedar_xcalloc((size_t)k, sizeof(*p->msg));
  const cJSON *m;
  cJSON_ArrayForEach(m, v) {
    int i = p->n_msg;
    if (!cJSON_IsObject(m)) return bad(err, n, "\"messages\"[%d] must be an object", i);
    const cJSON *f;
    cJSON_ArrayForEach(f, m) {
      if (strcmp(f->string, "role") && strcmp(f->string, "content") && strcmp(f->string, "name"))
        return bad(err, n, "\"messages\"[%d].%s is not supported (only role and content)", i, f->string);
    }
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsString(role)) return bad(err, n, "\"messages\"[%d].role must be a string", i);
    if (!cJSON_IsString(content))
      return bad(err, n, "\"messages\"[%d].content must be a string (content parts are not supported)", i);
    enum srv_role r;
    if (!strcmp(role->valuestring, "system")) r = SRV_SYSTEM;
    else if (!strcmp(role->valuestring, "user")) r = SRV_USER;
    else if (!strcmp(role->valuestring, "assistant")) r = SRV_ASSISTANT;
    else return bad(err, n, "\"messages\"[%d].role \"%.40s\" is not supported (system, user, assistant)", i, role->valuestring);
    if (r == SRV_SYSTEM && i) return bad(err, n, "\"messages\"[%d]: a system message may only come first", i);
    bool after_user = i && p->msg[i - 1].role == SRV_USER;
    if (r == SRV_USER && after_user) return bad(err, n, "\"messages\"[%d]: two user messages in a row; put them in one", i);
    if (r == SRV_ASSISTANT && !after_user)
      return bad(err, n, "\"messages\"[%d]: an assistant message must answer a user message", i);
    p->msg[i].role = r;
    p->msg[i].content = dup_string(content);
    p->n_msg++;
  }
  if (p->msg[p->n_msg - 1].role != SRV_USER) return bad(err, n, "\"messages\" must end with a user message");
  return 0;
}

static int parse_stop(struct srv_params *p, const cJSON *v, char *err, size_t n) {
  if (cJSON_IsString(v)) {
    if (!*v->valuestring) return bad(err, n, "\"stop\" is an empty string");
    p->stop[p->n_stop++] = dup_string(v);
    return 0;
  }
  if (!cJSON_IsArray(v)) return bad(err, n, "\"stop\" must be a string or an array of strings");
  if (cJSON_GetArraySize(v) > SRV_MAX_STOPS) return bad(err, n, "\"stop\" holds more than %d strings", SRV_MAX_STOPS);
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsString(e) || !*e->valuestring) return bad(err, n, "\"stop\"[%d] must be a non-empty string", p->n_stop);
    p->stop[p->n_stop++] = dup_string(e);
  }
  return 0;
}

static int parse_stream_options(struct srv_params *p, const cJSON *v, char *err, size_t n) {
  if (!cJSON_IsObject(v)) return bad(err, n, "\"stream_options\" must be an object");
  const cJSON *f;
  cJSON_ArrayForEach(f, v) {
    if (strcmp(f->string, "include_usage"))
      return bad(err, n, "\"stream_options\".%s is not supported (only include_usage)", f->string);
    if (!cJSON_IsBool(f)) return bad(err, n, "\"stream_options\".include_usage must be true or false");
    p->include_usage = cJSON_IsTrue(f);
  }
  return 0;
}

/* One top-level field. */
static int parse_field(struct srv_params *p, const cJSON *f, const struct srv_limits *lim, char *err, size_t n) {
  const char *k = f->string;
  double d;
  bool chat = p->kind == SRV_CHAT;
  if (cJSON_IsNull(f)) return 0;
  if (!strcmp(k, "model")) {
    if (!cJSON_IsString(f)) return bad(err, n, "\"model\" must be a string");
    p->model = dup_string(f);
  } else if (!strcmp(k, "prompt") && !chat) {
    return parse_prompt(p, f, lim, err, n);
  } else if (!strcmp(k, "messages") && chat) {
    return parse_messages(p, f, err, n);
  } else if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
    if (!whole(f, 1, lim->max_tokens_limit, &d))
      return bad(err, n, "\"%s\" must be an integer in [1, %d]", k, lim->max_tokens_limit);
    p->max_tokens = (int)d;
  } else if (!strcmp(k, "temperature")) {
    if (!real(f, 0, 100, false, &d)) return bad(err, n, "\"temperature\" must be a number in [0, 100] (0: greedy)");
    p->temperature = (float)d;
  } else if (!strcmp(k, "top_p")) {
    if (!real(f, 0, 1, true, &d)) return bad(err, n, "\"top_p\" must be a number in (0, 1]");
    p->top_p = (float)d;
  } else if (!strcmp(k, "top_k")) {
    if (!whole(f, -1, 1 << 30, &d)) return bad(err, n, "\"top_k\" must be an integer >= 1 (0 or -1: off)");
    p->top_k = d < 0 ? 0 : (int)d;
  } else if (!strcmp(k, "repetition_penalty")) {
    if (!real(f, 0, 1e6, true, &d)) return bad(err, n, "\"repetition_penalty\" must be a number > 0 (1: off)");
    p->rep_penalty = (float)d;
  } else if (!strcmp(k, "seed")) {
    if (!whole(f, 0, 9007199254740992.0, &d)) return bad(err, n, "\"seed\" must be an integer in [0, 2^53]");
    p->has_seed = true, p->seed = (uint64_t)d;
  } else if (!strcmp(k, "stop")) {
    return parse_stop(p, f, err, n);
  } else if (!strcmp(k, "stream")) {
    if (!cJSON_IsBool(f)) return bad(err, n, "\"stream\" must be true or false");
    p->stream = cJSON_IsTrue(f);
  } else if (!strcmp(k, "stream_options")) {
    return parse_stream_options(p, f, err, n);
  } else if (!strcmp(k, "return_token_ids")) {
    if (!cJSON_IsBool(f)) return bad(err, n, "\"return_token_ids\" must be true or false");
    p->return_token_ids = cJSON_IsTrue(f);
  } else if (!strcmp(k, "n")) {
    if (!whole(f, 1, 1, &d)) return bad(err, n, "\"n\" must be 1: one choice per request");
  } else {
    return bad(err, n, "unsupported parameter \"%.64s\" for %s: cedar serve does not implement it (docs/serving.md "
               "lists the parameters it takes)", k, chat ? "/v1/chat/completions" : "/v1/completions");
  }
  return 0;
}

int srv_params_parse(struct srv_params *p, enum srv_kind kind, const char *body, size_t len,
                     const struct srv_limits *lim, char *err, size_t err_len) {
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->temperature = 1, p->top_p = 1, p->rep_penalty = 1;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
  if (!root) return bad_json(body, len, end, err, err_len);
  int rc = 0;
  if (end && (size_t)(end - body) < len) { /* trailing bytes after the object: only whitespace */
    for (const char *c = end; c < body + len && !rc; c++)
      if (*c != ' ' && *c != '\n' && *c != '\r' && *c != '\t') rc = bad_json(body, len, c, err, err_len);
  }
  if (!rc && !cJSON_IsObject(root)) rc = bad(err, err_len, "the body must be a JSON object");
  if (!rc) rc = check_utf8(root, "the body", err, err_len);
  const cJSON *f;
  if (!rc) {
    cJSON_ArrayForEach(f, root) {
      for (const cJSON *g = root->child; g != f && !rc; g = g->next)
        if (!strcmp(g->string, f->string)) rc = bad(err, err_len, "\"%.64s\" is given twice", f->string);
      if (!rc) rc = parse_field(p, f, lim, err, err_len);
      if (rc) break;
    }
  }
  if (!rc && kind == SRV_COMPLETIONS && !p->prompt && !p->ids) rc = bad(err, err_len, "\"prompt\" is required");
  if (!rc && kind == SRV_CHAT && !p->n_msg) rc = bad(err, err_len, "\"messages\" is required");
  if (!rc && p->ids && p->n_ids > lim->max_prompt_ids)
    rc = bad(err, err_len, "\"prompt\" holds %lld ids; this server takes at most %lld", (long long)p->n_ids,
             (long long)lim->max_prompt_ids);
  cJSON_Delete(root);
  if (rc) srv_params_free(p);
  return rc;
}

void srv_params_free(struct srv_params *p) {
  free(p->model);
  free(p->prompt);
  free(p->ids);
  for (int i = 0; i < p->n_msg; i++) free(p->msg[i].content);
  free(p->msg);
  for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
  enum srv_kind kind = p->kind;
  memset(p, 0, sizeof *p);
  p->kind = kind;
}

/* ---- the chat prompt ---------------------------------------------------------- */

struct sbuf {
  char *s;
  size_t len, cap;
};

static void sb_add(struct sbuf *b, const char *s) {
  size_t n = strlen(s);
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->s = cedar_xrealloc(b->s, b->cap);
  }
  memcpy(b->s + b->len, s, n + 1);
  b->len += n;
}

char *srv_chat_render(const struct srv_params *p, const struct chat_format *f, size_t *len, char *err,
                      size_t err_len) {
  if (!f || !f->user || !f->assistant || !f->bos || !f->eos) {
    snprintf(err, err_len, "this server's tokenizer_config.json has no chat template cedar renders (%s); use "
             "/v1/completions with the prompt in its final form",
             !f ? "none was found" : !f->user ? f->why : "no bos or eos token");
    return NULL;
  }
  int i = 0;
  const char *system = p->n_msg && p->msg[0].role == SRV_SYSTEM ? p->msg[i++].content : NULL;
  size_t first_len = 0;
  char *first = chat_render(f, system, p->msg[i].content, &first_len);
  if (!first) {
    snprintf(err, err_len, "the chat template could not be rendered");
    return NULL;
  }
  struct sbuf b = {first, first_len, first_len + 1};
  for (i++; i < p->n_msg; i++) {
    if (p->msg[i].role == SRV_ASSISTANT) {
      sb_add(&b, p->msg[i].content);
      sb_add(&b, f->eos);
    } else {
      sb_add(&b, f->user);
      sb_add(&b, p->msg[i].content);
      sb_add(&b, f->assistant);
    }
  }
  *len = b.len;
  return b.s;
}

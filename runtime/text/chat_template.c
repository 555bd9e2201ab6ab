/* chat_template.c: tokenizer_config.json's bos/eos and the single-turn
 * DeepSeek chat rendering (chat_template.h for the subset and its rules).
 * The template is cut into its tags; the recognizer compares tag contents
 * with whitespace collapsed and either quote style, and reads the two
 * string literals it needs. */
#include "runtime/text/chat_template.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"

int chat_config_beside(const char *tokenizer_path, char *out, size_t out_len) {
  const char *slash = strrchr(tokenizer_path, '/');
  int dir = slash ? (int)(slash - tokenizer_path) : 0;
  int n = slash ? snprintf(out, out_len, "%.*s/tokenizer_config.json", dir, tokenizer_path)
                : snprintf(out, out_len, "tokenizer_config.json");
  return n > 0 && (size_t)n < out_len ? 0 : -1;
}

/* ---- the template's tags ------------------------------------------------- */

enum { TAG_BLOCK, TAG_OUT, TAG_COMMENT };

struct tag {
  int kind;
  char *norm; /* the content without its markers and trim dashes, whitespace collapsed, " as ' */
  const char *raw; size_t raw_len; /* the content as written (between the markers and dashes) */
};

struct tags {
  struct tag *t;
  int n, cap;
};

static void tags_free(struct tags *ts) {
  for (int i = 0; i < ts->n; i++) free(ts->t[i].norm);
  free(ts->t);
}

static char *normalize(const char *s, size_t n) {
  char *o = cedar_xmalloc(n + 1);
  size_t k = 0;
  bool space = false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (isspace(c)) {
      space = k > 0;
      continue;
    }
    if (space) o[k++] = ' ';
    space = false;
    o[k++] = c == '"' ? '\'' : (char)c;
  }
  o[k] = 0;
  return o;
}

/* Cut tmpl into tags; text outside them must be empty or whitespace a trim
 * dash removes (rule 1). -1 with why on anything else. */
static int cut_tags(const char *tmpl, struct tags *ts, char *why, size_t why_len) {
  const char *p = tmpl;
  bool trim_next = false; /* the tag before ended with a dash */
  for (;;) {
    const char *open = strchr(p, '{');
    while (open && open[1] != '%' && open[1] != '{' && open[1] != '#') open = strchr(open + 1, '{');
    const char *text_end = open ? open : p + strlen(p);
    bool dash_open = open && open[2] == '-';
    for (const char *c = p; c < text_end; c++)
      if (!(isspace((unsigned char)*c) && (trim_next || dash_open))) {
        snprintf(why, why_len, "it writes text outside its tags (at byte %ld)", (long)(c - tmpl));
        return -1;
      }
    if (!open) return 0;
    char close = open[1] == '{' ? '}' : open[1];
    const char *s = open + 2 + dash_open, *e = s;
    char quote = 0;
    for (; *e; e++) { /* string literals may hold the closing marker */
      if (quote) {
        if (*e == '\\' && e[1]) e++;
        else if (*e == quote) quote = 0;
      } else if (*e == '\'' || *e == '"') {
        quote = *e;
      } else if (*e == close && e[1] == '}') {
        break;
      }
    }
    if (!*e) {
      snprintf(why, why_len, "a tag opened at byte %ld is not closed", (long)(open - tmpl));
      return -1;
    }
    const char *ce = e;
    trim_next = ce > s && ce[-1] == '-';
    if (trim_next) ce--;
    if (ts->n == ts->cap) {
      ts->cap = ts->cap ? 2 * ts->cap : 64;
      ts->t = cedar_xrealloc(ts->t, sizeof(*ts->t) * (size_t)ts->cap);
    }
    ts->t[ts->n++] = (struct tag){open[1] == '%' ? TAG_BLOCK : open[1] == '{' ? TAG_OUT : TAG_COMMENT,
                                  normalize(s, (size_t)(ce - s)), s, (size_t)(ce - s)};
    p = e + 2;
  }
}

/* A Jinja string literal at *s (either quote) decoded into a malloc'ed
 * string; *s moves past it. NULL when *s is not one. */
static char *literal(const char **s) {
  const char *p = *s;
  while (isspace((unsigned char)*p)) p++;
  char q = *p;
  if (q != '\'' && q != '"') return NULL;
  size_t cap = strlen(p) + 1, k = 0;
  char *o = cedar_xmalloc(cap);
  for (p++; *p && *p != q; p++) {
    if (*p != '\\') {
      o[k++] = *p;
      continue;
    }
    p++;
    switch (*p) {
    case 'n': o[k++] = '\n'; break;
    case 't': o[k++] = '\t'; break;
    case 'r': o[k++] = '\r'; break;
    case '\\': case '\'': case '"': o[k++] = *p; break;
    default: free(o); return NULL; /* an escape cedar does not decode: not in the subset */
    }
  }
  if (*p != q) return free(o), NULL;
  o[k] = 0;
  *s = p + 1;
  return o;
}

/* The content after the literal at s must be exactly rest (whitespace free). */
static bool rest_is(const char *s, const char *rest) {
  char *n = normalize(s, strlen(s));
  char *r = normalize(rest, strlen(rest));
  bool ok = !strcmp(n, r);
  free(n);
  free(r);
  return ok;
}

static int find(const struct tags *ts, int from, int kind, const char *norm, bool prefix) {
  for (int i = from; i < ts->n; i++)
    if (ts->t[i].kind == kind &&
        (prefix ? !strncmp(ts->t[i].norm, norm, strlen(norm)) : !strcmp(ts->t[i].norm, norm)))
      return i;
  return -1;
}

/* The literal of {{'X' + message['content']}} or {{'X'}} (plus = NULL) in tag i. */
static char *out_literal(const struct tags *ts, int i, const char *plus) {
  if (i < 0 || i >= ts->n || ts->t[i].kind != TAG_OUT) return NULL;
  char *raw = cedar_xmalloc(ts->t[i].raw_len + 1);
  memcpy(raw, ts->t[i].raw, ts->t[i].raw_len);
  raw[ts->t[i].raw_len] = 0;
  const char *s = raw;
  char *lit = literal(&s);
  if (lit && !rest_is(s, plus ? plus : "")) {
    free(lit);
    lit = NULL;
  }
  free(raw);
  return lit;
}

int chat_template_parse(struct chat_format *f, const char *tmpl) {
  struct tags ts = {0};
  free(f->user), free(f->assistant);
  f->user = f->assistant = NULL;
  f->why[0] = 0;
  int rc = -1;
  if (cut_tags(tmpl, &ts, f->why, sizeof f->why)) goto out;
  int first = find(&ts, 0, TAG_OUT, "", true);
  if (first < 0 || strcmp(ts.t[first].norm, "bos_token") || first + 1 >= ts.n ||
      strcmp(ts.t[first + 1].norm, "ns.system_prompt")) {
    snprintf(f->why, sizeof f->why, "its first output is not {{bos_token}}{{ns.system_prompt}}");
    goto out;
  }
  int sys = find(&ts, 0, TAG_BLOCK, "if message['role'] == 'system'", false);
  if (sys < 0 || find(&ts, sys, TAG_BLOCK, "set ns.system_prompt = ns.system_prompt + message['content']", false) < 0) {
    snprintf(f->why, sizeof f->why, "it does not build ns.system_prompt from the system message's content");
    goto out;
  }
  int user = find(&ts, 0, TAG_BLOCK, "if message['role'] == 'user'", false);
  int uo = user < 0 ? -1 : find(&ts, user, TAG_OUT, "", true);
  int endif = user < 0 ? -1 : find(&ts, user, TAG_BLOCK, "endif", false);
  if (uo < 0 || (endif >= 0 && endif < uo) || !(f->user = out_literal(&ts, uo, "+ message['content']"))) {
    snprintf(f->why, sizeof f->why, "its user branch does not output {{'<literal>' + message['content']}}");
    goto out;
  }
  int gen = find(&ts, 0, TAG_BLOCK, "if add_generation_prompt", true);
  if (gen < 0 || !(f->assistant = out_literal(&ts, gen + 1, NULL))) {
    snprintf(f->why, sizeof f->why, "it has no {%% if add_generation_prompt %%}{{'<literal>'}}");
    free(f->user);
    f->user = NULL;
    goto out;
  }
  rc = 0;
out:
  tags_free(&ts);
  return rc;
}

/* ---- tokenizer_config.json ------------------------------------------------ */

/* A token field: a string or {"content": string}; NULL when absent/null. */
static int token_field(const cJSON *j, const char *key, char **out, const char *path, char *err, size_t len) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  *out = NULL;
  if (!v || cJSON_IsNull(v)) return 0;
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  if (!cJSON_IsString(v)) {
    snprintf(err, len, "%s: %s must be a string or an object with a \"content\" string", path, key);
    return CEDAR_EINVAL;
  }
  *out = cedar_xstrdup(v->valuestring);
  return 0;
}

int chat_format_load(struct chat_format *f, const char *path, char *err, size_t err_len) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  size_t n; /* base/file.h: bounded; a FIFO or device is refused (a tokenizer_config.json is kilobytes) */
  char why[600];
  char *buf = cedar_read_all(path, (uint64_t)64 << 20, &n, why, sizeof why);
  if (!buf) return snprintf(err, err_len, "cannot read %s", why), CEDAR_EIO;
  cJSON *j = cJSON_ParseWithLength(buf, n);
  free(buf);
  int rc = 0;
  if (!cJSON_IsObject(j)) {
    snprintf(err, err_len, "%s: not a JSON object", path);
    rc = CEDAR_EINVAL;
  }
  if (!rc) rc = token_field(j, "bos_token", &f->bos, path, err, err_len);
  if (!rc) rc = token_field(j, "eos_token", &f->eos, path, err, err_len);
  const cJSON *t = rc ? NULL : cJSON_GetObjectItemCaseSensitive(j, "chat_template");
  if (cJSON_IsArray(t)) { /* [{"name": ..., "template": ...}]: the default one */
    const cJSON *e, *d = NULL;
    cJSON_ArrayForEach(e, t) {
      const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
      if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default")) d = cJSON_GetObjectItemCaseSensitive(e, "template");
    }
    t = d;
    if (!t) snprintf(f->why, sizeof f->why, "its chat_template list has no \"default\" template");
  }
  if (!rc && cJSON_IsString(t))
    chat_template_parse(f, t->valuestring);
  else if (!rc && !f->why[0])
    snprintf(f->why, sizeof f->why, "it has no chat_template string");
  cJSON_Delete(j);
  if (rc) chat_format_free(f);
  return rc;
}

void chat_format_free(struct chat_format *f) {
  free(f->bos), free(f->eos), free(f->user), free(f->assistant);
  f->bos = f->eos = f->user = f->assistant = NULL;
}

char *chat_render(const struct chat_format *f, const char *system, const char *user, size_t *len) {
  if (!f->user || !f->assistant || !f->bos) return NULL;
  const char *parts[5] = {f->bos, system ? system : "", f->user, user, f->assistant};
  size_t n = 0;
  for (int i = 0; i < 5; i++) n += strlen(parts[i]);
  char *o = cedar_xmalloc(n + 1), *w = o;
  for (int i = 0; i < 5; i++) {
    size_t k = strlen(parts[i]);
    memcpy(w, parts[i], k);
    w += k;
  }
  *w = 0;
  *len = n;
  return o;
}

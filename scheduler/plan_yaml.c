/* plan_yaml.c: pass one of plan loading. libyaml events -> a tree of pnodes
 * that remember file:line:col, then `extends:` resolution by deep merge.
 *
 * Merge rule: the extending file's mappings merge key by key into its base
 * (recursively); scalars and sequences replace; `layer_overrides` sequences
 * concatenate, base first; `name` is never inherited. Paths in `extends` are relative to the file that
 * names them. Cycles and missing files are errors at the `extends` value.
 *
 * Not here: what keys mean (plan_load.c) or whether the plan makes sense
 * (plan_check.c). Anchors are allowed, aliases are not (a plan is a tree;
 * aliases also make "billion laughs" inputs possible).
 * Tested by tests/test_plan_rules.c and fuzzed by tests/fuzz/fuzz_plan.c.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <yaml.h>

#include "base/check.h"
#include "base/file.h"
#include "base/log.h"
#include "scheduler/plan_internal.h"

#define PLAN_MAX_DEPTH 64   /* nesting; plans need about 5 */
#define PLAN_MAX_EXTENDS 16 /* chain length */
#define PLAN_MAX_BYTES (4 << 20)

/* ---------------------------------------------------------------- diagnostics */

const char *plan__intern(struct plan_ctx *ctx, const char *s) {
  for (size_t i = 0; i < ctx->n_strings; i++)
    if (!strcmp(ctx->strings[i], s)) return ctx->strings[i];
  ctx->strings = cedar_xrealloc(ctx->strings, (ctx->n_strings + 1) * sizeof *ctx->strings);
  return ctx->strings[ctx->n_strings++] = cedar_xstrdup(s);
}

static char *vformat(const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  char *s = cedar_xmalloc((size_t)n + 1);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  return s;
}

static void add_diag(struct plan_ctx *ctx, bool warning, struct plan_mark mark, const char *hint, const char *fmt,
                     va_list ap) {
  struct plan_diags *d = ctx->diags;
  if (d->n == d->cap) {
    d->cap = d->cap ? 2 * d->cap : 8;
    d->d = cedar_xrealloc(d->d, d->cap * sizeof *d->d);
  }
  struct plan_diag *e = &d->d[d->n++];
  e->warning = warning;
  e->file = mark.file ? cedar_xstrdup(mark.file) : NULL;
  e->mark = mark;
  e->mark.file = e->file;
  e->msg = vformat(fmt, ap);
  e->hint = hint ? cedar_xstrdup(hint) : NULL;
  ctx->n_errors += !warning;
}

void plan__error(struct plan_ctx *ctx, struct plan_mark mark, const char *hint,
                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_diag(ctx, false, mark, hint, fmt, ap);
  va_end(ap);
}

void plan__warn(struct plan_ctx *ctx, struct plan_mark mark, const char *hint, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  add_diag(ctx, true, mark, hint, fmt, ap);
  va_end(ap);
}

void plan_diags_print(const struct plan_diags *diags, FILE *f) {
  for (size_t i = 0; i < diags->n; i++) {
    const struct plan_diag *e = &diags->d[i];
    const char *kind = e->warning ? "warning" : "error";
    if (e->mark.file && e->mark.line <= 0)
      fprintf(f, "%s: %s: %s\n", e->mark.file, kind, e->msg);
    else if (e->mark.file)
      fprintf(f, "%s:%d:%d: %s: %s\n", e->mark.file, e->mark.line, e->mark.col, kind, e->msg);
    else
      fprintf(f, "%s: %s\n", kind, e->msg);
    if (e->hint) fprintf(f, "  hint: %s\n", e->hint);
  }
}

void plan_diags_free(struct plan_diags *diags) {
  if (!diags) return;
  for (size_t i = 0; i < diags->n; i++) {
    free(diags->d[i].file);
    free(diags->d[i].msg);
    free(diags->d[i].hint);
  }
  free(diags->d);
  memset(diags, 0, sizeof *diags);
}

/* ---------------------------------------------------------------- the tree */

static struct pnode *node_new(enum pnode_kind kind, struct plan_mark mark) {
  struct pnode *n = cedar_xcalloc(1, sizeof *n);
  n->kind = kind;
  n->mark = mark;
  return n;
}

static void node_push(struct pnode *parent, struct pnode *kid) {
  if (parent->n == parent->cap) {
    parent->cap = parent->cap ? 2 * parent->cap : 8;
    parent->kids = cedar_xrealloc(parent->kids, parent->cap * sizeof *parent->kids);
  }
  parent->kids[parent->n++] = kid;
}

void plan__node_free(struct pnode *n) {
  if (!n) return;
  for (size_t i = 0; i < n->n; i++) plan__node_free(n->kids[i]);
  free(n->kids);
  free(n->str);
  free(n);
}

struct pnode *plan__map_get(const struct pnode *map, const char *key) {
  if (!map || map->kind != PN_MAP) return NULL;
  for (size_t i = 0; i + 1 < map->n; i += 2)
    if (!strcmp(map->kids[i]->str, key)) return map->kids[i + 1];
  return NULL;
}

const char *plan__kind_name(const struct pnode *n) {
  switch (n->kind) {
    case PN_SCALAR: return "a scalar";
    case PN_MAP: return "a mapping";
    case PN_SEQ: return "a list";
  }
  return "?";
}

/* ---------------------------------------------------------------- libyaml */

struct reader {
  struct plan_ctx *ctx;
  yaml_parser_t parser;
  const char *file; /* interned */
};

static struct plan_mark mark_of(const struct reader *r, yaml_mark_t m) {
  return (struct plan_mark){r->file, (int)m.line + 1, (int)m.column + 1};
}

/* Next event; on a syntax error, report libyaml's own message and place. */
static int next_event(struct reader *r, yaml_event_t *ev) {
  if (yaml_parser_parse(&r->parser, ev)) return 0;
  yaml_parser_t *p = &r->parser;
  struct plan_mark m = mark_of(r, p->problem_mark);
  if (p->context)
    plan__error(r->ctx, m, "fix the YAML syntax at this place (indentation, a missing ':' or quote)",
                "YAML syntax error: %s %s (started at line %zu)", p->problem ? p->problem : "",
                p->context, p->context_mark.line + 1);
  else
    plan__error(r->ctx, m, "fix the YAML syntax at this place (indentation, a missing ':' or quote)",
                "YAML syntax error: %s", p->problem ? p->problem : "unknown problem");
  return -1;
}

static struct pnode *read_node(struct reader *r, yaml_event_t *ev, int depth);

/* Read the rest of a mapping or sequence whose start event was `start`. */
static struct pnode *read_collection(struct reader *r, struct pnode *n, yaml_event_type_t end,
                                     int depth) {
  for (;;) {
    yaml_event_t ev;
    if (next_event(r, &ev)) goto fail;
    if (ev.type == end) {
      yaml_event_delete(&ev);
      break;
    }
    struct pnode *kid = read_node(r, &ev, depth + 1);
    yaml_event_delete(&ev);
    if (!kid) goto fail;
    if (n->kind == PN_MAP && n->n % 2 == 0) {
      if (kid->kind != PN_SCALAR) {
        plan__error(r->ctx, kid->mark, "use plain words as keys", "a mapping key must be a scalar, not %s",
                    plan__kind_name(kid));
        plan__node_free(kid);
        goto fail;
      }
      struct pnode *dup = NULL;
      for (size_t i = 0; i < n->n; i += 2)
        if (!strcmp(n->kids[i]->str, kid->str)) dup = n->kids[i];
      if (dup) {
        char hint[256];
        snprintf(hint, sizeof hint, "remove one of the two; the first is at line %d", dup->mark.line);
        plan__error(r->ctx, kid->mark, hint, "key `%s` appears twice in this mapping", kid->str);
      }
    }
    node_push(n, kid);
  }
  return n;
fail:
  plan__node_free(n);
  return NULL;
}

static struct pnode *read_node(struct reader *r, yaml_event_t *ev, int depth) {
  struct plan_mark m = mark_of(r, ev->start_mark);
  if (depth > PLAN_MAX_DEPTH) {
    plan__error(r->ctx, m, "a plan needs only a few levels of nesting", "nesting deeper than %d levels",
                PLAN_MAX_DEPTH);
    return NULL;
  }
  switch (ev->type) {
    case YAML_SCALAR_EVENT: {
      struct pnode *n = node_new(PN_SCALAR, m);
      n->str = cedar_xstrdup((const char *)ev->data.scalar.value);
      n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
      return n;
    }
    case YAML_MAPPING_START_EVENT:
      return read_collection(r, node_new(PN_MAP, m), YAML_MAPPING_END_EVENT, depth);
    case YAML_SEQUENCE_START_EVENT:
      return read_collection(r, node_new(PN_SEQ, m), YAML_SEQUENCE_END_EVENT, depth);
    case YAML_ALIAS_EVENT:
      plan__error(r->ctx, m, "write the value out, or use `extends:` to share plan parts",
                  "YAML aliases (*%s) are not supported in plans", (const char *)ev->data.alias.anchor);
      return NULL;
    default:
      plan__error(r->ctx, m, NULL, "unexpected YAML event");
      return NULL;
  }
}

/* Parse one YAML document from memory. Empty input gives an empty mapping. */
static struct pnode *parse_text(struct plan_ctx *ctx, const char *file, const char *text, size_t len) {
  struct reader r = {.ctx = ctx, .file = plan__intern(ctx, file)};
  CEDAR_ASSERT(yaml_parser_initialize(&r.parser));
  yaml_parser_set_input_string(&r.parser, (const unsigned char *)text, len);
  struct pnode *root = NULL;
  bool done = false;
  while (!done) {
    yaml_event_t ev;
    if (next_event(&r, &ev)) break;
    switch (ev.type) {
      case YAML_STREAM_START_EVENT:
      case YAML_DOCUMENT_START_EVENT:
      case YAML_DOCUMENT_END_EVENT:
        break;
      case YAML_STREAM_END_EVENT:
        done = true;
        break;
      default:
        if (root) {
          plan__error(ctx, mark_of(&r, ev.start_mark), "put one plan in each file",
                      "a plan file holds one YAML document; this is a second one");
          plan__node_free(root);
          root = NULL;
          done = true;
          break;
        }
        root = read_node(&r, &ev, 0);
        if (!root) done = true;
    }
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&r.parser);
  if (ctx->n_errors) {
    plan__node_free(root);
    return NULL;
  }
  if (!root) return node_new(PN_MAP, (struct plan_mark){r.file, 1, 1});
  if (root->kind != PN_MAP) {
    plan__error(ctx, root->mark, "a plan is a mapping of sections: model, formats, layers, serving",
                "the top level of a plan must be a mapping, not %s", plan__kind_name(root));
    plan__node_free(root);
    return NULL;
  }
  return root;
}

/* ---------------------------------------------------------------- extends */

static void merge_into(struct pnode *base, struct pnode *over);

/* Remove and return the value of `key` from a map (the key node is freed). */
static struct pnode *map_take(struct pnode *map, const char *key) {
  for (size_t i = 0; i + 1 < map->n; i += 2) {
    if (strcmp(map->kids[i]->str, key)) continue;
    struct pnode *v = map->kids[i + 1];
    plan__node_free(map->kids[i]);
    memmove(&map->kids[i], &map->kids[i + 2], (map->n - i - 2) * sizeof *map->kids);
    map->n -= 2;
    return v;
  }
  return NULL;
}

/* Merge `over` into `base`; `over` is consumed. */
static void merge_into(struct pnode *base, struct pnode *over) {
  for (size_t i = 0; i + 1 < over->n; i += 2) {
    struct pnode *k = over->kids[i], *v = over->kids[i + 1];
    struct pnode *old = NULL;
    size_t at = 0;
    for (size_t j = 0; j + 1 < base->n; j += 2)
      if (!strcmp(base->kids[j]->str, k->str)) old = base->kids[j + 1], at = j + 1;
    if (old && old->kind == PN_MAP && v->kind == PN_MAP) {
      merge_into(old, v);
      plan__node_free(k);
    } else if (old && old->kind == PN_SEQ && v->kind == PN_SEQ && !strcmp(k->str, "layer_overrides")) {
      for (size_t j = 0; j < v->n; j++) node_push(old, v->kids[j]);
      v->n = 0;
      plan__node_free(v);
      plan__node_free(k);
    } else if (old) {
      plan__node_free(old);
      base->kids[at] = v;
      plan__node_free(k);
    } else {
      node_push(base, k);
      node_push(base, v);
    }
  }
  free(over->kids);
  free(over->str);
  free(over);
}

static char *slurp(const char *path, size_t *len, int *err, char *why, size_t why_len) {
  /* base/file.h: a FIFO, device or directory is refused without blocking */
  int fd = cedar_open_in(path, CEDAR_NO_CAP, NULL, why, why_len);
  FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
  if (!f) {
    *err = -1;
    if (fd >= 0) close(fd), snprintf(why, why_len, "%s", strerror(errno));
    return NULL;
  }
  char *buf = cedar_xmalloc(PLAN_MAX_BYTES + 1);
  size_t n = fread(buf, 1, PLAN_MAX_BYTES + 1, f);
  *err = ferror(f) ? EIO : 0;
  fclose(f);
  if (!*err && n > PLAN_MAX_BYTES) *err = EFBIG;
  if (*err) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

struct chain {
  char *real[PLAN_MAX_EXTENDS + 1];
  int n;
};

static struct pnode *read_file_rec(struct plan_ctx *ctx, const char *path, struct plan_mark from,
                                   struct chain *chain);

/* If `root` extends another plan, load that and merge root over it. */
static struct pnode *resolve_extends(struct plan_ctx *ctx, const char *path, struct pnode *root,
                                     struct chain *chain) {
  struct pnode *ext = map_take(root, "extends");
  if (!ext) return root;
  if (ext->kind != PN_SCALAR || !*ext->str) {
    plan__error(ctx, ext->mark, "write `extends: other.yaml`", "`extends` must be a file name");
    plan__node_free(ext);
    plan__node_free(root);
    return NULL;
  }
  char base_path[PATH_MAX];
  if (ext->str[0] == '/') {
    snprintf(base_path, sizeof base_path, "%s", ext->str);
  } else {
    char *dup = cedar_xstrdup(path);
    snprintf(base_path, sizeof base_path, "%s/%s", dirname(dup), ext->str);
    free(dup);
  }
  struct pnode *base = read_file_rec(ctx, base_path, ext->mark, chain);
  plan__node_free(ext);
  if (!base) {
    plan__node_free(root);
    return NULL;
  }
  /* `name` is the one key not inherited: a plan without one is named after
   * its own file (docs/plans.md), not shown and run as its parent */
  bool named = plan__map_get(root, "name") != NULL;
  merge_into(base, root);
  struct pnode *inherited = named ? NULL : map_take(base, "name");
  if (inherited) plan__node_free(inherited);
  return base;
}

static struct pnode *read_file_rec(struct plan_ctx *ctx, const char *path, struct plan_mark from,
                                   struct chain *chain) {
  char *real = realpath(path, NULL);
  if (!real) {
    char hint[PATH_MAX + 64];
    snprintf(hint, sizeof hint, "check the path; relative paths start from the directory of the file that names them");
    plan__error(ctx, from, hint, "cannot open plan '%s': %s", path, strerror(errno));
    return NULL;
  }
  for (int i = 0; i < chain->n; i++) {
    if (strcmp(chain->real[i], real)) continue;
    plan__error(ctx, from, "remove the `extends` that points back to a plan already in the chain",
                "`extends` cycle: '%s' extends itself through %d file(s)", path, chain->n - i);
    free(real);
    return NULL;
  }
  if (chain->n == PLAN_MAX_EXTENDS) {
    plan__error(ctx, from, "flatten the chain", "`extends` chain longer than %d files", PLAN_MAX_EXTENDS);
    free(real);
    return NULL;
  }
  struct stat st;
  if (stat(real, &st) || !S_ISREG(st.st_mode)) {
    plan__error(ctx, from, "name a plan file", "'%s' is not a regular file", path);
    free(real);
    return NULL;
  }
  chain->real[chain->n++] = real;
  LOG_DEBUG("plan: reading %s (%s), extends depth %d", path, real, chain->n - 1);
  size_t len = 0;
  int err = 0;
  char why[512];
  char *text = slurp(path, &len, &err, why, sizeof why);
  struct pnode *root = NULL;
  if (!text) {
    plan__error(ctx, from, err == EFBIG ? "plans are small; is this the right file?" : NULL,
                "cannot read plan '%s': %s", path,
                err == EFBIG ? "larger than 4 MiB" : err < 0 ? cedar_file_why(why, path) : strerror(err));
  } else {
    root = parse_text(ctx, path, text, len);
    free(text);
    if (root) root = resolve_extends(ctx, path, root, chain);
  }
  free(chain->real[--chain->n]);
  return root;
}

struct pnode *plan__read_file(struct plan_ctx *ctx, const char *path) {
  struct chain chain = {.n = 0};
  return read_file_rec(ctx, path, (struct plan_mark){plan__intern(ctx, path), 0, 0}, &chain);
}

struct pnode *plan__read_string(struct plan_ctx *ctx, const char *name, const char *text, size_t len) {
  struct pnode *root = parse_text(ctx, name, text, len);
  if (!root) return NULL;
  struct chain chain = {.n = 0};
  return resolve_extends(ctx, name, root, &chain);
}

int plan__edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return 99;
  int row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

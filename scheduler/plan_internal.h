/* plan_internal.h: the loader's private pieces, shared by plan_yaml.c (syntax
 * tree, `extends`), plan_load.c (keys and types) and plan_check.c (semantic
 * rules). Not part of the plan API; include scheduler/plan.h instead. */
#ifndef CEDAR_PLAN_INTERNAL_H
#define CEDAR_PLAN_INTERNAL_H

#include "scheduler/plan.h"

/* A YAML node with the place it came from. Maps keep keys and values
 * alternating in kids[] (key 2i, value 2i+1), in file order. */
enum pnode_kind { PN_SCALAR, PN_MAP, PN_SEQ };

struct pnode {
  enum pnode_kind kind;
  struct plan_mark mark;
  char *str;   /* scalars */
  bool plain;  /* an unquoted scalar: may be a number or a boolean */
  struct pnode **kids;
  size_t n, cap;
};

/* Loader context: diagnostics and the interned file names (handed to the plan). */
struct plan_ctx {
  struct plan_diags *diags;
  struct plan_diags own; /* used when the caller passed no diags */
  char **strings;
  size_t n_strings;
  int n_errors;
  const struct pnode *root; /* the merged tree, while the typed passes run */
};

void plan__error(struct plan_ctx *ctx, struct plan_mark mark, const char *hint,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A warning: recorded like an error, but the plan still loads. */
void plan__warn(struct plan_ctx *ctx, struct plan_mark mark, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *plan__intern(struct plan_ctx *ctx, const char *s);

/* Parse and resolve `extends` (files) or parse one string (no file). */
struct pnode *plan__read_file(struct plan_ctx *ctx, const char *path);
struct pnode *plan__read_string(struct plan_ctx *ctx, const char *name, const char *text,
                                size_t len);
void plan__node_free(struct pnode *n);
struct pnode *plan__map_get(const struct pnode *map, const char *key);
const char *plan__kind_name(const struct pnode *n);

/* Typed pass: tree -> struct plan (plan_load.c), then the rules (plan_check.c). */
void plan__defaults(struct plan *p);
void plan__from_tree(struct plan_ctx *ctx, const struct pnode *root, struct plan *p);
void plan__check(struct plan_ctx *ctx, struct plan *p);
/* serving.placement.stages / experts / engram (plan_place.c). */
void plan__read_placement(struct plan_ctx *ctx, const struct pnode *root, struct plan *p);
void plan__check_placement(struct plan_ctx *ctx, struct plan *p);

/* Edit distance, for did-you-mean suggestions. */
int plan__edit_distance(const char *a, const char *b);

#endif

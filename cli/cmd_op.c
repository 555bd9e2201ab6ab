/* cmd_op.c: `cedar op`, any registered op on tensors from a safetensors file.
 *
 *   cedar op --list [--json]
 *   cedar op NAME --help
 *   cedar op NAME --in IN.safetensors --out OUT.safetensors [--param k=v ...] [--json]
 *
 * Inputs are read by name from IN (F32, I32, I64 or U8), copied into aligned
 * buffers, handed to the op through `struct op_io` (ops/registry.h); outputs
 * are written to OUT with the same names. Bad files, missing or misshapen
 * tensors and unknown parameters are clear errors (exit 1; usage errors 2).
 * Tested by tests/cli/op.sh.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/registry.h"
#include "base/check.h"
#include "cli/cli.h"
#include "runtime/safetensors.h"

#define MAX_PARAMS 64
#define MAX_TENSORS 64

struct named {
  char *name;
  struct op_tensor t;
};

struct io_ctx {
  st_file_t *in;
  struct named inputs[MAX_TENSORS], outputs[MAX_TENSORS];
  int n_inputs, n_outputs;
  const char *pkey[MAX_PARAMS];
  double pval[MAX_PARAMS];
  int n_params;
  char error[512];
};

static bool st_to_op_dtype(enum st_dtype s, enum op_dtype *o) {
  switch (s) {
    case ST_F32: *o = OP_F32; return true;
    case ST_I32: *o = OP_I32; return true;
    case ST_I64: *o = OP_I64; return true;
    case ST_U8: *o = OP_U8; return true;
    default: return false;
  }
}

static enum st_dtype op_to_st_dtype(enum op_dtype o) {
  static const enum st_dtype map[] = {ST_F32, ST_I32, ST_I64, ST_U8};
  return map[o];
}

/* op_io.input: copy the file's tensor into an aligned buffer on first use. */
static const struct op_tensor *io_input(struct op_io *io, const char *name) {
  struct io_ctx *c = io->ctx;
  for (int i = 0; i < c->n_inputs; i++)
    if (!strcmp(c->inputs[i].name, name)) return &c->inputs[i].t;
  const struct st_tensor *st = st_find(c->in, name);
  enum op_dtype dt;
  if (!st || c->n_inputs == MAX_TENSORS || st->ndim > OP_MAX_DIMS) return NULL;
  if (!st_to_op_dtype(st->dtype, &dt)) {
    snprintf(c->error, sizeof c->error, "input '%s' has dtype %s; cedar op reads F32, I32, I64 and U8", name,
             st_dtype_name(st->dtype));
    return NULL;
  }
  struct named *n = &c->inputs[c->n_inputs];
  void *data = malloc(st->nbytes ? st->nbytes : 1);
  if (!data) return NULL;
  memcpy(data, st->data, st->nbytes);
  n->name = cedar_xstrdup(name);
  n->t = (struct op_tensor){.dtype = dt, .ndim = st->ndim, .data = data};
  memcpy(n->t.shape, st->shape, sizeof(int64_t) * (size_t)st->ndim);
  c->n_inputs++;
  return &n->t;
}

static void *io_output(struct op_io *io, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape) {
  struct io_ctx *c = io->ctx;
  if (c->n_outputs == MAX_TENSORS || ndim > OP_MAX_DIMS) return NULL;
  size_t count = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] && count > SIZE_MAX / 16 / (size_t)shape[i])) return NULL;
    count *= (size_t)shape[i];
  }
  void *data = calloc(count ? count : 1, op_dtype_size(dtype));
  if (!data) return NULL;
  struct named *n = &c->outputs[c->n_outputs++];
  n->name = cedar_xstrdup(name);
  n->t = (struct op_tensor){.dtype = dtype, .ndim = ndim, .data = data};
  memcpy(n->t.shape, shape, sizeof(int64_t) * (size_t)ndim);
  return data;
}

static bool io_param(struct op_io *io, const char *name, double *out) {
  struct io_ctx *c = io->ctx;
  for (int i = 0; i < c->n_params; i++)
    if (!strcmp(c->pkey[i], name)) return *out = c->pval[i], true;
  return false;
}

/* The first error is the cause (e.g. an unsupported dtype found while
 * reading an input); later ones are its consequences. */
static void io_fail(struct op_io *io, const char *msg) {
  struct io_ctx *c = io->ctx;
  if (!c->error[0]) snprintf(c->error, sizeof c->error, "%s", msg);
}

static void ctx_free(struct io_ctx *c) {
  for (int i = 0; i < c->n_inputs; i++) free(c->inputs[i].name), free(c->inputs[i].t.data);
  for (int i = 0; i < c->n_outputs; i++) free(c->outputs[i].name), free(c->outputs[i].t.data);
  st_close(c->in);
}

static void print_args(const char *title, const struct op_arg *a) {
  printf("%s:\n", title);
  for (; a && a->name; a++) printf("  %-12s %-4s %-18s %s\n", a->name, op_dtype_name(a->dtype), a->shape, a->doc);
}

static void op_help(const struct op_desc *d) {
  static const char *ptype[] = {"int", "float", "bool"};
  printf("usage: cedar op %s --in IN.safetensors --out OUT.safetensors [--param k=v ...] [--json]\n\n%s\n\n",
         d->name, d->summary);
  print_args("inputs (tensors of IN, by name)", d->inputs);
  print_args("outputs (written to OUT)", d->outputs);
  printf("parameters:\n");
  if (!d->params || !d->params->name) printf("  (none)\n");
  for (const struct op_param *p = d->params; p && p->name; p++)
  {
    char def[32]; /* integers in full (1.6e+07 would hide a table size) */
    snprintf(def, sizeof def, p->type == OP_PARAM_FLOAT ? "%g" : "%.0f", p->def);
    printf("  %-18s %-5s default %-10s %s\n", p->name, ptype[p->type], def, p->doc);
  }
}

static void op_list(bool json) {
  cJSON *arr = json ? cJSON_CreateArray() : NULL;
  for (int i = 0; i < OP_COUNT; i++) {
    const struct op_desc *d = op_registry[i];
    if (json) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "name", d->name);
      cJSON_AddStringToObject(o, "summary", d->summary);
      cJSON_AddItemToArray(arr, o);
    } else {
      printf("%-14s %s\n", d->name, d->summary);
    }
  }
  if (json) cli_print_json(arr);
}

/* Parse "k=v" against the op's declared parameters. */
static int add_param(struct io_ctx *c, const struct op_desc *d, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv) return cli_usage_error("op", "--param takes k=v, got '%s'", kv);
  const struct op_param *p = d->params;
  size_t klen = (size_t)(eq - kv);
  while (p && p->name && (strlen(p->name) != klen || strncmp(p->name, kv, klen))) p++;
  if (!p || !p->name) return cli_usage_error("op", "%s has no parameter '%.*s' (see cedar op %s --help)", d->name, (int)klen, kv, d->name);
  const char *v = eq + 1;
  char *end;
  errno = 0;
  double x = !strcmp(v, "true") ? 1 : !strcmp(v, "false") ? 0 : strtod(v, &end);
  bool word = !strcmp(v, "true") || !strcmp(v, "false");
  if (!word && (errno || end == v || *end || !isfinite(x)))
    return cli_usage_error("op", "parameter %s: '%s' is not a number", p->name, v);
  if ((p->type == OP_PARAM_INT && x != floor(x)) || (p->type == OP_PARAM_BOOL && x != 0 && x != 1))
    return cli_usage_error("op", "parameter %s must be %s, got '%s'", p->name,
                           p->type == OP_PARAM_INT ? "an integer" : "true or false", v);
  if (c->n_params == MAX_PARAMS) return cli_usage_error("op", "too many --param");
  c->pkey[c->n_params] = p->name;
  c->pval[c->n_params++] = x;
  return -1;
}

static int write_outputs(struct io_ctx *c, const char *path, bool json, const struct op_desc *d) {
  struct st_tensor ts[MAX_TENSORS];
  for (int i = 0; i < c->n_outputs; i++) {
    const struct op_tensor *t = &c->outputs[i].t;
    uint64_t count = 1;
    for (int k = 0; k < t->ndim; k++) count *= (uint64_t)t->shape[k];
    ts[i] = (struct st_tensor){.name = c->outputs[i].name, .dtype = op_to_st_dtype(t->dtype), .ndim = t->ndim,
                               .nbytes = count * op_dtype_size(t->dtype), .data = t->data};
    memcpy(ts[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  }
  char err[512];
  struct st_meta meta[] = {{"cedar_op", d->name}};
  if (st_write(path, ts, (size_t)c->n_outputs, meta, 1, err, sizeof err)) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, err);
    return 1;
  }
  if (json) {
    cJSON *o = cJSON_CreateObject(), *outs = cJSON_AddArrayToObject(o, "outputs");
    cJSON_AddStringToObject(o, "op", d->name);
    cJSON_AddStringToObject(o, "file", path);
    for (int i = 0; i < c->n_outputs; i++) {
      cJSON *e = cJSON_CreateObject(), *shape = cJSON_AddArrayToObject(e, "shape");
      cJSON_AddStringToObject(e, "name", ts[i].name);
      cJSON_AddStringToObject(e, "dtype", op_dtype_name(c->outputs[i].t.dtype));
      for (int k = 0; k < ts[i].ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ts[i].shape[k]));
      cJSON_AddItemToArray(outs, e);
    }
    cli_print_json(o);
  } else {
    printf("%s: wrote %d tensor(s) to %s\n", d->name, c->n_outputs, path);
  }
  return 0;
}

static int run_op(const struct op_desc *d, struct io_ctx *c, const char *in, const char *out, bool json) {
  char err[512];
  if (st_open(in, &c->in, err, sizeof err)) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, err);
    return 1;
  }
  struct op_io io = {.ctx = c, .input = io_input, .output = io_output, .param = io_param, .fail = io_fail};
  op_blas_init();
  /* An error recorded while the op ran fails the call even if the op went
   * on (e.g. an optional input present in the file but unreadable). */
  if (d->run(d, &io) || c->error[0]) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, c->error[0] ? c->error : "failed");
    return 1;
  }
  return write_outputs(c, out, json, d);
}

int cmd_op(int argc, char **argv) {
  static const struct option opts[] = {{"list", no_argument, NULL, 'l'},    {"help", no_argument, NULL, 'h'},
                                       {"json", no_argument, NULL, 'j'},    {"in", required_argument, NULL, 'i'},
                                       {"out", required_argument, NULL, 'o'}, {"param", required_argument, NULL, 'p'},
                                       {0}};
  const struct op_desc *d = argc > 1 && argv[1][0] != '-' ? op_find(argv[1]) : NULL;
  if (argc > 1 && argv[1][0] != '-' && !d) return cli_usage_error("op", "unknown op '%s' (cedar op --list)", argv[1]);
  struct io_ctx c = {0};
  const char *in = NULL, *out = NULL;
  bool json = false, list = false, help = false;
  int opt, rc = -1;
  optind = d ? 2 : 1;
  while (rc < 0 && (opt = getopt_long(argc, argv, "hi:o:", opts, NULL)) != -1) {
    switch (opt) {
      case 'l': list = true; break;
      case 'h': help = true; break;
      case 'j': json = true; break;
      case 'i': in = optarg; break;
      case 'o': out = optarg; break;
      case 'p': rc = d ? add_param(&c, d, optarg) : cli_usage_error("op", "--param needs an op name first"); break;
      default: rc = 2;
    }
  }
  if (rc >= 0) return rc;
  if (optind < argc) return cli_usage_error("op", "unexpected argument '%s'", argv[optind]);
  if (list) return op_list(json), 0;
  if (help || !d) {
    if (d) return op_help(d), 0;
    printf("usage: cedar op --list | cedar op NAME --help | cedar op NAME --in IN --out OUT [--param k=v ...]\n"
           "Run one registered op on tensors from a safetensors file.\n");
    return help ? 0 : 2;
  }
  if (!in || !out) return cli_usage_error("op", "%s needs --in and --out", d->name);
  rc = run_op(d, &c, in, out, json);
  ctx_free(&c);
  return rc;
}

/* cmd_op.c: `cedar op`, any registered op on tensors from a safetensors file.
 *
 *   cedar op --list [--json]
 *   cedar op NAME --help
 *   cedar op NAME --in IN.safetensors --out OUT.safetensors [--param k=v ...] [--json]
 *
 * The op's declared inputs are read by name from IN (F32, I32, I64 or U8),
 * copied into aligned buffers and handed to it through the memory-backed
 * op_io (ops/op_io_mem.h); its outputs are written to OUT with the same
 * names. Bad files, missing or misshapen tensors and unknown parameters are
 * clear errors (exit 1; usage errors 2).
 * Tested by tests/cli/op.sh.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <sys/stat.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/op_io_mem.h"
#include "ops/registry.h"
#include "base/check.h"
#include "cli/cli.h"
#include "runtime/load/safetensors.h"

/* The file and the call: m holds the inputs (copies of the file's tensors,
 * freed by ctx_free), the parameters and the outputs. */
struct io_ctx {
  st_file_t *in;
  struct op_io_mem m;
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

/* Copy every tensor of the file that the op declares as an input into an
 * aligned buffer of the call; tensors it does not declare are never read.
 * A declared tensor of a dtype cedar op cannot hand over fails the call. */
static int load_inputs(struct io_ctx *c, const struct op_desc *d) {
  for (const struct op_arg *a = d->inputs; a && a->name; a++) {
    const struct st_tensor *st = st_find(c->in, a->name);
    enum op_dtype dt;
    if (!st) continue; /* the op says whether it needs it */
    if (!st_to_op_dtype(st->dtype, &dt))
      return snprintf(c->m.error, sizeof c->m.error, "input '%s' has dtype %s; cedar op reads F32, I32, I64 and U8",
                      a->name, st_dtype_name(st->dtype)), CEDAR_EINVAL;
    if (st->ndim > OP_MAX_DIMS)
      return snprintf(c->m.error, sizeof c->m.error, "input '%s' has %d dims; cedar op takes at most %d", a->name,
                      st->ndim, OP_MAX_DIMS), CEDAR_EINVAL;
    void *data = malloc(st->nbytes ? st->nbytes : 1);
    if (!data) return snprintf(c->m.error, sizeof c->m.error, "cannot copy input '%s'", a->name), CEDAR_ENOMEM;
    memcpy(data, st->data, st->nbytes);
    if (op_io_mem_input(&c->m, a->name, dt, st->ndim, st->shape, data)) {
      free(data);
      return snprintf(c->m.error, sizeof c->m.error, "too many inputs"), CEDAR_EINVAL;
    }
  }
  return 0;
}

static void ctx_free(struct io_ctx *c) {
  for (int i = 0; i < c->m.n_in; i++) free(c->m.in[i].data);
  op_io_mem_free(&c->m);
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
  if (op_io_mem_param(&c->m, p->name, x)) return cli_usage_error("op", "too many --param");
  return -1;
}

static int write_outputs(struct io_ctx *c, const char *path, bool json, const struct op_desc *d) {
  struct st_tensor ts[OP_IO_MEM_MAX];
  const struct op_io_mem *m = &c->m;
  for (int i = 0; i < m->n_out; i++) {
    const struct op_tensor *t = &m->out[i];
    ts[i] = (struct st_tensor){.name = m->out_name[i], .dtype = op_to_st_dtype(t->dtype), .ndim = t->ndim,
                               .nbytes = op_io_mem_bytes(t), .data = t->data};
    memcpy(ts[i].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
  }
  char err[512];
  struct st_meta meta[] = {{"cedar_op", d->name}};
  if (st_write(path, ts, (size_t)m->n_out, meta, 1, err, sizeof err)) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, err);
    return 1;
  }
  if (json) {
    cJSON *o = cJSON_CreateObject(), *outs = cJSON_AddArrayToObject(o, "outputs");
    cJSON_AddStringToObject(o, "op", d->name);
    cJSON_AddStringToObject(o, "file", path);
    for (int i = 0; i < m->n_out; i++) {
      cJSON *e = cJSON_CreateObject(), *shape = cJSON_AddArrayToObject(e, "shape");
      cJSON_AddStringToObject(e, "name", ts[i].name);
      cJSON_AddStringToObject(e, "dtype", op_dtype_name(m->out[i].dtype));
      for (int k = 0; k < ts[i].ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ts[i].shape[k]));
      cJSON_AddItemToArray(outs, e);
    }
    cli_print_json(o);
  } else {
    printf("%s: wrote %d tensor(s) to %s\n", d->name, m->n_out, path);
  }
  return 0;
}

static int run_op(const struct op_desc *d, struct io_ctx *c, const char *in, const char *out, bool json) {
  char err[512];
  if (st_open(in, &c->in, err, sizeof err)) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, err);
    return 1;
  }
  op_blas_init();
  /* An error recorded while the op ran fails the call even if the op went
   * on (the first message is kept: it is the cause). */
  if (load_inputs(c, d) || d->run(d, &c->m.io) || c->m.error[0]) {
    fprintf(stderr, "cedar op %s: %s\n", d->name, c->m.error[0] ? c->m.error : "failed");
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
  op_io_mem_init(&c.m);
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
  struct stat si, so;
  if (!stat(in, &si) && !stat(out, &so) && si.st_dev == so.st_dev && si.st_ino == so.st_ino)
    return cli_usage_error("op", "--out %s is the --in file: the outputs would replace the inputs; name another file",
                           out);
  if (cli_check_out("op", "--out", out)) return 1;
  rc = run_op(d, &c, in, out, json);
  ctx_free(&c);
  return rc;
}

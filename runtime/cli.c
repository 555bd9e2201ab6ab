/* cli.c: helpers shared by the subcommands, and `cedar version`. */
#include "runtime/cli.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

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
  (void)argc;
  (void)argv;
  printf("cedar %s\n", CEDAR_VERSION);
  return 0;
}

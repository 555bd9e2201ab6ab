/* log.c: CEDAR_LOG-controlled logging (log.h). Allocation and status
 * strings are check.c. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1;

enum cedar_log_level cedar_log_level(void) {
  if (g_level < 0) {
    const char *env = getenv("CEDAR_LOG");
    g_level = CEDAR_LOG_WARN;
    if (env) {
      if (!strcmp(env, "error")) g_level = CEDAR_LOG_ERROR;
      else if (!strcmp(env, "warn")) g_level = CEDAR_LOG_WARN;
      else if (!strcmp(env, "info")) g_level = CEDAR_LOG_INFO;
      else if (!strcmp(env, "debug")) g_level = CEDAR_LOG_DEBUG;
      else fprintf(stderr, "cedar: warning: CEDAR_LOG=%s is not one of error, warn, info, debug; using warn\n", env);
    }
  }
  return (enum cedar_log_level)g_level;
}

void cedar_log(enum cedar_log_level level, const char *fmt, ...) {
  static const char *names[] = {"error", "warning", "info", "debug"};
  if (level > cedar_log_level()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cedar: %s: ", names[level]);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}


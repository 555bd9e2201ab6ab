/* log.h: leveled logging to stderr.
 *
 * The level comes from the CEDAR_LOG environment variable (error, warn, info,
 * debug; default warn) and is read once. Messages are single lines prefixed
 * with the level. This is for diagnostics; command results go to stdout.
 */
#ifndef CEDAR_LOG_H
#define CEDAR_LOG_H

enum cedar_log_level { CEDAR_LOG_ERROR, CEDAR_LOG_WARN, CEDAR_LOG_INFO, CEDAR_LOG_DEBUG };

enum cedar_log_level cedar_log_level(void);
void cedar_log(enum cedar_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) cedar_log(CEDAR_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) cedar_log(CEDAR_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) cedar_log(CEDAR_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...)                                         \
  do {                                                         \
    if (cedar_log_level() >= CEDAR_LOG_DEBUG)                  \
      cedar_log(CEDAR_LOG_DEBUG, __VA_ARGS__);                 \
  } while (0)

#endif

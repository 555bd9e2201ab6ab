/* file.c: bounded, non-blocking input and temp-and-rename output (file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void say(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t err_len, const char *fmt, ...) {
  if (!err || !err_len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

static const char *kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "a special file";
}

int cedar_open_in(const char *path, uint64_t cap, uint64_t *size, char *err, size_t err_len) {
  if (!path || !*path) return say(err, err_len, "an empty path: give a file name"), -1;
  /* O_NONBLOCK: opening a FIFO with no writer (or a tty) returns at once, so
   * the fstat below can refuse it; a regular file ignores the flag. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return say(err, err_len, "%s: cannot open: %s", path, strerror(errno)), -1;
  struct stat sb;
  if (fstat(fd, &sb)) {
    int e = errno;
    close(fd);
    return say(err, err_len, "%s: cannot stat: %s", path, strerror(e)), -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return say(err, err_len, "%s: not a regular file (%s); cedar reads only regular files: give a file", path,
               kind_of(sb.st_mode)),
           -1;
  }
  if ((uint64_t)sb.st_size > cap) {
    close(fd);
    return say(err, err_len, "%s: %lld bytes, over the %llu-byte limit for this input: give a smaller file", path,
               (long long)sb.st_size, (unsigned long long)cap),
           -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
    int e = errno;
    close(fd);
    return say(err, err_len, "%s: cannot clear O_NONBLOCK: %s", path, strerror(e)), -1;
  }
  if (size) *size = (uint64_t)sb.st_size;
  return fd;
}

FILE *cedar_fopen_in(const char *path, uint64_t cap, char *err, size_t err_len) {
  int fd = cedar_open_in(path, cap, NULL, err, err_len);
  if (fd < 0) return NULL;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    say(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    close(fd);
  }
  return f;
}

/* Read fd to its end, refusing more than cap bytes. */
static char *read_fd(int fd, const char *path, uint64_t cap, uint64_t hint, size_t *len, char *err, size_t err_len) {
  size_t n = 0, alloc = hint < cap ? (size_t)hint + 1 : 65536;
  if (alloc < 4096) alloc = 4096;
  char *buf = malloc(alloc);
  if (!buf) return say(err, err_len, "%s: out of memory reading it", path), NULL;
  for (;;) {
    if (n + 1 == alloc) { /* grow, but to no more than cap + 1 bytes of data: one over says "too large" */
      size_t want = alloc * 2;
      if (cap < SIZE_MAX - 2 && want > cap + 2) want = (size_t)cap + 2;
      char *p = realloc(buf, want);
      if (!p) {
        free(buf);
        return say(err, err_len, "%s: out of memory reading it (%zu bytes so far)", path, n), NULL;
      }
      buf = p, alloc = want;
    }
    ssize_t r = read(fd, buf + n, alloc - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      return say(err, err_len, "%s: read failed: %s", path, strerror(e)), NULL;
    }
    if (r == 0) break;
    n += (size_t)r;
    if (n > cap) {
      free(buf);
      return say(err, err_len, "%s: more than the %llu-byte limit for this input: give a smaller file", path,
                 (unsigned long long)cap),
             NULL;
    }
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

char *cedar_read_all(const char *path, uint64_t cap, size_t *len, char *err, size_t err_len) {
  if (path && !strcmp(path, "-")) return read_fd(STDIN_FILENO, "standard input", cap, 0, len, err, err_len);
  uint64_t size = 0;
  int fd = cedar_open_in(path, cap, &size, err, err_len);
  if (fd < 0) return NULL;
  char *buf = read_fd(fd, path, cap, size, len, err, err_len); /* the cap again: the file may grow */
  close(fd);
  return buf;
}

const char *cedar_file_why(const char *msg, const char *path) {
  size_t k = strlen(path);
  return !strncmp(msg, path, k) && msg[k] == ':' && msg[k + 1] == ' ' ? msg + k + 2 : msg;
}

void cedar_ignore_sigxfsz(void) {
  static atomic_flag done = ATOMIC_FLAG_INIT;
  if (!atomic_flag_test_and_set(&done)) signal(SIGXFSZ, SIG_IGN);
}

const char *cedar_write_strerror(int e) {
  if (e == ENOSPC) return "no space left on the device (the disk is full)";
  if (e == EFBIG) return "file too large (over the file size limit, see `ulimit -f`)";
  if (e == EDQUOT) return "disk quota exceeded";
  return strerror(e);
}

int cedar_out_open(struct cedar_out *o, const char *path, char *err, size_t err_len) {
  static atomic_uint counter;
  memset(o, 0, sizeof *o);
  if (!path || !*path) return say(err, err_len, "an empty output path: give a file name"), -1;
  cedar_ignore_sigxfsz();
  struct stat sb;
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return say(err, err_len, "%s: exists and is not a regular file (%s); cedar writes only regular files: give another name", path,
               kind_of(sb.st_mode)),
           -1;
  size_t tl = strlen(path) + 48;
  o->path = strdup(path);
  o->tmp = malloc(tl);
  if (!o->path || !o->tmp) {
    cedar_out_discard(o);
    return say(err, err_len, "%s: out of memory", path), -1;
  }
  snprintf(o->tmp, tl, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
  int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    say(err, err_len, "%s: cannot create temporary file %s: %s", path, o->tmp, strerror(errno));
    free(o->tmp), o->tmp = NULL; /* not ours to remove */
    cedar_out_discard(o);
    return -1;
  }
  o->f = fdopen(fd, "wb");
  if (!o->f) {
    say(err, err_len, "%s: cannot open a stream: %s", path, strerror(errno));
    close(fd);
    cedar_out_discard(o);
    return -1;
  }
  return 0;
}

int cedar_out_write(struct cedar_out *o, const void *p, size_t n) {
  if (!n) return 0;
  if (fwrite(p, 1, n, o->f) == n) return 0;
  if (!o->err_no) o->err_no = errno ? errno : EIO;
  return -1;
}

static int sync_dir(const char *path, char *err, size_t err_len) {
  char *dup = strdup(path);
  if (!dup) return 0; /* the file is in place; only the directory's durability is unconfirmed */
  char *slash = strrchr(dup, '/');
  const char *dir = slash ? (slash == dup ? "/" : (*slash = '\0', dup)) : ".";
  int rc = 0, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    if (fsync(fd) && errno != EINVAL)
      rc = -1, say(err, err_len, "%s: written, but the fsync of its directory failed: %s", path, strerror(errno));
    close(fd);
  }
  free(dup);
  return rc;
}

int cedar_out_commit(struct cedar_out *o, char *err, size_t err_len) {
  int e = o->err_no;
  errno = 0;
  if (fflush(o->f) && !e) e = errno ? errno : EIO;
  if (ferror(o->f) && !e) e = EIO;
  if (!e && fsync(fileno(o->f)) && errno != EINVAL) e = errno; /* a delayed ENOSPC shows here on some file systems */
  errno = 0;
  if (fclose(o->f) && !e) e = errno ? errno : EIO;
  o->f = NULL;
  if (!e && rename(o->tmp, o->path)) {
    int re = errno;
    say(err, err_len, "%s: cannot rename %s over it: %s", o->path, o->tmp, strerror(re));
    cedar_out_discard(o);
    return -1;
  }
  if (e) {
    say(err, err_len, "%s: write failed: %s; nothing was written (an old file of that name is unchanged)", o->path,
        cedar_write_strerror(e));
    cedar_out_discard(o);
    return -1;
  }
  int rc = sync_dir(o->path, err, err_len);
  free(o->tmp), o->tmp = NULL;
  free(o->path), o->path = NULL;
  return rc;
}

void cedar_out_discard(struct cedar_out *o) {
  if (o->f) fclose(o->f);
  if (o->tmp) unlink(o->tmp);
  free(o->tmp);
  free(o->path);
  memset(o, 0, sizeof *o);
}

int cedar_write_file(const char *path, const void *data, size_t len, char *err, size_t err_len) {
  struct cedar_out o;
  if (cedar_out_open(&o, path, err, err_len)) return -1;
  cedar_out_write(&o, data, len);
  return cedar_out_commit(&o, err, err_len);
}

int cedar_stdout_close(const char *cmd) {
  errno = 0;
  bool bad = fflush(stdout) != 0;
  int e = errno;
  if (!bad && !ferror(stdout)) return 0;
  fprintf(stderr, "cedar %s: writing standard output failed: %s\n", cmd, cedar_write_strerror(e ? e : EIO));
  return 1;
}

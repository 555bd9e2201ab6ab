/* file.h: how cedar opens the files a user names, and how it writes files.
 *
 * Input (issue 28 rows 6 and 7): a path is opened with O_NONBLOCK, then
 * fstat'ed, then refused unless it is a regular file, so a FIFO, a device
 * (/dev/zero) or a directory is refused at once instead of blocking or
 * reading forever; a file over the caller's size cap is refused before a
 * byte is read. Standard input ("-", where a command takes it) is read
 * under the same cap. Every message names the path and says what to give.
 *
 * Output (rows 5 and 12): a file is written to "<path>.tmp.<pid>.<n>" in
 * the same directory, every write, flush, fsync and close is checked, and
 * only a complete file is renamed over <path>; on any failure the temporary
 * is removed and the old <path> (if any) is left as it was. SIGXFSZ is
 * ignored so that `ulimit -f` shows up as EFBIG, reported like ENOSPC.
 *
 * Not here: parsing (libyaml, cJSON), mapping (runtime/safetensors.c maps
 * the descriptor cedar_open_in returns). Tested by tests/cli/paths.sh and
 * tests/cli/full_disk.sh.
 */
#ifndef CEDAR_FILE_H
#define CEDAR_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Size caps callers pass. Text a user gives (request lists, traces, prompt
 * files, tokenizer.json, config.json, a checkpoint's index, plans, traces
 * for `view`): 256 MiB, far above any real one (a DeepSeek tokenizer.json is
 * 8 MB) and small enough to hold in memory twice while parsing. */
#define CEDAR_TEXT_MAX ((uint64_t)256 << 20)
/* Binary files that are mapped, not read (shards): no cap beyond the disk. */
#define CEDAR_NO_CAP UINT64_MAX

/* Open path read-only without blocking; refuse what is not a regular file,
 * or a file of more than cap bytes. Returns a blocking descriptor (close-on-
 * exec) and its size in *size (may be NULL), or -1 with "<path>: why" in err. */
int cedar_open_in(const char *path, uint64_t cap, uint64_t *size, char *err, size_t err_len);

/* cedar_open_in as a "rb" stream; NULL with the message in err. */
FILE *cedar_fopen_in(const char *path, uint64_t cap, char *err, size_t err_len);

/* The whole of path ("-": standard input, a pipe allowed), at most cap
 * bytes, NUL-terminated, its length in *len. NULL with the message in err
 * (too large, not a regular file, a read error, out of memory). */
char *cedar_read_all(const char *path, uint64_t cap, size_t *len, char *err, size_t err_len);

/* An output file in progress: write to f (stdio) or with cedar_out_write. */
struct cedar_out {
  FILE *f;
  char *path, *tmp;
  int err_no; /* the first failed write's errno, 0 if none */
};

/* Ignore SIGXFSZ (once per process), so that a write past `ulimit -f` fails
 * with EFBIG and is reported instead of killing cedar without a word. */
void cedar_ignore_sigxfsz(void);

/* Start writing path: refuses a path that exists and is not a regular file
 * (rename would replace a device or a link's target). 0, or -1 with err. */
int cedar_out_open(struct cedar_out *o, const char *path, char *err, size_t err_len);
/* fwrite with the failure remembered; 0 or -1. */
int cedar_out_write(struct cedar_out *o, const void *p, size_t n);
/* Flush, fsync, close and rename over path (then fsync the directory).
 * On any failure the temporary is removed and err says why (ENOSPC and
 * EFBIG by name). 0 or -1. Frees o either way. */
int cedar_out_commit(struct cedar_out *o, char *err, size_t err_len);
/* Give up: close and remove the temporary. Safe on a zeroed or closed o. */
void cedar_out_discard(struct cedar_out *o);

/* The whole of data written to path through the above. 0 or -1. */
int cedar_write_file(const char *path, const void *data, size_t len, char *err, size_t err_len);

/* A message from the functions above without its leading "<path>: ", for
 * callers whose own error format names the path already. */
const char *cedar_file_why(const char *msg, const char *path);

/* A sentence for a write's errno: ENOSPC and EFBIG get a hint. */
const char *cedar_write_strerror(int err_no);

/* Check standard output at exit: flush it and report a failed write (a full
 * disk, /dev/full, a closed pipe) as "cedar <cmd>: ..." on stderr. Returns
 * 0, or 1 after the message. */
int cedar_stdout_close(const char *cmd);

#endif

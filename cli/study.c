/* study.c: the helpers of `cedar report` and `cedar explore` (study.h). */
#define _GNU_SOURCE /* mkostemp */
#include "cli/study.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "runtime/load/weights.h"

void study_mem_of(const struct plan_cost *c, struct study_mem *m) {
  memset(m, 0, sizeof(*m));
  for (int s = 0; s < c->n_sources; s++) {
    m->main_kv += c->src[s].entries * c->src[s].main_bytes;
    m->indexer_k += c->src[s].entries * c->src[s].indexer_bytes;
  }
  m->swa = c->swa_payload_bytes + c->swa_scale_bytes;
  m->tails = c->tail_bytes;
  m->total = m->main_kv + m->indexer_k + m->swa + m->tails;
  m->baseline = c->baseline_bytes;
}

/* ---- signals: a child is not left behind (issue 28 row 17) ----------------- */

static volatile sig_atomic_t caught_sig; /* the SIGINT/SIGTERM/SIGHUP that arrived, or 0 */
static volatile sig_atomic_t child_pid;  /* the child running now (cedar run, gnuplot), or 0 */

static void on_signal(int sig) {
  caught_sig = sig;
  pid_t c = (pid_t)child_pid;
  if (c > 0) kill(c, SIGTERM); /* async-signal-safe; the waitpid below then returns */
}

void study_trap_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
}

int study_interrupted(void) { return (int)caught_sig; }

void study_reraise(void) {
  int sig = (int)caught_sig;
  if (!sig) return;
  signal(sig, SIG_DFL);
  raise(sig); /* the exit status says which signal ended the study, as without the trap */
}

/* fork with the trapped signals held until child_pid is set, so a signal
 * between the two still reaches the child; the child gets them back. */
static pid_t spawn(void) {
  sigset_t hold, old;
  sigemptyset(&hold);
  sigaddset(&hold, SIGINT);
  sigaddset(&hold, SIGTERM);
  sigaddset(&hold, SIGHUP);
  sigprocmask(SIG_BLOCK, &hold, &old);
  pid_t pid = caught_sig ? -1 : fork(); /* after a signal: start nothing more */
  if (pid == 0) {
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
  } else if (pid > 0) {
    child_pid = pid;
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  return pid;
}

/* waitpid through EINTR; the child is no longer ours to signal after. */
static int reap(pid_t pid, int *st) {
  int rc;
  while ((rc = waitpid(pid, st, 0)) < 0 && errno == EINTR) {}
  child_pid = 0;
  return rc;
}

/* ---- a child `cedar run` ---------------------------------------------------- */

/* Run this binary with argv (argv[0] ignored); stdout into *out (malloc'd),
 * the last of stderr into err. Returns the exit status, or -1. */
static int run_self(char *const argv[], char **out, char *err, size_t err_len) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  *out = NULL;
  err[0] = 0;
  if (n <= 0) {
    snprintf(err, err_len, "cannot find this program (/proc/self/exe): %s", strerror(errno));
    return -1;
  }
  self[n] = 0;
  int pfd[2];
  char errpath[] = "/tmp/cedar-study-XXXXXX";
  int efd = mkostemp(errpath, O_CLOEXEC);
  if (efd < 0 || pipe(pfd)) {
    snprintf(err, err_len, "cannot start a child: %s", strerror(errno));
    if (efd >= 0) close(efd), unlink(errpath);
    return -1;
  }
  unlink(errpath);
  fflush(NULL);
  pid_t pid = spawn();
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(efd, 2);
    close(pfd[0]);
    close(pfd[1]);
    execv(self, argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t cap = 1 << 14, len = 0;
  char *buf = cedar_xmalloc(cap);
  for (;;) {
    if (len + 1 == cap) buf = cedar_xrealloc(buf, cap *= 2);
    ssize_t r = read(pfd[0], buf + len, cap - len - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    len += (size_t)r;
  }
  buf[len] = 0;
  close(pfd[0]);
  int st = 0;
  if (pid > 0) reap(pid, &st);
  /* the last line of stderr: the reason */
  off_t size = lseek(efd, 0, SEEK_END);
  if (size > 0) {
    off_t from = size > (off_t)err_len - 1 ? size - (off_t)err_len + 1 : 0;
    ssize_t r = pread(efd, err, err_len - 1, from);
    err[r > 0 ? r : 0] = 0;
    size_t e = strlen(err);
    while (e && err[e - 1] == '\n') err[--e] = 0;
    char *nl = strrchr(err, '\n');
    if (nl) memmove(err, nl + 1, strlen(nl + 1) + 1);
  }
  close(efd);
  *out = buf;
  if (pid < 0) return -1;
  if (WIFSIGNALED(st)) {
    snprintf(err + strlen(err), err_len - strlen(err), "%skilled by signal %d", err[0] ? "; " : "", WTERMSIG(st));
    return -1;
  }
  return WEXITSTATUS(st);
}

static double num(const cJSON *o, const char *a, const char *b) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
  if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
  return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

int study_run(const char *plan_path, const struct plan *p, const struct study_run_opts *o, struct study_run *r) {
  memset(r, 0, sizeof(*r));
  struct weights_list wl;
  char err[256];
  if (weights_list_init(&wl, p, err, sizeof err)) {
    snprintf(r->why, sizeof r->why, "weights: %s", err);
    return 1;
  }
  uint64_t wb = wl.total_bytes;
  weights_list_free(&wl);
  if (wb > o->max_weights) {
    snprintf(r->why, sizeof r->why, "not run: its weights are %.2f GB, above --max-weights %.2f GB", wb / 1e9,
             o->max_weights / 1e9);
    return 1;
  }
  /* The built-in text as byte tokens; a plan whose vocabulary cannot hold
   * bytes gets ids (37 i + 11) mod vocab instead. */
  char prompt[32], decode[16];
  snprintf(prompt, sizeof prompt, "%" PRId64, o->prompt);
  snprintf(decode, sizeof decode, "%d", o->decode);
  bool bytes = p->model.vocab >= 256;
  char *ids = NULL;
  if (!bytes) {
    ids = cedar_xmalloc((size_t)o->prompt * 12 + 1);
    size_t len = 0;
    for (int64_t i = 0; i < o->prompt; i++)
      len += (size_t)sprintf(ids + len, "%s%" PRId64, i ? "," : "", (37 * i + 11) % p->model.vocab);
  }
  char *argv[] = {"cedar", "run", "--plan", (char *)plan_path, bytes ? "--prompt-len" : "--tokens", bytes ? prompt : ids,
                  "--max-new", decode, "--executor", "direct", "--json", o->drift ? "--exact-replay" : NULL, NULL};
  snprintf(r->cmd, sizeof r->cmd, "cedar run --plan %s %s %s --max-new %s --executor direct --json%s", plan_path,
           bytes ? "--prompt-len" : "--tokens", bytes ? prompt : "<(37 i + 11) mod vocab, i < n>", decode,
           o->drift ? " --exact-replay" : "");
  char *out = NULL, why[256];
  int st = run_self(argv, &out, why, sizeof why);
  free(ids);
  cJSON *j = st == 0 ? cJSON_Parse(out) : NULL;
  free(out);
  if (st != 0 || !j) {
    snprintf(r->why, sizeof r->why, "%s failed: %s", r->cmd, st != 0 ? why : "its output is not JSON");
    cJSON_Delete(j);
    return 1;
  }
  r->prefill_s = num(j, "ttft_s", NULL);
  r->itl_s = num(j, "itl_steady_s", NULL); /* the steady ITL needs three tokens; else the first */
  if (!(r->itl_s > 0)) r->itl_s = num(j, "itl_first_s", NULL);
  r->token_layers = (int64_t)num(j, "token_layers_prefill", NULL);
  r->state_agrees = num(j, "state_bytes", "global_kv") == num(j, "plan_cost", "global_kv") &&
                    num(j, "state_bytes", "swa") == num(j, "plan_cost", "swa") &&
                    num(j, "state_bytes", "tails") == num(j, "plan_cost", "tails");
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "exact_replay");
  if (d) {
    r->has_drift = true;
    r->drift_rel_rms = num(d, "decoder_logits_rel_rms", NULL);
    r->drift_max_abs = num(d, "decoder_logits_max_abs", NULL);
    r->same_top1 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "same_top1"));
    r->entries_equal = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(d, "encoder_entries_equal"));
  }
  cJSON_Delete(j);
  if (!isfinite(r->prefill_s) || (o->drift && !r->has_drift)) {
    snprintf(r->why, sizeof r->why, "%s: its JSON lacks ttft_s or exact_replay", r->cmd);
    return 1;
  }
  r->ok = true;
  return 0;
}

/* ---- quality: a child `cedar eval` ---------------------------------------- */

static uint64_t weights_bytes(const struct plan *p) {
  struct weights_list wl;
  char err[256];
  if (weights_list_init(&wl, p, err, sizeof err)) return 0;
  uint64_t wb = wl.total_bytes;
  weights_list_free(&wl);
  return wb;
}

int study_quality_run(const char *plan_path, const struct plan *p, const struct study_quality_opts *o,
                      struct study_quality *q) {
  memset(q, 0, sizeof(*q));
  uint64_t wb = weights_bytes(p);
  if (!o->model && !o->weights && wb > o->max_weights) {
    snprintf(q->why, sizeof q->why, "not run: its weights are %.2f GB, above --max-weights %.2f GB", wb / 1e9,
             o->max_weights / 1e9);
    return 1;
  }
  char ctx[32] = "", stride[32] = "";
  char *argv[20];
  int a = 0;
  argv[a++] = "cedar", argv[a++] = "eval", argv[a++] = "--plan", argv[a++] = (char *)plan_path;
  argv[a++] = "--text", argv[a++] = (char *)o->text;
  if (o->model) argv[a++] = "--model", argv[a++] = (char *)o->model;
  if (o->weights) argv[a++] = "--weights", argv[a++] = (char *)o->weights;
  if (o->context > 0) snprintf(ctx, sizeof ctx, "%" PRId64, o->context), argv[a++] = "--context", argv[a++] = ctx;
  if (o->stride > 0) snprintf(stride, sizeof stride, "%" PRId64, o->stride), argv[a++] = "--stride", argv[a++] = stride;
  argv[a++] = "--dense-ref", argv[a++] = "--json", argv[a] = NULL;
  size_t len = 0;
  for (int i = 0; i < a && len < sizeof q->cmd; i++)
    len += (size_t)snprintf(q->cmd + len, sizeof q->cmd - len, "%s%s", i ? " " : "", argv[i]);
  char *out = NULL, why[256];
  int st = run_self(argv, &out, why, sizeof why);
  cJSON *j = st == 0 ? cJSON_Parse(out) : NULL;
  free(out);
  if (st != 0 || !j) {
    snprintf(q->why, sizeof q->why, "%.500s failed: %s", q->cmd, st != 0 ? why : "its output is not JSON");
    cJSON_Delete(j);
    return 1;
  }
  q->tokens = (int64_t)num(j, "tokens", NULL);
  q->bytes = (int64_t)num(j, "bytes", NULL);
  q->bits_per_byte = num(j, "bits_per_byte", NULL);
  q->accuracy = num(j, "accuracy", NULL);
  q->tokens_per_s = num(j, "tokens_per_s", NULL);
  q->agreement = num(j, "dense", "top1_agreement");
  q->kl = num(j, "dense", "kl_nats_per_token");
  q->dense_bits_per_byte = num(j, "dense", "bits_per_byte");
  cJSON_Delete(j);
  if (!isfinite(q->bits_per_byte) || !isfinite(q->agreement) || !isfinite(q->kl)) {
    snprintf(q->why, sizeof q->why, "%.500s: its JSON lacks bits_per_byte or dense", q->cmd);
    return 1;
  }
  q->ok = true;
  return 0;
}

/* ---- gnuplot and files ------------------------------------------------------- */

bool study_have_gnuplot(void) {
  const char *path = getenv("PATH");
  if (!path) return false;
  char buf[PATH_MAX];
  for (const char *s = path; *s;) {
    const char *e = strchr(s, ':');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    snprintf(buf, sizeof buf, "%.*s/gnuplot", (int)n, s);
    if (n && access(buf, X_OK) == 0) return true;
    if (!e) break;
    s = e + 1;
  }
  return false;
}

int study_gnuplot(const char *dir, const char *script, char *err, size_t err_len) {
  fflush(NULL);
  pid_t pid = spawn();
  if (pid == 0) {
    if (chdir(dir)) _exit(126);
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s.log", script); /* gnuplot's warnings and errors, beside its script */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execlp("gnuplot", "gnuplot", script, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  if (pid < 0 || reap(pid, &st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
    snprintf(err, err_len, "gnuplot %s/%s failed (exit %d)%s%s%s", dir, script, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
             WIFEXITED(st) && WEXITSTATUS(st) == 127 ? ": gnuplot is not installed (apt-get install gnuplot-nox)"
                                                      : "; see ",
             WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "" : script, WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "" : ".log");
    return 1;
  }
  /* gnuplot can exit 0 with its output unwritten (a full disk): the script
   * X.gp writes X.png, which must now be there and not empty; a partial one
   * is removed. */
  char png[PATH_MAX];
  struct stat sb;
  int k = snprintf(png, sizeof png, "%s/%s", dir, script);
  if (k > 3 && k + 2 < (int)sizeof png && !strcmp(png + k - 3, ".gp")) {
    strcpy(png + k - 3, ".png");
    if (stat(png, &sb) || !S_ISREG(sb.st_mode) || sb.st_size == 0) {
      snprintf(err, err_len, "gnuplot %s/%s exited 0 but wrote no %s (a full disk?); see %s.log", dir, script, png,
               script);
      unlink(png);
      return 1;
    }
  }
  return 0;
}

int study_mkdir(const char *dir, char *err, size_t err_len) {
  if (mkdir(dir, 0777) && errno != EEXIST) {
    snprintf(err, err_len, "%s: cannot create: %s", dir, strerror(errno));
    return 1;
  }
  struct stat sb;
  if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) {
    snprintf(err, err_len, "%s: not a directory", dir);
    return 1;
  }
  return 0;
}

/* The files study_open has open: each is a base/file.h temporary that
 * study_close renames into place only when every write succeeded. */
#define STUDY_MAX_OPEN 8
static struct cedar_out open_outs[STUDY_MAX_OPEN];

FILE *study_open(const char *dir, const char *name, char *err, size_t err_len) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  for (int i = 0; i < STUDY_MAX_OPEN; i++)
    if (!open_outs[i].f) return cedar_out_open(&open_outs[i], path, err, err_len) ? NULL : open_outs[i].f;
  CEDAR_ASSERT_MSG(0, "study_open: more than %d files open", STUDY_MAX_OPEN);
  return NULL;
}

int study_close(FILE *f, char *err, size_t err_len) {
  for (int i = 0; i < STUDY_MAX_OPEN; i++)
    if (f && open_outs[i].f == f) return cedar_out_commit(&open_outs[i], err, err_len) ? 1 : 0;
  CEDAR_ASSERT_MSG(0, "study_close: not a file study_open opened");
  return 1;
}

int study_parse_list(const char *s, int64_t *out, int max) {
  int n = 0;
  char buf[32];
  while (*s) {
    size_t len = strcspn(s, ",");
    if (len == 0 || len >= sizeof buf || n == max) return -1;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || v < 1) return -1;
    out[n++] = v;
    s += len;
    if (*s == ',') s++;
  }
  return n;
}


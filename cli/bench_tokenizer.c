/* bench_tokenizer.c: `cedar bench tokenizer`, the tokenizer's encode speed on
 * one core, and the JS implementation's (@lenml/tokenizers under node) on the
 * same text in the same run.
 *
 *   cedar bench tokenizer [--tokenizer PATH] [--file F] [--mb N] [--no-js] [--json]
 *
 * The text: F, or the built-in corpus (the files of tests/tokenizer/corpus, and the
 * Chinese seed article, ../shared/seed, when present), repeated to N MB
 * (default 4). cedar encodes it on this thread: MB/s over the thread's CPU
 * time (the busy machine's other processes do not count) and over wall
 * time, best of 3 runs after a warm-up. node encodes the same bytes with
 * tests/tokenizer/js_encode.cjs --bench (wall time inside node, after its
 * own warm-up). Both must give the same number of ids, or the run says so.
 */
#include <cJSON.h>
#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "cli/cli.h"
#include "runtime/text/tokenizer.h"

#define JS_SCRIPT "tests/tokenizer/js_encode.cjs"

static double now(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Append every regular file of dir (sorted by name) to *buf. */
static void add_dir(const char *dir, const char *suffix, char **buf, size_t *len) {
  struct dirent **ents;
  int n = scandir(dir, &ents, NULL, alphasort);
  for (int i = 0; i < n; i++) {
    const char *nm = ents[i]->d_name;
    size_t l = strlen(nm), ls = suffix ? strlen(suffix) : 0;
    if (nm[0] != '.' && (!suffix || (l > ls && !strcmp(nm + l - ls, suffix)))) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s", dir, nm);
      size_t fl;
      char *f = cli_read_all("bench tokenizer", path, &fl);
      if (f) {
        *buf = cedar_xrealloc(*buf, *len + fl + 1);
        memcpy(*buf + *len, f, fl), *len += fl;
        free(f);
      }
    }
    free(ents[i]);
  }
  if (n >= 0) free(ents);
}

static const char *src_path(const char *rel, char *buf, size_t n) {
  if (access(rel, R_OK) == 0) return rel;
  snprintf(buf, n, "%s/%s", CEDAR_SOURCE_DIR, rel);
  return buf;
}

static void usage(FILE *f) {
  fprintf(f, "usage: cedar bench tokenizer [--tokenizer PATH] [--file F] [--mb N] [--no-js] [--json]\n"
             "\n"
             "Encode speed of cedar's tokenizer on one core, and of the JS implementation\n"
             "(@lenml/tokenizers under node) on the same text in the same run.\n"
             "The text is F, or the test corpus (English, code, numbers, whitespace, emoji, invalid\n"
             "UTF-8) with the Chinese seed article, repeated to N MB (default 4). cedar: best of 3\n"
             "after a warm-up, MB/s over this thread's CPU time and over wall time; node: wall time\n"
             "after its warm-up. Needs node and the npm cache for the JS side (else it says so).\n"
             "\n"
             "options:\n"
             "  --tokenizer PATH  a tokenizer.json (default: the npm cache this build found)\n"
             "  --file F          the text to encode\n"
             "  --mb N            repeat the text to about N MB (1-256, default 4)\n"
             "  --no-js           skip the JS side\n"
             "  --json            one JSON object\n"
             "  -h, --help        show this help\n");
}

/* The JS side: MB/s, or a negative number with *why set. */
static double run_js(const char *file, size_t bytes, size_t want_ids, char *why, size_t wl) {
  const char *tj = tok_default_path();
  const char *nm = tj ? strstr(tj, "/node_modules/") : NULL;
  if (!nm) return snprintf(why, wl, "no npm cache found by this build"), -1;
  char sbuf[4096], cmd[8192];
  const char *script = src_path(JS_SCRIPT, sbuf, sizeof sbuf);
  snprintf(cmd, sizeof cmd, "NODE_PATH='%.*s/node_modules' node '%s' --bench 1 '%s' 2>&1", (int)(nm - tj), tj, script,
           file);
  FILE *p = popen(cmd, "r");
  if (!p) return snprintf(why, wl, "cannot start node"), -1;
  char line[4096] = "";
  size_t got = fread(line, 1, sizeof line - 1, p);
  line[got] = 0;
  int rc = pclose(p);
  cJSON *j = cJSON_Parse(line);
  const cJSON *s = j ? cJSON_GetObjectItem(j, "seconds") : NULL, *ids = j ? cJSON_GetObjectItem(j, "ids") : NULL;
  double mbs = -1;
  if (rc != 0 || !cJSON_IsNumber(s) || !cJSON_IsNumber(ids))
    snprintf(why, wl, "node failed (exit %d): %.200s", rc, line);
  else if ((size_t)ids->valuedouble != want_ids)
    snprintf(why, wl, "node gave %.0f ids, cedar %zu: not the same encoding", ids->valuedouble, want_ids);
  else
    mbs = (double)bytes / 1e6 / s->valuedouble;
  cJSON_Delete(j);
  return mbs;
}

int cmd_bench_tokenizer(int argc, char **argv) {
  static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'}, {"file", required_argument, 0, 'f'},
                                       {"mb", required_argument, 0, 'm'},        {"no-js", no_argument, 0, 'n'},
                                       {"json", no_argument, 0, 'j'},            {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  const char *tpath = NULL, *file = NULL;
  int64_t mb = 4;
  int no_js = 0, json = 0;
  optind = 1, opterr = 0;
  for (int c; (c = getopt_long(argc, argv, "+h", opts, NULL)) != -1;) {
    switch (c) {
      case 't': tpath = optarg; break;
      case 'f': file = optarg; break;
      case 'm':
        if (!cli_parse_int(optarg, 1, 256, &mb)) return cli_usage_error("bench tokenizer", "--mb: 1 to 256");
        break;
      case 'n': no_js = 1; break;
      case 'j': json = 1; break;
      case 'h': return usage(stdout), 0;
      case ':': return cli_usage_error("bench tokenizer", "%s needs a value", argv[optind - 1]);
      default: return cli_usage_error("bench tokenizer", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench tokenizer", "unexpected argument '%s'", argv[optind]);
  char *one = NULL, pbuf[4096];
  size_t one_len = 0;
  if (file) {
    if (!(one = cli_read_all("bench tokenizer", file, &one_len))) return 1;
  } else {
    add_dir(src_path("tests/tokenizer/corpus", pbuf, sizeof pbuf), NULL, &one, &one_len);
    add_dir(src_path("../shared/seed", pbuf, sizeof pbuf), ".txt", &one, &one_len);
  }
  if (!one_len) return free(one), fprintf(stderr, "cedar bench tokenizer: no text to encode\n"), 1;
  size_t reps = ((size_t)mb * 1000000 + one_len - 1) / one_len, len = reps * one_len;
  char *text = cedar_xmalloc(len);
  for (size_t r = 0; r < reps; r++) memcpy(text + r * one_len, one, one_len);
  free(one);
  struct tokenizer *t = cli_open_tokenizer("bench tokenizer", tpath);
  if (!t) return free(text), 1;
  int32_t *ids = NULL;
  size_t n = 0, cap = 0;
  double best_cpu = 1e30, best_wall = 1e30;
  int rc = tok_encode(t, text, len, &ids, &n, &cap); /* warm-up */
  for (int k = 0; k < 3 && !rc; k++) {
    n = 0;
    double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
    rc = tok_encode(t, text, len, &ids, &n, &cap);
    double c1 = now(CLOCK_THREAD_CPUTIME_ID), w1 = now(CLOCK_MONOTONIC);
    if (c1 - c0 < best_cpu) best_cpu = c1 - c0;
    if (w1 - w0 < best_wall) best_wall = w1 - w0;
  }
  tok_free(t);
  free(ids);
  if (rc) return free(text), fprintf(stderr, "cedar bench tokenizer: out of memory\n"), 1;
  double cpu = (double)len / 1e6 / best_cpu, wall = (double)len / 1e6 / best_wall, js = -1;
  char why[512] = "--no-js";
  if (!no_js) {
    char tmp[] = "/tmp/cedar_bench_tok_XXXXXX";
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (f && fwrite(text, 1, len, f) == len && !fclose(f)) js = run_js(tmp, len, n, why, sizeof why);
    else snprintf(why, sizeof why, "cannot write %s", tmp);
    if (fd >= 0) remove(tmp);
  }
  free(text);
  if (json) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bytes", (double)len);
    cJSON_AddNumberToObject(o, "ids", (double)n);
    cJSON_AddNumberToObject(o, "cedar_mb_s_cpu", cpu);
    cJSON_AddNumberToObject(o, "cedar_mb_s_wall", wall);
    if (js > 0) {
      cJSON_AddNumberToObject(o, "js_mb_s_wall", js);
      cJSON_AddNumberToObject(o, "ratio_wall", wall / js);
    } else {
      cJSON_AddStringToObject(o, "js_skipped", why);
    }
    cli_print_json(o);
  } else {
    printf("tokenizer encode: %.2f MB (%zu ids), one core\n", (double)len / 1e6, n);
    printf("  cedar  %8.2f MB/s (thread CPU time)  %8.2f MB/s (wall)\n", cpu, wall);
    if (js > 0) printf("  js     %8s                        %8.2f MB/s (wall)   cedar/js %.1fx (wall)\n", "", js, wall / js);
    else printf("  js     skipped: %s\n", why);
  }
  return 0;
}

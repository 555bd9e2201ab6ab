/* test_quote.c: strings as gnuplot and YAML literals (base/quote.h; issue 28
 * rows 1 and 8).
 *
 *  - the hostile names (a gnuplot command smuggled in quotes, `Bob's
 *    schedule`, newlines, backslashes, double quotes, `: `, a YAML
 *    document marker, backquotes and @ macros) give the exact expected
 *    gnuplot literal, and the buffer form equals the FILE form and reports
 *    the length it needs when cut;
 *  - every name read back by libyaml's parser from `key: <quoted>` is one
 *    scalar equal to the name, byte for byte;
 *  - with gnuplot installed, `print <quoted>` prints the name (control bytes
 *    as spaces) and runs nothing: no PWNED file appears.
 * Run from the repository root: ctest --test-dir build -R quote.
 */
#define _GNU_SOURCE /* open_memstream, mkdtemp */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "base/quote.h"
#include "tests/harness.h"

static const char *const hostile[] = {
    "x'; system 'touch PWNED'; print '",
    "Bob's schedule",
    "two\nlines\n- injected: key",
    "back\\slash\\n and \\'",
    "say \"hi\" \"",
    "trial: window sweep",
    "--- \n...\n# not a comment",
    "`touch PWNED` @macro $HOME",
    "tab\there\rCR\x01\x7f",
    "",
    "plain-name_1.0",
    "caf\xc3\xa9 \xe2\x80\x94 utf-8",
};
#define N_HOSTILE (sizeof hostile / sizeof hostile[0])

static char *via_file(void (*fn)(FILE *, const char *), const char *s) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  fn(m, s);
  fclose(m);
  return text;
}

static void exact(void) {
  static const char *const want[][2] = {
      {"x'; system 'touch PWNED'; print '", "'x''; system ''touch PWNED''; print '''"},
      {"Bob's schedule", "'Bob''s schedule'"},
      {"a\nb\\c", "'a b\\c'"},
      {"", "''"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *got = via_file(cedar_quote_gnuplot, want[i][0]);
    EXPECT(!strcmp(got, want[i][1]), "gnuplot(%s) = %s, want %s", want[i][0], got, want[i][1]);
    free(got);
  }
  char *y = via_file(cedar_quote_yaml, "a\"b\\c\nd\x01");
  EXPECT(!strcmp(y, "\"a\\\"b\\\\c\\nd\\x01\""), "yaml = %s", y);
  free(y);
  for (size_t i = 0; i < N_HOSTILE; i++) { /* the buffer form is the FILE form; a cut one says how long it is */
    char buf[256], small[8];
    char *g = via_file(cedar_quote_gnuplot, hostile[i]), *q = via_file(cedar_quote_yaml, hostile[i]);
    EXPECT_EQ(cedar_quote_gnuplot_buf(buf, sizeof buf, hostile[i]), strlen(g), "gnuplot length, name %zu", i);
    EXPECT(!strcmp(buf, g), "gnuplot buffer %s, file %s", buf, g);
    EXPECT_EQ(cedar_quote_yaml_buf(buf, sizeof buf, hostile[i]), strlen(q), "yaml length, name %zu", i);
    EXPECT(!strcmp(buf, q), "yaml buffer %s, file %s", buf, q);
    EXPECT_EQ(cedar_quote_yaml_buf(small, sizeof small, hostile[i]), strlen(q), "cut yaml length, name %zu", i);
    EXPECT(strlen(small) == (strlen(q) < sizeof small ? strlen(q) : sizeof small - 1), "cut yaml %s", small);
    free(g);
    free(q);
  }
}

/* `key: <quoted>` must parse as one mapping of one key to exactly s. */
static void yaml_round_trip(const char *s) {
  char *q = via_file(cedar_quote_yaml, s), *doc = NULL;
  EXPECT(asprintf(&doc, "key: %s\n", q) > 0, "asprintf");
  yaml_parser_t p;
  yaml_parser_initialize(&p);
  yaml_parser_set_input_string(&p, (const unsigned char *)doc, strlen(doc));
  int scalars = 0;
  bool value_ok = false, done = false;
  while (!done) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&p, &ev)) {
      EXPECT(0, "libyaml refused %s: %s", doc, p.problem ? p.problem : "?");
      break;
    }
    if (ev.type == YAML_SCALAR_EVENT && ++scalars == 2)
      value_ok = ev.data.scalar.length == strlen(s) && !memcmp(ev.data.scalar.value, s, strlen(s));
    done = ev.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
  }
  EXPECT(scalars == 2 && value_ok, "%s: %d scalars, value %s", doc, scalars, value_ok ? "equal" : "differs");
  yaml_parser_delete(&p);
  free(doc);
  free(q);
}

/* gnuplot's `print` of each literal, in a scratch directory: the names come
 * back (control bytes as spaces) and no command ran. */
static void gnuplot_round_trip(void) {
  if (system("command -v gnuplot > /dev/null 2>&1")) {
    printf("quote: gnuplot is not installed; its round trip is not checked\n");
    return;
  }
  char dir[] = "/tmp/cedar-quote-XXXXXX", path[64], line[512];
  EXPECT(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(path, sizeof path, "%s/t.gp", dir);
  FILE *f = fopen(path, "w");
  for (size_t i = 0; i < N_HOSTILE; i++) {
    fputs("print ", f);
    cedar_quote_gnuplot(f, hostile[i]);
    fputc('\n', f);
  }
  fclose(f);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "cd %s && gnuplot t.gp 2>&1", dir);
  FILE *out = popen(cmd, "r");
  for (size_t i = 0; i < N_HOSTILE; i++) {
    char want[256];
    snprintf(want, sizeof want, "%s", hostile[i]);
    for (char *c = want; *c; c++)
      if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    if (!fgets(line, sizeof line, out)) line[0] = 0;
    line[strcspn(line, "\n")] = 0;
    EXPECT(!strcmp(line, want), "gnuplot printed '%s', want '%s'", line, want);
  }
  EXPECT(pclose(out) == 0, "gnuplot failed on the quoted names");
  snprintf(path, sizeof path, "%s/PWNED", dir);
  EXPECT(access(path, F_OK) != 0, "gnuplot ran the smuggled command");
  unlink(path);
  snprintf(path, sizeof path, "%s/t.gp", dir);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  exact();
  for (size_t i = 0; i < N_HOSTILE; i++) yaml_round_trip(hostile[i]);
  gnuplot_round_trip();
  return h_report("quote");
}

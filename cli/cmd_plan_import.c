/* cmd_plan_import.c: `cedar plan import CONFIG.json [-o plan.yaml]` (the
 * plan a released checkpoint's config.json implies) and `cedar plan config
 * [P] [-o config.json]` (the config.json a plan implies: the inverse, used
 * by `weights init --layout released` and the round-trip test). The rules
 * are runtime/load/ckpt_config.h's. Tested by tests/cli/checkpoint.sh.
 */
#include <cJSON.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>

#include "base/file.h"
#include "cli/cli.h"
#include "runtime/load/ckpt_config.h"

static const char import_usage[] =
    "usage: cedar plan import CONFIG.json [-o plan.yaml] [--name NAME] [--json]\n"
    "Write the execution plan a released checkpoint's config.json implies: layers, modes and\n"
    "ownership from compress_ratios, kv_source_layer_ids, index_source_layer_ids and\n"
    "candidate_source_layer_id, every width, and the vendor's semantics (docs/checkpoints.md).\n"
    "The plan is loaded and validated before it is written. Without -o it goes to stdout.\n"
    "Copy it and change serving or cache formats in a plan that `extends` it.\n"
    "--json prints {\"config\", \"name\", \"layers\", \"out\"} and, without -o, \"yaml\": the plan's text.\n";
static const char config_usage[] =
    "usage: cedar plan config [P] [-o config.json] [--json]\n"
    "Write the config.json (released layout, text_config in the official spellings) that plan P\n"
    "(default %s) implies. `cedar plan import` of it gives back P's layers and widths.\n"
    "--json prints {\"plan\", \"path\", \"out\"} and, without -o, \"config\": the config as an object.\n";

/* text to out, or to stdout when out is NULL (and no JSON is printed) */
static int write_out(const char *cmd, const char *out, const char *text) {
  size_t n = strlen(text);
  bool nl = n && text[n - 1] != '\n';
  if (!out) {
    fputs(text, stdout);
    if (nl) fputc('\n', stdout);
    return 0; /* stdout's write errors: main (cedar_stdout_close) */
  }
  struct cedar_out o; /* base/file.h: a temporary renamed into place only when whole */
  char err[1024];
  int rc = cedar_out_open(&o, out, err, sizeof err);
  if (!rc) {
    cedar_out_write(&o, text, n);
    if (nl) cedar_out_write(&o, "\n", 1);
    rc = cedar_out_commit(&o, err, sizeof err);
  }
  if (rc) fprintf(stderr, "cedar plan %s: %s\n", cmd, err);
  return rc ? 1 : 0;
}

static int parse(int argc, char **argv, const char *cmd, const char *usage, const char **out, const char **name,
                 bool *json) {
  static const struct option opts[] = {{"output", required_argument, NULL, 'o'}, {"name", required_argument, NULL, 'n'},
                                       {"json", no_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'}, {0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
    switch (c) {
      case 'o': *out = optarg; break;
      case 'j': *json = true; break;
      case 'n':
        if (!name) return cli_usage_error(cmd, "--name is an option of `plan import` only");
        *name = optarg;
        break;
      case 'h': printf(usage, CEDAR_DEFAULT_PLAN); return 0;
      default: return cli_usage_error(cmd, "bad option, or an option without its value: '%s'", argv[optind - 1]);
    }
  }
  return -1;
}

int cmd_plan_import(int argc, char **argv) {
  const char *out = NULL, *name = "imported";
  bool json = false;
  int rc = parse(argc, argv, "plan import", import_usage, &out, &name, &json);
  if (rc >= 0) return rc;
  if (argc - optind != 1) return cli_usage_error("plan import", "name one config.json");
  char err[1024], *yaml = NULL;
  struct ckpt_config c;
  struct plan p;
  rc = ckpt_config_read(argv[optind], &c, err, sizeof err);
  if (!rc) rc = ckpt_config_plan(&c, name, &p, err, sizeof err);
  int n_layers = rc ? 0 : p.n_layers;
  if (!rc) plan_free(&p);
  if (!rc) rc = ckpt_config_plan_yaml(&c, name, &yaml, err, sizeof err);
  if (rc) {
    fprintf(stderr, "cedar plan import: %s\n", err);
    return 1;
  }
  rc = json && !out ? 0 : write_out("import", out, yaml);
  if (!rc && json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "config", argv[optind]);
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddNumberToObject(j, "layers", n_layers);
    if (out) cJSON_AddStringToObject(j, "out", out);
    else cJSON_AddNullToObject(j, "out"), cJSON_AddStringToObject(j, "yaml", yaml);
    cli_print_json(j);
  }
  free(yaml);
  return rc;
}

int cmd_plan_config(int argc, char **argv) {
  const char *out = NULL;
  bool as_json = false;
  int rc = parse(argc, argv, "plan config", config_usage, &out, NULL, &as_json);
  if (rc >= 0) return rc;
  if (argc - optind > 1) return cli_usage_error("plan config", "name at most one plan");
  struct plan p;
  if (cli_load_plan("plan config", optind < argc ? argv[optind] : NULL, &p)) return 1;
  char err[1024], *json = NULL;
  struct ckpt_config c;
  rc = ckpt_config_from_plan(&p, &c, err, sizeof err);
  cJSON *j = as_json ? cJSON_CreateObject() : NULL;
  if (j) cJSON_AddStringToObject(j, "plan", p.name), cJSON_AddStringToObject(j, "path", p.path ? p.path : "");
  plan_free(&p);
  if (!rc) rc = ckpt_config_json(&c, &json);
  if (rc) {
    fprintf(stderr, "cedar plan config: %s\n", err);
    cJSON_Delete(j);
    return 1;
  }
  rc = j && !out ? 0 : write_out("config", out, json);
  if (j && !rc) {
    if (out) cJSON_AddStringToObject(j, "out", out);
    else cJSON_AddNullToObject(j, "out"), cJSON_AddItemToObject(j, "config", cJSON_Parse(json));
    cli_print_json(j);
  } else {
    cJSON_Delete(j);
  }
  free(json);
  return rc;
}

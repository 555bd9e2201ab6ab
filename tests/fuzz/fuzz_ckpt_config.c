/* fuzz_ckpt_config.c: libFuzzer target for a checkpoint's config.json
 * (ckpt_config_parse) and the plan it implies (ckpt_config_plan: the YAML,
 * then the plan loader). Build with -DCEDAR_FUZZ=ON (clang). Any input must
 * give a plan or fail with a message, never crash, hang or leak; the config
 * that plan writes (ckpt_config_from_plan, when the plan is expressible)
 * must parse again and give plan YAML.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/load/ckpt_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[1024];
  struct ckpt_config c, c2;
  struct plan p;
  if (ckpt_config_parse("fuzz.json", (const char *)data, size, &c, err, sizeof err)) return 0;
  if (ckpt_config_plan(&c, "fuzz", &p, err, sizeof err)) return 0;
  char *json = NULL, *y1 = NULL, *y2 = NULL;
  if (!ckpt_config_from_plan(&p, &c2, err, sizeof err)) {
    if (ckpt_config_json(&c2, &json) || ckpt_config_parse("again", json, strlen(json), &c2, err, sizeof err)) abort();
    if (ckpt_config_plan_yaml(&c, "fuzz", &y1, err, sizeof err) || ckpt_config_plan_yaml(&c2, "fuzz", &y2, err, sizeof err))
      abort();
  }
  free(json), free(y1), free(y2);
  plan_free(&p);
  return 0;
}

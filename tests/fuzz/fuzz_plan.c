/* fuzz_plan.c: libFuzzer target for the plan loader (all three passes).
 * Build with -DCEDAR_FUZZ=ON (clang); run `make fuzz` for a bounded run with
 * the shipped plans as the seed corpus. Any input must load or fail with a
 * diagnostic, never crash, hang or leak. `extends` resolves relative to
 * plans/ (the name given below), so the corpus can reach the real plans. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "scheduler/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct plan p;
  struct plan_diags d = {0};
  int rc = plan_load_string("plans/fuzz.yaml", (const char *)data, size, &p, &d);
  if (rc == 0) plan_free(&p);
  else if (d.n == 0) abort(); /* a failed load must say why */
  plan_diags_free(&d);
  return 0;
}

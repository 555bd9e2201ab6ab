/* weights_resident.c: the resident-weights line (weights_resident.h). */
#include "cli/weights_resident.h"

#include "runtime/dist/place_cost.h"

void cli_weights_resident_line(FILE *f, const struct plan *p, const struct weights *w) {
  struct weights_resident r;
  weights_resident(w, &r);
  static struct rt_place_cost pc; /* large (64 ranks); one command prints one line at a time */
  int64_t stored = rt_place_cost(p, 0, 0, &pc) ? -1 : pc.total_weights;
  weights_resident_print(f, &r, stored);
}

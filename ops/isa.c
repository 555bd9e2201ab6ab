/* isa.c: which vector ISA the cloned kernels use (see isa.h).
 * Test: tests/test_ops_isa.c (every user at every level, bitwise). */
#include "ops/isa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[OP_ISA_COUNT] = {"default", "avx2", "avx512"};

/* -1 until the first op_isa(); written once, then only read. A race between
 * two first callers writes the same value. */
static volatile int chosen = -1;

bool op_isa_supported(enum op_isa isa) {
#if OP_ISA_CLONES
  __builtin_cpu_init();
  switch (isa) {
    case OP_ISA_DEFAULT: return true;
    case OP_ISA_AVX2: return __builtin_cpu_supports("avx2");
    case OP_ISA_AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx2");
    default: return false;
  }
#else
  return isa == OP_ISA_DEFAULT;
#endif
}

const char *op_isa_name(enum op_isa isa) { return isa >= 0 && isa < OP_ISA_COUNT ? names[isa] : "?"; }

static enum op_isa best(void) {
  for (int i = OP_ISA_COUNT - 1; i > 0; i--)
    if (op_isa_supported((enum op_isa)i)) return (enum op_isa)i;
  return OP_ISA_DEFAULT;
}

static enum op_isa from_env(void) {
  const char *e = getenv("CEDAR_ISA");
  if (!e || !*e) return best();
  for (int i = 0; i < OP_ISA_COUNT; i++) {
    if (strcmp(e, names[i]) != 0) continue;
    if (op_isa_supported((enum op_isa)i)) return (enum op_isa)i;
    fprintf(stderr, "cedar: warning: CEDAR_ISA=%s is not supported by this CPU; using %s\n", e, names[best()]);
    return best();
  }
  fprintf(stderr, "cedar: warning: CEDAR_ISA=%s is not one of default, avx2, avx512; using %s\n", e, names[best()]);
  return best();
}

enum op_isa op_isa(void) {
  int c = chosen;
  if (c < 0) chosen = c = (int)from_env();
  return (enum op_isa)c;
}

bool op_isa_force(enum op_isa isa) {
  if (isa < 0 || isa >= OP_ISA_COUNT || !op_isa_supported(isa)) return false;
  chosen = (int)isa;
  return true;
}

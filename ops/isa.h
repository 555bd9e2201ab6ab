/* isa.h: one kernel body compiled for several x86 vector ISAs, chosen once.
 *
 * What it is: the build is for baseline x86-64 (SSE2), so the compiler
 * vectorizes the ops' lane loops 4 wide. A hot kernel can be compiled again
 * for AVX2 and AVX-512F with OP_ISA_KERNEL and called at the level that
 * op_isa() picks once from the CPU (or from CEDAR_ISA=default|avx2|avx512 in
 * the environment, for tests and comparisons). Users: ops/attention.c
 * (online_flush), ops/indexer.c (score_tile), ops/formats.c (the packers),
 * ops/mhc.c (mix, update, sum of squares, coefficients with Sinkhorn, the
 * fused pass).
 *
 * Why the results are the same bits on every level: the kernels' loops run
 * over independent lanes, in the order the C says; the build is ISO C11
 * (no FMA contraction: CMakeLists.txt also passes -ffp-contract=off) and never
 * -ffast-math, so a wider vector does the same roundings in the same order.
 * tests/test_ops_isa.c runs every user at every level this CPU has and
 * compares bitwise; tests/test_formats_*.c checks the packers' bytes at each.
 *
 * What it is not: hand-written intrinsics, or a way to change numerics.
 */
#ifndef CEDAR_OPS_ISA_H
#define CEDAR_OPS_ISA_H

#include <stdbool.h>

enum op_isa { OP_ISA_DEFAULT, OP_ISA_AVX2, OP_ISA_AVX512, OP_ISA_COUNT };

/* The level kernels use: the best this CPU supports, or CEDAR_ISA when it
 * names one the CPU supports (else a warning on stderr and the best). */
enum op_isa op_isa(void);
/* Whether this CPU can run level `isa`. */
bool op_isa_supported(enum op_isa isa);
/* Force a level (tests); returns false, changing nothing, when unsupported. */
bool op_isa_force(enum op_isa isa);
const char *op_isa_name(enum op_isa isa);

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(CEDAR_NO_ISA_CLONES)
#define OP_ISA_CLONES 1
/* OP_ISA_KERNEL(name, params, args): defines `static void name(params)`
 * that calls name##_body(args) compiled for the level op_isa() chose.
 * name##_body, and every helper it calls in its loops, must be
 * `static inline OP_ISA_BODY`, so that each level gets its own copy. */
#define OP_ISA_BODY __attribute__((always_inline))
#define OP_ISA_KERNEL(name, params, args)                                                           \
  __attribute__((target("avx512f,avx512vl,avx2"))) static void name##_avx512 params { name##_body args; } \
  __attribute__((target("avx2"))) static void name##_avx2 params { name##_body args; }              \
  static void name##_default params { name##_body args; }                                           \
  static void name params {                                                                         \
    switch (op_isa()) {                                                                             \
      case OP_ISA_AVX512: name##_avx512 args; break;                                                \
      case OP_ISA_AVX2: name##_avx2 args; break;                                                    \
      default: name##_default args; break;                                                          \
    }                                                                                               \
  }
#else
#define OP_ISA_CLONES 0
#define OP_ISA_BODY
#define OP_ISA_KERNEL(name, params, args) \
  static void name params { name##_body args; }
#endif

#endif /* CEDAR_OPS_ISA_H */

/* arena.h: a worker's context for running nodes: a scratch arena for one
 * node at a time, and the time spent per op family (for `where the time
 * goes`: the executor sums them into its stats). The executor resets it
 * before every node; a node's op group allocates its intermediates from it.
 * When a node needs more than the arena holds, extra blocks are taken and, at
 * the next reset, the arena grows to the high-water mark, so after the first
 * tiles of a run nothing is allocated per node. Pointers stay valid until the
 * next reset (blocks never move). Not thread-safe: one arena per worker.
 *
 * Out of memory: while on_oom is set (rt_run_node sets it around a node's
 * op group), a failed allocation records its size in oom_bytes and jumps
 * back there, and the node fails with CEDAR_ENOMEM; the op groups hold no
 * memory but the arena's between allocations, so nothing leaks (the next
 * reset frees the blocks taken). Without on_oom it aborts, as before.
 */
#ifndef CEDAR_RUNTIME_ARENA_H
#define CEDAR_RUNTIME_ARENA_H

#include <setjmp.h>
#include <stddef.h>
#include <time.h>

#define RT_ARENA_ALIGN 64

/* Op families the op groups time (runtime/model/model.c). */
#define RT_FAMILIES(X)                                      \
  X(MHC, "mhc")             /* coefficients, mix, update */ \
  X(QKV, "qkv")             /* query latent and heads, SWA entry */ \
  X(COMPRESS, "compress")   /* compressor, global entries */ \
  X(INDEXER, "indexer")     /* indexer query, scores, Top-K, pool, reindex */ \
  X(ATTENTION, "attention") /* sparse attention */ \
  X(OPROJ, "oproj")         /* grouped output projection */ \
  X(MOE, "moe")             /* router and experts */ \
  X(ENGRAM, "engram")       /* hash, gather, injection */ \
  X(HEAD, "head")           /* merge, norm, logits */ \
  X(OTHER, "other")         /* embed, norms, copies */

enum rt_family {
#define X(e, s) RT_FAM_##e,
  RT_FAMILIES(X)
#undef X
  RT_FAM_COUNT
};
const char *rt_family_name(enum rt_family f);

struct rt_arena {
  char *base;
  size_t cap, used;
  void **extra;     /* overflow blocks since the last reset */
  int n_extra;
  size_t extra_bytes;
  size_t peak;      /* largest total a node used */
  jmp_buf *on_oom;  /* where a failed allocation jumps (NULL: abort) */
  size_t oom_bytes; /* the size that failed, after such a jump */
  double fam_s[RT_FAM_COUNT]; /* seconds per op family since init */
  long long experts;          /* routed experts the MoE groups ran since init, distinct per call
                                 (whose weights a call streams: the bytes floor of a step, docs/serving.md) */
};

static inline double rt_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
/* Run stmt and add its time to family fam of arena ar. */
#define RT_TIMED(ar, fam, stmt)                  \
  do {                                           \
    double _rt_t0 = rt_clock();                  \
    stmt;                                        \
    (ar)->fam_s[RT_FAM_##fam] += rt_clock() - _rt_t0; \
  } while (0)

void rt_arena_init(struct rt_arena *a, size_t cap);
void rt_arena_free(struct rt_arena *a);
void rt_arena_reset(struct rt_arena *a);
/* bytes rounded up to RT_ARENA_ALIGN, aligned; never NULL: when memory
 * runs out it jumps to on_oom (or aborts without one). */
void *rt_arena_alloc(struct rt_arena *a, size_t bytes);
#define RT_ALLOC(ar, type, count) ((type *)rt_arena_alloc((ar), sizeof(type) * (size_t)(count)))

#endif

/* arena.h: a scratch arena for one node at a time. The executor resets it
 * before every node; a node's op group allocates its intermediates from it.
 * When a node needs more than the arena holds, extra blocks are taken and, at
 * the next reset, the arena grows to the high-water mark, so after the first
 * tiles of a run nothing is allocated per node. Pointers stay valid until the
 * next reset (blocks never move). Not thread-safe: one arena per worker.
 */
#ifndef CEDAR_RUNTIME_ARENA_H
#define CEDAR_RUNTIME_ARENA_H

#include <stddef.h>

#define RT_ARENA_ALIGN 64

struct rt_arena {
  char *base;
  size_t cap, used;
  void **extra;     /* overflow blocks since the last reset */
  int n_extra;
  size_t extra_bytes;
  size_t peak;      /* largest total a node used */
};

void rt_arena_init(struct rt_arena *a, size_t cap);
void rt_arena_free(struct rt_arena *a);
void rt_arena_reset(struct rt_arena *a);
/* bytes rounded up to RT_ARENA_ALIGN, aligned; never NULL (aborts when the
 * machine is out of memory: scratch is bounded by the tile size). */
void *rt_arena_alloc(struct rt_arena *a, size_t bytes);
#define RT_ALLOC(ar, type, count) ((type *)rt_arena_alloc((ar), sizeof(type) * (size_t)(count)))

#endif

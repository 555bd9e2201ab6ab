/* arena.c: see arena.h. */
#include "runtime/model/arena.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"

static const char *const family_names[] = {
#define X(e, s) s,
    RT_FAMILIES(X)
#undef X
};

const char *rt_family_name(enum rt_family f) { return f < RT_FAM_COUNT ? family_names[f] : "?"; }

void rt_arena_init(struct rt_arena *a, size_t cap) {
  memset(a, 0, sizeof(*a));
  cap = (cap + RT_ARENA_ALIGN - 1) / RT_ARENA_ALIGN * RT_ARENA_ALIGN;
  a->cap = cap;
  a->base = cap ? cedar_xaligned(RT_ARENA_ALIGN, cap) : NULL;
}

void rt_arena_reset(struct rt_arena *a) {
  size_t total = a->used + a->extra_bytes;
  if (total > a->peak) a->peak = total;
  for (int i = 0; i < a->n_extra; i++) free(a->extra[i]);
  free(a->extra);
  a->extra = NULL;
  a->n_extra = 0;
  if (a->extra_bytes) {
    free(a->base);
    a->cap = (a->peak + RT_ARENA_ALIGN - 1) / RT_ARENA_ALIGN * RT_ARENA_ALIGN;
    a->base = aligned_alloc(RT_ARENA_ALIGN, a->cap);
    if (!a->base) a->cap = 0; /* no room to grow: the next node takes blocks (or fails) as it goes */
  }
  a->extra_bytes = 0;
  a->used = 0;
}

void *rt_arena_alloc(struct rt_arena *a, size_t bytes) {
  bytes = (bytes + RT_ARENA_ALIGN - 1) / RT_ARENA_ALIGN * RT_ARENA_ALIGN;
  if (a->used + bytes <= a->cap) {
    void *p = a->base + a->used;
    a->used += bytes;
    return p;
  }
  void *p = aligned_alloc(RT_ARENA_ALIGN, bytes);
  void **ex = p ? realloc(a->extra, sizeof(void *) * (size_t)(a->n_extra + 1)) : NULL;
  if (!ex) {
    free(p);
    if (!a->on_oom) {
      fprintf(stderr, "cedar: out of memory allocating %zu bytes of scratch\n", bytes);
      abort();
    }
    a->oom_bytes = bytes;
    longjmp(*a->on_oom, 1);
  }
  a->extra = ex;
  a->extra[a->n_extra++] = p;
  a->extra_bytes += bytes;
  return p;
}

void rt_arena_free(struct rt_arena *a) {
  rt_arena_reset(a);
  free(a->base);
  a->base = NULL;
  a->cap = a->used = 0;
}

/* test_arena.c: a worker's scratch arena running out of memory (issue 18
 * row 4; runtime/model/arena.h, runtime/node/exec_node.c).
 *
 *  - with on_oom set, an allocation no machine holds (2^60 bytes) jumps back
 *    with oom_bytes recorded instead of aborting; the arena stays usable:
 *    the blocks taken before the failure are freed at the next reset, and
 *    later allocations succeed and are aligned;
 *  - an allocation that fits after a failed one in the same node still
 *    comes from the arena (nothing was half-recorded);
 *  - nested guards: the inner one catches, the outer is restored after.
 * Run from the repository root: ctest --test-dir build -R arena.
 */
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include "runtime/model/arena.h"
#include "tests/harness.h"

static const size_t HUGE_BYTES = (size_t)1 << 60;

/* Under AddressSanitizer an allocation that cannot be had aborts unless the
 * allocator may return NULL, which is what this test is about (read by the
 * ASan runtime at start; an unused function elsewhere). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Allocate small, small, then huge under a guard; returns 1 when the jump
 * came back, 0 when the huge allocation returned (it must not). */
static int fail_once(struct rt_arena *a, void **small) {
  jmp_buf jb;
  jmp_buf *volatile prev = a->on_oom;
  if (setjmp(jb)) {
    a->on_oom = prev;
    return 1;
  }
  a->on_oom = &jb;
  small[0] = rt_arena_alloc(a, 1000);
  small[1] = rt_arena_alloc(a, 5000); /* past the empty arena: an extra block */
  memset(small[1], 7, 5000);
  void *never = rt_arena_alloc(a, HUGE_BYTES);
  (void)never;
  a->on_oom = prev;
  return 0;
}

static void test_jump(void) {
  struct rt_arena a;
  rt_arena_init(&a, 0);
  void *small[2] = {0};
  EXPECT_EQ(fail_once(&a, small), 1, "a 2^60-byte allocation must jump back");
  EXPECT_EQ(a.oom_bytes, HUGE_BYTES, "oom_bytes");
  EXPECT(a.on_oom == NULL, "the guard is cleared after the jump");
  EXPECT(small[0] && small[1], "allocations before the failure were served");
  EXPECT_EQ(a.n_extra, 2, "the blocks taken before the failure are held until the reset");
  rt_arena_reset(&a);
  EXPECT_EQ(a.n_extra, 0, "reset frees the extra blocks");
  EXPECT(a.cap >= 6000, "the arena grew to what the node used (%zu)", a.cap);
  void *p = rt_arena_alloc(&a, 3000);
  EXPECT(p && (uintptr_t)p % RT_ARENA_ALIGN == 0, "aligned allocation after a failure");
  memset(p, 1, 3000);
  EXPECT_EQ(a.n_extra, 0, "it fits the grown arena");
  rt_arena_free(&a);
}

static void test_nested(void) {
  struct rt_arena a;
  rt_arena_init(&a, 4096);
  jmp_buf outer;
  volatile int outer_hit = 0;
  if (setjmp(outer)) {
    outer_hit = 1;
  } else {
    a.on_oom = &outer;
    void *small[2];
    EXPECT_EQ(fail_once(&a, small), 1, "the inner guard catches");
    EXPECT(a.on_oom == &outer, "the outer guard is restored");
    a.on_oom = NULL;
  }
  EXPECT_EQ(outer_hit, 0, "the outer guard was not taken");
  rt_arena_free(&a);
}

int main(void) {
  test_jump();
  test_nested();
  return h_report("arena");
}

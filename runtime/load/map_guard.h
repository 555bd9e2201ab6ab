/* runtime/load/map_guard.h: a file mapped for reading that shrinks under cedar (a shard
 * truncated in place during a run) makes the next read of a page past its
 * new end raise SIGBUS. The reads are everywhere (every kernel reads its
 * weights in place), so no sigsetjmp around them is possible, and checking
 * sizes before mapping cannot see a truncation that comes later. Instead
 * every mapping is registered here; a SIGBUS whose address falls inside one
 * prints "cedar: <path>: the file changed while cedar had it mapped (it is
 * now shorter ...)" and ends the process with exit status 1 (issue 28, low
 * row). A SIGBUS anywhere else is not ours: the default action runs.
 *
 * Not a recovery: the run stops, as it must (its weights are gone).
 * Test: tests/cli/paths.sh (a shard truncated mid-run).
 */
#ifndef CEDAR_RT_MAP_GUARD_H
#define CEDAR_RT_MAP_GUARD_H

#include <stddef.h>

/* Register / forget [base, base + len), mapped from path (copied, up to
 * 255 bytes). At most 1024 mappings at once; more are not guarded. */
void rt_map_guard_add(const void *base, size_t len, const char *path);
void rt_map_guard_remove(const void *base);

#endif

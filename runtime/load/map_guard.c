/* runtime/load/map_guard.c: SIGBUS on a registered file mapping names the file (map_guard.h). */
#define _GNU_SOURCE
#include "runtime/load/map_guard.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define GUARD_MAX 1024

/* A slot is claimed by a CAS on state (0 free, 1 being written, 2 in use);
 * the handler reads only slots in use. */
static struct guard {
  _Atomic int state;
  uintptr_t lo, hi;
  char path[256];
} guards[GUARD_MAX];

static atomic_flag installed = ATOMIC_FLAG_INIT;

static void put(const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w, n -= (size_t)w;
  }
}

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
  (void)ctx;
  uintptr_t a = (uintptr_t)si->si_addr;
  for (int i = 0; i < GUARD_MAX; i++) {
    if (atomic_load(&guards[i].state) != 2 || a < guards[i].lo || a >= guards[i].hi) continue;
    put("cedar: ");
    put(guards[i].path);
    put(": the file changed while cedar had it mapped (it is now shorter: truncated or rewritten in place), and a "
        "read past its new end failed (SIGBUS); the run stops. Replace weights by writing a new file and renaming "
        "it over the old one, never in place.\n");
    _exit(1);
  }
  signal(sig, SIG_DFL); /* not a mapping of ours: a real fault, reported as one */
  raise(sig);
}

void rt_map_guard_add(const void *base, size_t len, const char *path) {
  if (!base || !len) return;
  if (!atomic_flag_test_and_set(&installed)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
  }
  for (int i = 0; i < GUARD_MAX; i++) {
    int free_slot = 0;
    if (!atomic_compare_exchange_strong(&guards[i].state, &free_slot, 1)) continue;
    guards[i].lo = (uintptr_t)base, guards[i].hi = (uintptr_t)base + len;
    size_t n = strlen(path);
    if (n >= sizeof guards[i].path) n = sizeof guards[i].path - 1;
    memcpy(guards[i].path, path, n);
    guards[i].path[n] = '\0';
    atomic_store(&guards[i].state, 2);
    return;
  }
}

void rt_map_guard_remove(const void *base) {
  for (int i = 0; i < GUARD_MAX; i++)
    if (atomic_load(&guards[i].state) == 2 && guards[i].lo == (uintptr_t)base) {
      atomic_store(&guards[i].state, 0);
      return;
    }
}

#!/usr/bin/env bash
# memlimit.sh: cedar under an address-space limit (ulimit -v; issue 18 rows
# 3 and 4). Every command must end (each is bounded by `timeout` (150 s: these runs take seconds), so a hang
# fails this test rather than CI) with exit 0, or exit 1 and a message; never
# a signal. OpenBLAS retries a failed work-buffer mmap forever, so cedar
# reserves its buffers at start (op_blas_reserve) and refuses a limit too
# small for them; an allocation that fails later fails its request only.
#  1. `cedar version` under 150000 KiB: exit 1 naming the limit (it hung);
#  2. serve-sim, requests small, big (outputs no limit tried holds), small:
#     at the first limit that lets the small ones run, the big one fails with
#     "out of memory" and the small one after it still runs, on both
#     executors; every limit tried ends cleanly (some fail at the start,
#     naming the OpenBLAS buffers).
# Scratch memory running out inside a node (the arena) is tested by
# tests/test_arena.c; the 2000-token run of the issue was checked by hand.
# Usage: bash tests/cli/memlimit.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ldd "$cedar" 2>/dev/null | grep 'libasan\|libtsan' > /dev/null; then  # not grep -q: under pipefail an ldd killed by SIGPIPE makes the check false
  echo "memlimit: skipped (sanitizers reserve terabytes of address space)"; exit 77
fi

# run_limited KIB CMD...: exit status in $rc, stdout/stderr in $tmp/out, $tmp/err
run_limited() {
  local kib=$1; shift
  rc=0
  ( ulimit -v "$kib"; exec timeout 150 "$@" ) > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -ne 124 ] || fail "ulimit -v $kib: $* did not end within 150 s (a hang, or a machine far too loaded)"
  [ "$rc" -le 1 ] || { cat "$tmp/err" >&2; fail "ulimit -v $kib: $*: exit $rc (a signal or an abort)"; }
  if [ "$rc" -eq 1 ]; then grep -q "^cedar" "$tmp/err" || fail "ulimit -v $kib: $*: exit 1 without a message"; fi
  return 0
}

# Every limit below is on top of the address space the shared libraries map
# (their file sizes: a CUDA build links cuBLAS, whose libcublasLt alone maps
# ~520 MiB before main runs; without this the loader, not cedar, would fail).
libs_kib=$(ldd "$cedar" | awk '/=> \//{print $3}' | xargs stat -L -c %s | awk '{s += $1} END {print int(s / 1024)}')
echo "memlimit: the shared libraries map ${libs_kib} KiB; each limit adds that"

v=$((150000 + libs_kib))
run_limited $v "$cedar" version
[ "$rc" -eq 1 ] && grep -q "address-space limit (ulimit -v $v KiB)" "$tmp/err" || fail "version under $v KiB"

# serve-sim on the default plan: the big request asks for ~1M decode steps,
# whose outputs (2 GB of logits) no limit tried here holds; the first limit
# that lets the small requests run must fail the big one alone.
printf '%s\n' '{"id": "small1", "session": "a", "new_len": 20, "max_new": 2}' \
  '{"id": "big", "session": "b", "new_len": 20, "max_new": 1048000}' \
  '{"id": "small2", "session": "c", "new_len": 20, "max_new": 2}' > "$tmp/req.jsonl"
for ex in direct starpu; do
  found=
  for kib0 in 900000 1100000 1400000 1700000; do
    kib=$((kib0 + libs_kib))
    run_limited $kib "$cedar" serve-sim --requests "$tmp/req.jsonl" --executor $ex
    grep -q "^small1 " "$tmp/out" || continue
    [ "$rc" -eq 1 ] && grep -q "request big failed: .*out of memory" "$tmp/err" || { cat "$tmp/err" >&2; fail "serve-sim $ex under $kib KiB: the big request did not fail on memory"; }
    grep -q "^small2 " "$tmp/out" || { cat "$tmp/err" >&2; fail "serve-sim $ex under $kib KiB: small2 did not run after big failed"; }
    found=$kib; break
  done
  [ -n "$found" ] || fail "serve-sim $ex: no limit tried let the small requests run"
  echo "memlimit: serve-sim $ex under $found KiB: the big request failed, the others ran"
done
echo "memlimit: ok"

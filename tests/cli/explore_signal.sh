#!/usr/bin/env bash
# explore_signal.sh: `cedar explore --measure` stopped by SIGTERM or SIGINT
# while a variant's `cedar run` child runs (issue 28 row 17): the child is
# stopped too, the temporary variants directory ($TMPDIR/cedar-explore-*)
# is removed, and explore ends by the signal (exit 128 + N), within 30 s.
# Usage: bash tests/cli/explore_signal.sh path/to/cedar   (from the repo root)
set -uo pipefail
cedar=${1:?usage: explore_signal.sh /path/to/cedar}
cd "$(dirname "$0")/../.." || exit 1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for sig in TERM INT; do
  want=$((128 + $(kill -l $sig)))
  TMPDIR=$tmp "$cedar" explore plans/v41-mini.yaml --vary model.swa.window=64,128 --measure time \
    --measure-prompt 4096 --decode 200 > "$tmp/out" 2> "$tmp/err" &
  pid=$!
  child=
  for _ in $(seq 600); do # up to 60 s for the first variant's run to start
    child=$(pgrep -P "$pid" | head -1)
    [ -n "$child" ] && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  [ -n "$child" ] || { kill "$pid" 2> /dev/null; cat "$tmp/err" >&2; fail "SIG$sig: explore started no child"; }
  ls -d "$tmp"/cedar-explore-* > /dev/null 2>&1 || fail "SIG$sig: no temporary directory while measuring"
  sleep 0.3
  kill -s "$sig" "$pid"
  rc=0
  for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2> /dev/null; then kill -9 "$pid"; fail "SIG$sig: explore still running 30 s after the signal"; fi
  wait "$pid" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/err" >&2; fail "SIG$sig: exit $rc, want $want"; }
  for _ in $(seq 50); do kill -0 "$child" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$child" 2> /dev/null; then kill -9 "$child"; fail "SIG$sig: the child cedar run ($child) was left running"; fi
  left=$(ls -d "$tmp"/cedar-explore-* 2> /dev/null)
  [ -z "$left" ] || fail "SIG$sig: the temporary directory was left: $left"
  grep -q "interrupted by signal" "$tmp/err" || { cat "$tmp/err" >&2; fail "SIG$sig: no message"; }
done
echo "explore_signal: ok"

#!/usr/bin/env bash
# cuda_graphs.sh: `cedar run --cuda-graphs on|off` and `--cuda-scratch MIB`
# where nothing runs on CUDA.
#
#  - a bad value is a usage error (exit 2) naming on and off (a MiB count);
#  - either with a plan that runs on the CPU is refused (exit 1) with the
#    reason and the fix, and prints no report;
#  - --speculate with --device cuda is a usage error (its rollback reads
#    the tails' logs on the host);
#  - the help tells of it.
# On a machine whose build runs nodes on CUDA this test skips (77):
# tests/gpu/run.sh compares the two modes there.
# Run: bash tests/cli/cuda_graphs.sh build/cedar (from the repository root).
set -u
cedar=${1:?usage: cuda_graphs.sh /path/to/cedar}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

"$cedar" env --json >"$tmp/env.json" 2>/dev/null
if /usr/bin/python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cuda_kernels"]["runs_nodes"] else 1)' \
  "$tmp/env.json"; then
  echo "cuda_graphs.sh: this machine runs nodes on CUDA; tests/gpu/run.sh is the check here: skipped"
  exit 77
fi

"$cedar" run --plan plans/v41-mini.yaml --max-new 2 --cuda-graphs maybe >/dev/null 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] || fail "--cuda-graphs maybe: exit $rc, want 2"
grep -q -- "--cuda-graphs takes on or off (got 'maybe')" "$tmp/err" || fail "--cuda-graphs maybe: message"

for mode in on off; do
  "$cedar" run --plan plans/v41-mini.yaml --max-new 2 --cuda-graphs $mode >"$tmp/out" 2>"$tmp/err"; rc=$?
  [ "$rc" -eq 1 ] || fail "--cuda-graphs $mode on a CPU plan: exit $rc, want 1"
  grep -q "cuda-graphs applies to a CUDA home, and plan v41-mini runs on the CPU: add --device cuda" "$tmp/err" ||
    { fail "--cuda-graphs $mode on a CPU plan: no reason:"; sed 's/^/  | /' "$tmp/err" >&2; }
  [ -s "$tmp/out" ] && fail "--cuda-graphs $mode: printed a report although refused"
done

for bad in 0 12x -3; do
  "$cedar" run --plan plans/v41-mini.yaml --max-new 2 --cuda-scratch "$bad" >/dev/null 2>"$tmp/err"; rc=$?
  [ "$rc" -eq 2 ] || fail "--cuda-scratch $bad: exit $rc, want 2"
  grep -q -- "--cuda-scratch takes MiB, 1 to 1048576 (got '$bad')" "$tmp/err" || fail "--cuda-scratch $bad: message"
done
"$cedar" run --plan plans/v41-mini.yaml --max-new 2 --cuda-scratch 64 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 1 ] || fail "--cuda-scratch on a CPU plan: exit $rc, want 1"
grep -q "cuda-scratch applies to a CUDA home, and plan v41-mini runs on the CPU: add --device cuda" "$tmp/err" ||
  { fail "--cuda-scratch on a CPU plan: no reason:"; sed 's/^/  | /' "$tmp/err" >&2; }
[ -s "$tmp/out" ] && fail "--cuda-scratch: printed a report although refused"

"$cedar" run --plan plans/v41-mini.yaml --tokens 1,2 --speculate mtp --device cuda >/dev/null 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] || fail "--speculate --device cuda: exit $rc, want 2"
grep -q -- "--speculate runs on the CPU" "$tmp/err" || fail "--speculate --device cuda: message"

"$cedar" run --help | grep -q -- "--cuda-graphs on|off" || fail "--help does not tell of --cuda-graphs"
"$cedar" run --help | grep -q -- "--cuda-scratch MIB" || fail "--help does not tell of --cuda-scratch"

if [ "$fails" -ne 0 ]; then
  echo "cuda_graphs.sh: $fails failure(s)" >&2
  exit 1
fi
echo "cuda_graphs.sh: ok"

#!/usr/bin/env bash
# device.sh: `cedar run --device` and the GPU device check without a GPU.
#
#  - `--device cuda` on a machine without a GPU, or a build without CUDA op
#    groups, is refused before anything loads: exit 1, no signal, a message
#    that says which (no CUDA device / no CUDA entry for op groups ...);
#  - `--device bogus` is a usage error (exit 2); `--device cpu` runs;
#  - tests/gpu/run.sh exits 77 here and says why, writing a results JSON
#    whose status is "skipped".
# Where a GPU is present and the build can run nodes on it this test skips
# (77): tests/gpu/run.sh is the check there.
# Run: bash tests/cli/device.sh build/cedar (from the repository root).
set -u
cedar=${1:?usage: device.sh /path/to/cedar}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

"$cedar" env --json >"$tmp/env.json" 2>/dev/null
if /usr/bin/python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["cuda_kernels"]["runs_nodes"] else 1)' \
  "$tmp/env.json"; then
  echo "device.sh: this machine runs nodes on CUDA; tests/gpu/run.sh is the check here: skipped"
  exit 77
fi

"$cedar" run --plan plans/v41-mini.yaml --max-new 2 --device cuda >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 1 ] || fail "--device cuda: exit $rc, want 1"
grep -Eq 'cedar run: --device cuda: (no CUDA device: .+|this build has no CUDA entry for [0-9]+ of cedar.s op groups \(.+\)); run with --device cpu' \
  "$tmp/err" || { fail "--device cuda: no reason in the message:"; sed 's/^/  | /' "$tmp/err" >&2; }
[ -s "$tmp/out" ] && fail "--device cuda: printed a report although refused"

"$cedar" run --plan plans/v41-mini.yaml --max-new 2 --device bogus >/dev/null 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] || fail "--device bogus: exit $rc, want 2"
grep -q -- "--device takes cpu or cuda" "$tmp/err" || fail "--device bogus: message"

"$cedar" run --plan plans/v41-mini.yaml --prompt-len 8 --max-new 2 --device cpu --json >"$tmp/cpu.json" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 0 ] || { fail "--device cpu: exit $rc"; cat "$tmp/err" >&2; }

OUT=$tmp/gpu-out bash tests/gpu/run.sh >"$tmp/run.txt" 2>&1; rc=$?
[ "$rc" -eq 77 ] || { fail "tests/gpu/run.sh without a GPU: exit $rc, want 77"; cat "$tmp/run.txt" >&2; }
grep -q 'skipped (77)' "$tmp/run.txt" || fail "run.sh: does not say why it skipped"
/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["status"]=="skipped" and d["reason"]' \
  "$tmp/gpu-out/gpu-results.json" || fail "run.sh: no skipped results JSON"

if [ "$fails" -ne 0 ]; then
  echo "device.sh: $fails failure(s)" >&2
  exit 1
fi
echo "device.sh: ok"

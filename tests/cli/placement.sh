#!/usr/bin/env bash
# placement.sh: a plan whose serving.placement this build cannot run (a rank
# beyond the two one process plays without mpirun, a cuda device) is refused
# by `cedar plan check` and by every command that runs a plan, with the
# value's file:line:col and the value to set, exit 1 and no signal; a P/D
# split on ranks 0 and 1 is valid and runs (runtime/dist/pd.h); `cedar graph
# show` compiles both (transfer nodes for a P/D split).
# Usage: bash tests/cli/placement.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
d=tests/plans/placement

expect_refused() { # expect_refused WHAT PATTERN -- command...
  local what=$1 pat=$2; shift 3
  local rc=0
  "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq 1 ] || { cat "$tmp/err" >&2; fail "$what: exit $rc, want 1"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "$what: no '$pat' in the message"; }
}

expect_refused "plan check rank 3" "$d/decode-rank3.yaml:7:20: serving.placement.decode.rank is 3.*set rank: 0" -- \
  "$cedar" plan check $d/decode-rank3.yaml
expect_refused "plan check cuda" "$d/prefill-cuda.yaml:7:23: serving.placement.prefill.device is cuda.*set device: cpu" -- \
  "$cedar" plan check $d/prefill-cuda.yaml
"$cedar" plan check $d/pd-split.yaml > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; fail "plan check P/D: refused"; }
"$cedar" plan check --json $d/decode-rank3.yaml > "$tmp/j" || true
/usr/bin/python3 - "$tmp/j" <<'PY' || fail "plan check --json"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["valid"] is False, r
e = r["errors"][0]
assert e["line"] == 7 and e["column"] == 20 and "decode.rank is 3" in e["message"], e
PY

expect_refused "run rank 3" "decode-rank3.yaml:7:20: serving.placement.decode.rank is 3" -- \
  "$cedar" run --plan $d/decode-rank3.yaml --prompt-len 8 --max-new 1 --executor direct
grep -q "generated" "$tmp/out" && fail "run: a refused plan still generated tokens"
expect_refused "run cuda" "prefill.device is cuda" -- \
  "$cedar" run --plan $d/prefill-cuda.yaml --prompt-len 8 --max-new 1
expect_refused "bench model" "decode.rank is 3" -- \
  "$cedar" bench model --plan $d/decode-rank3.yaml --prompt-len 8 --decode 1
printf '{"id": "a", "tokens": [1, 2, 3], "max_new": 1}\n' > "$tmp/req.jsonl"
expect_refused "serve-sim" "decode.rank is 3" -- \
  "$cedar" serve-sim --plan $d/decode-rank3.yaml --requests "$tmp/req.jsonl"

# Inspection still works: the P/D graph streams KV and hands state over.
"$cedar" graph show --plan $d/pd-split.yaml --prompt-len 300 --chunk 128 > "$tmp/g"
grep -q "on rank 0 cpu; decode on rank 1 cpu: [1-9][0-9]* transfer nodes" "$tmp/g" || fail "graph show: no placement line"
grep -q "xfer L2.kv c2 " "$tmp/g" || fail "graph show: no KV stream transfer for the last tile"
"$cedar" graph show --plan plans/v41-mini.yaml --prompt-len 300 > "$tmp/g1"
grep -q "^  on rank 0 cpu$" "$tmp/g1" || fail "graph show: default placement line"
grep -q "xfer" "$tmp/g1" && fail "graph show: transfers with one home"
echo "placement: ok"

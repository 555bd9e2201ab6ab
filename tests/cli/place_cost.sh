#!/usr/bin/env bash
# place_cost.sh: `cedar plan cost --per-rank` and `cedar plan diff --per-rank`
# (runtime/dist/place_cost.h, docs/placement.md):
#  1. v41-flash on 8 GPUs (plans/gpu/v41-flash-8gpu.yaml) fits 141 GB a rank, the
#     Engram tables in rank 0's host memory; --json says the same;
#  2. the same stages without expert parallelism do not fit, and the diff
#     names both placements and the largest rank of each;
#  3. the ranks' bytes add up to the plan's weights (--json);
#  4. a bad --capacity is a usage error (exit 2).
set -euo pipefail
cedar=${1:?usage: place_cost.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$cedar" plan cost plans/gpu/v41-flash-8gpu.yaml --per-rank --tokens 1000000 > "$tmp/8.txt"
grep -q "^every rank fits in 141.0 GB" "$tmp/8.txt" || { cat "$tmp/8.txt"; fail "8gpu does not fit"; }
[ "$(grep -c ' yes$' "$tmp/8.txt")" -eq 8 ] || { cat "$tmp/8.txt"; fail "want 8 ranks that fit"; }
"$cedar" plan cost plans/gpu/v41-flash-4stage.yaml --per-rank --tokens 1000000 > "$tmp/4.txt"
grep -q "ranks are over 141.0 GB: this placement does not fit" "$tmp/4.txt" || { cat "$tmp/4.txt"; fail "4stage fits?"; }
"$cedar" plan diff plans/gpu/v41-flash-4stage.yaml plans/gpu/v41-flash-8gpu.yaml --per-rank --tokens 1000000 > "$tmp/d.txt"
grep -q "^placement A: v41-flash-4stage" "$tmp/d.txt" && grep -q "^largest rank: A 1[0-9][0-9]\.[0-9]* GB, B [0-9][0-9]\.[0-9]* GB" "$tmp/d.txt" \
  || { cat "$tmp/d.txt"; fail "diff"; }
"$cedar" plan cost plans/gpu/v41-flash-8gpu.yaml --per-rank --json > "$tmp/8.json"
"$py" - "$tmp/8.json" <<'PY' || fail "--json"
import json, sys
j = json.load(open(sys.argv[1]))
r = j["ranks"]
assert j["fits"] and len(r) == 8, j["fits"]
assert sum(x["weights_bytes"] + x["engram_host_bytes"] + x["engram_file_bytes"] for x in r) == j["weights_bytes"]
assert r[0]["engram_host_bytes"] > 150e9 and all(x["engram_device_bytes"] == 0 for x in r)
assert len({x["expert_bytes"] for x in r}) == 1, "experts split unevenly"
PY
rc=0; "$cedar" plan cost --per-rank --capacity -3 > /dev/null 2> "$tmp/e.txt" || rc=$?
[ "$rc" -eq 2 ] && grep -q "capacity" "$tmp/e.txt" || fail "bad --capacity: exit $rc"
echo "place_cost: ok"

#!/usr/bin/env bash
# plan_tools.sh: `cedar plan check|show|dot` end to end, as a user runs them.
# Usage: bash tests/cli/plan_tools.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
py=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# check: every shipped plan is valid; bad plans exit 1 with file:line:col.
"$cedar" plan check plans/*.yaml > "$tmp/ok.txt" || fail "shipped plans do not check"
[ "$(grep -c ': ok' "$tmp/ok.txt")" -eq "$(ls plans/*.yaml | wc -l)" ] || fail "not every plan reported ok"
if "$cedar" plan check plans/v41-mini.yaml tests/plans/bad/unknown_key.yaml > /dev/null 2> "$tmp/bad.txt"; then
  fail "a bad plan passed check"
fi
grep -q '^tests/plans/bad/unknown_key.yaml:5:5: error: unknown key `hedas`' "$tmp/bad.txt" || fail "no file:line:col"
grep -q 'hint: did you mean `heads`' "$tmp/bad.txt" || fail "no did-you-mean"
rc=0; "$cedar" plan check tests/plans/bad/unknown_key.yaml > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "check of a bad plan exited $rc, not 1"
"$cedar" plan check --json plans/v41-flash.yaml tests/plans/bad/kv_not_full.yaml > "$tmp/check.json" || true
$py - "$tmp/check.json" <<'PY' || fail "check --json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r[0]["valid"] is True and r[0]["errors"] == []
assert r[1]["valid"] is False
e = [x for x in r[1]["errors"] if "not a KV source" in x["message"]][0]
assert e["line"] == 4 and e["column"] == 17 and e["hint"]
# every error the override caused points into the override's line (issue 18 row 12)
assert all(x["line"] == 4 for x in r[1]["errors"]), r[1]["errors"]
PY
rc=0; "$cedar" plan check > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "check with no file exited $rc, not 2"

# show: SPEC 2.2's table and the bus table.
"$cedar" plan show plans/v41-flash.yaml > "$tmp/show.txt"
grep -Eq '^L25 +decoder +reuse +1 +L20 +L24 +L25' "$tmp/show.txt" || fail "L25 row (kv L20, topk L24, SWA L25)"
grep -Eq '^candidate-pool +L20 +24, 28, 32, 36$' "$tmp/show.txt" || fail "pool bus row"
grep -Eq '^main-kv +L20 +20-39$' "$tmp/show.txt" || fail "main-kv bus row"
grep -q 'totals: 4 KV sources, 8 index sources (4 reindex), 30 reuse layers, 2 SWA-only layers' "$tmp/show.txt" \
  || fail "totals"
"$cedar" plan show --json plans/v41-flash.yaml > "$tmp/show.json"
$py - "$tmp/show.json" <<'PY' || fail "show --json"
import json, sys
s = json.load(open(sys.argv[1]))
L = s["layers"]
assert len(L) == 40 and L[25]["kv_source"] == 20 and L[25]["topk_source"] == 24 and L[25]["swa_owner"] == 25
assert [l["layer"] for l in L if l["candidates"] == "read"] == [24, 28, 32, 36]
t = s["totals"]
assert (t["kv_sources"], t["index_sources"], t["reuse_layers"], t["swa_only_layers"]) == (4, 8, 30, 2)
pool = [b for b in s["buses"] if b["bus"] == "candidate-pool"]
assert pool == [{"bus": "candidate-pool", "writer": 20, "readers": [24, 28, 32, 36]}]
PY
"$cedar" plan show > /dev/null || fail "show with the default plan"

# dot: well-formed DOT with one node per layer and the bus edges.
"$cedar" plan dot plans/v41-flash.yaml > "$tmp/flash.dot"
[ "$(grep -cE '^    L[0-9]+ \[label=' "$tmp/flash.dot")" -eq 40 ] || fail "40 layer nodes"
grep -q 'L20 -> L24 \[style=dotted' "$tmp/flash.dot" || fail "pool edge L20 -> L24"
grep -q 'L24 -> L25 \[style=dashed' "$tmp/flash.dot" || fail "top-k edge L24 -> L25"
"$cedar" plan dot -o "$tmp/out.dot" plans/v41-mini.yaml && [ -s "$tmp/out.dot" ] || fail "dot -o"
if command -v dot > /dev/null; then
  dot -Tsvg "$tmp/flash.dot" > "$tmp/flash.svg" || fail "graphviz rejects the DOT"
  grep -q '<svg' "$tmp/flash.svg" || fail "no SVG"
fi
"$cedar" plan dot --json plans/v41-flash.yaml | $py -c 'import json,sys; assert json.load(sys.stdin)["dot"].startswith("digraph")' \
  || fail "dot --json"

# help tells the truth: every listed subcommand answers --help.
for sub in check show cost diff dot; do
  "$cedar" plan "$sub" --help | grep -q "usage: cedar plan $sub" || fail "plan $sub --help"
done
"$cedar" --help | grep -q 'plan' || fail "cedar --help lists plan"
# CEDAR_LOG=debug shows the loader's steps on stderr; the default level is quiet.
CEDAR_LOG=debug "$cedar" plan check plans/v41-mini.yaml 2> "$tmp/debug.txt" > /dev/null
grep -q 'debug: plan: reading .*v41-flash.yaml' "$tmp/debug.txt" || fail "CEDAR_LOG=debug shows no extends chain"
"$cedar" plan check plans/v41-mini.yaml 2> "$tmp/quiet.txt" > /dev/null
[ ! -s "$tmp/quiet.txt" ] || fail "stderr not quiet by default"
echo "plan tools: ok"

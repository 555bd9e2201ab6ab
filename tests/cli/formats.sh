#!/usr/bin/env bash
# formats.sh: every cache format the plan language accepts runs end to end
# (issue 13 s1, issue 18 row 6), and what is stored is what `plan cost` counts.
#
# For each plan of tests/plans/formats/ (f32, bf16, e4m3 and e2m1 caches with
# every scale type, and SPEC's pre-V4.1 rules) and the default v41-mini:
#  1. `plan check` accepts it;
#  2. `plan cost --json` counts the entry bytes the element and scale types
#     give (written out below from docs/formats.md, not read from cedar);
#  3. `cedar run` (direct executor; the f32 plan on StarPU too) generates
#     tokens and its state bytes equal plan cost's (global KV and SWA rings);
#  4. `plan check` refuses scaled bf16, a rule of the wrong scale type and a
#     floor without a rule that has one, naming the file:line:col of the key.
# Run from the repository root: bash tests/cli/formats.sh build/cedar (~2 min).
set -euo pipefail

cedar=${1:?usage: formats.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3 || true)
[ -n "$py" ] || { echo "skipped: python3 not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# plan  main_kv indexer_k swa  entry bytes at mini widths (head_dim 128, indexer 64):
#   payload W * bits / 8, plus W / block scales of 1 (e4m3, e8m0) or 4 (f32) bytes.
cases="
plans/v41-mini.yaml            72  34 132
tests/plans/formats/f32.yaml   512 256 512
tests/plans/formats/bf16.yaml  256 128 256
tests/plans/formats/e4m3.yaml  136 66 132
tests/plans/formats/e2m1.yaml  96  34 68
tests/plans/formats/spec.yaml  72  34 132
"
while read -r plan main idx swa; do
  [ -n "$plan" ] || continue
  "$cedar" plan check "$plan" >/dev/null || fail "plan check $plan"
  "$cedar" plan cost --json "$plan" >"$tmp/cost.json" || fail "plan cost $plan"
  executors=direct
  case $plan in *f32.yaml) executors="direct starpu" ;; esac
  for ex in $executors; do
    "$cedar" run --plan "$plan" --prompt-len 40 --max-new 2 --executor "$ex" --json >"$tmp/run.json" 2>"$tmp/err" ||
      { cat "$tmp/err" >&2; fail "run --plan $plan --executor $ex"; }
    "$py" - "$tmp/cost.json" "$tmp/run.json" "$main" "$idx" "$swa" "$plan $ex" <<'PY' || exit 1
import json, sys
cost, run = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
main, idx, swa, what = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
bad = []
for s in cost["global"]["sources"]:
    if (s["main_bytes"], s["indexer_bytes"]) != (main, idx):
        bad.append("source L%d: plan cost counts %d + %d B, want %d + %d" % (s["layer"], s["main_bytes"], s["indexer_bytes"], main, idx))
st, pc = run["state_bytes"], run["plan_cost"]
if len(run["tokens"]) != 2: bad.append("tokens %r" % run["tokens"])
for k in ("global_kv", "global_kv_entries", "swa", "tails"):
    if st[k] != pc[k]: bad.append("%s: stored %d, plan cost %d" % (k, st[k], pc[k]))
if st["global_kv"] != st["global_kv_entries"] * (main + idx): bad.append("global KV %d B for %d entries" % (st["global_kv"], st["global_kv_entries"]))
if st["swa"] != 40 * 128 * swa: bad.append("SWA rings %d B, want 40 x 128 x %d" % (st["swa"], swa))
for b in bad: print("FAIL: %s: %s" % (what, b), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
  done
done <<<"$cases"

# 4. refusals name the place and the fix
refuse() { # FILE LINE TEXT PLAN
  printf '%s\n' "$4" >"$tmp/$1"
  if "$cedar" plan check "$tmp/$1" >"$tmp/out" 2>&1; then fail "plan check accepted $1"; fi
  grep -q "$1:$2:[0-9]*: error: .*$3" "$tmp/out" || { cat "$tmp/out" >&2; fail "$1: no '$3' at line $2"; }
}
mini=$(pwd)/plans/v41-mini.yaml
refuse scaled_bf16.yaml 3 "cannot store" "extends: $mini
formats:
  main_kv: {element: bf16, scale: e8m0, block: 32}"
refuse rule.yaml 3 "e8m0 scale is not chosen" "extends: $mini
formats:
  swa: {element: e4m3, scale: e8m0, scale_rule: rne}"
refuse floor.yaml 3 "scale_floor set for a scale without a floor" "extends: $mini
formats:
  main_kv: {scale_rule: roundup, scale_floor: 0.5}"
echo "formats: ok"

#!/usr/bin/env bash
# plan_cost.sh: `cedar plan cost` and `cedar plan diff` on plans/v41-flash.yaml.
#
# Checks SPEC's figures (4.5, 4.6, 6.2, 6.6) in the --json output, that the
# table output carries them too, a CED-off variant through `plan diff`, and
# that bad arguments exit 2 and a bad plan exits 1. Not here: the arithmetic
# in detail (tests/test_plan_cost.c).
# Run from the repository root: bash tests/cli/plan_cost.sh build/cedar
set -euo pipefail

cedar=${1:?usage: plan_cost.sh /path/to/cedar}
flash=plans/v41-flash.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
[ -f "$flash" ] || { echo "FAIL: $flash is missing (run from the repository root)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# check JSON_FILE 'python expression over j' ...: every expression must be true.
check() {
  local file=$1
  shift
  "$py" - "$file" "$@" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
bad = [e for e in sys.argv[2:] if not eval(e, {"j": j})]
for e in bad:
    print("FAIL: not true: " + e, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

# expect_exit CODE ARGS...: cedar must exit with CODE and say something on stderr.
expect_exit() {
  local want=$1 got=0
  shift
  "$cedar" "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  [ "$got" = "$want" ] || fail "cedar $* exited $got, want $want"
  [ -s "$tmp/err" ] || fail "cedar $* printed no message"
}

# 1. SPEC 4.5, 4.6, 6.2 at the defaults (N = 10^6, n = 1024).
"$cedar" plan cost "$flash" --json >"$tmp/cost.json"
check "$tmp/cost.json" \
  'j["ced"] is True' \
  'j["query"]["tokens"] == 1000000 and j["query"]["prompt"] == 1024 and j["query"]["hit"] is None' \
  'j["layers"]["total"] == 40 and j["layers"]["csa2"] == 38 and j["layers"]["index_sources"] == 8' \
  'j["global"]["n_sources"] == 4' \
  '[s["layer"] for s in j["global"]["sources"]] == [2, 8, 14, 20]' \
  'all(s["main_bytes"] == 288 and s["indexer_bytes"] == 68 and s["entry_bytes"] == 356 for s in j["global"]["sources"])' \
  '[s["readers"] for s in j["global"]["sources"]] == [6, 6, 6, 20]' \
  'j["global"]["bytes_per_token"] == 890' \
  'j["global"]["entries"] == 2500000' \
  'j["global"]["bytes"] == 890000000' \
  'j["global"]["baseline_entries"] == 29000000' \
  'j["swa"]["payload_bytes"] == 2621440 and j["swa"]["payload_bytes_per_layer"] == 65536' \
  'j["tails"]["bytes"] == 12288' \
  'j["cold_prefill"]["token_layers"] == 23040' \
  'j["cold_prefill"]["dense_token_layers"] == 40960' \
  'j["cold_prefill"]["decoder"] == [896, 1024]' \
  'j["indexer"]["key_dots"] == 3 * 500000 + 1000001 + 4 * 16384' \
  'j["indexer"]["per_layer_key_dots"] == 18 * 500000 + 20 * 1000001' \
  '"prefix_hit" not in j'

# 2. SPEC 6.6: hit 4096 of 4100, encoder SWA miss.
"$cedar" plan cost "$flash" --prompt 4100 --hit 4096 --swa-miss --json >"$tmp/hit.json"
check "$tmp/hit.json" \
  'j["prefix_hit"]["encoder_replay"] == [3968, 4096]' \
  'j["prefix_hit"]["encoder_positions"] == 132' \
  'j["prefix_hit"]["decoder"] == [3972, 4100]' \
  'j["prefix_hit"]["decoder_prefix"] == 124 and j["prefix_hit"]["decoder_suffix"] == 4' \
  'j["prefix_hit"]["new_entries"] == 10' \
  'j["prefix_hit"]["new_bytes"] == 3560' \
  'j["prefix_hit"]["token_layers"] == 5200' \
  'j["prefix_hit"]["suffix_only_token_layers"] == 160'

# 3. Odd context: 356 x (3 floor(n/2) + n) bytes.
"$cedar" plan cost "$flash" --tokens 4097 --json >"$tmp/odd.json"
check "$tmp/odd.json" 'j["global"]["bytes"] == 356 * (3 * 2048 + 4097)'

# 4. The tables carry the same figures (with thousands separators).
"$cedar" plan cost "$flash" --prompt 4100 --hit 4096 --swa-miss >"$tmp/table.txt"
for want in '890,000,000' '2,500,000' '29,000,000' '2,621,440' '12,288' '5,200' '3,560' '[3,968, 4,096)'; do
  grep -qF -- "$want" "$tmp/table.txt" || fail "table output lacks '$want'"
done

# 5. plan diff: flash against itself (ratios 1) and against a CED-off variant.
"$cedar" plan diff "$flash" "$flash" --json >"$tmp/same.json"
check "$tmp/same.json" \
  'j["a"]["global"]["bytes"] == j["b"]["global"]["bytes"] == 890000000' \
  'all(v is None or v == 1 for s in j["b_over_a"].values() for v in s.values())'
cat >"$tmp/dense.yaml" <<EOF
extends: $PWD/$flash
name: v41-flash-dense
serving:
  ced: false
EOF
"$cedar" plan diff "$flash" "$tmp/dense.yaml" --json >"$tmp/dense.json"
check "$tmp/dense.json" \
  'j["b"]["ced"] is False' \
  'j["b"]["cold_prefill"]["token_layers"] == 40960' \
  'abs(j["b_over_a"]["cold_prefill"]["token_layers"] - 40960 / 23040) < 1e-12' \
  'j["b_over_a"]["global"]["bytes"] == 1'
"$cedar" plan diff "$flash" "$tmp/dense.yaml" >"$tmp/diff.txt"
grep -q 'B/A' "$tmp/diff.txt" || fail "plan diff table lacks the B/A column"
grep -qF '1.778' "$tmp/diff.txt" || fail "plan diff table lacks the cold-prefill ratio 1.778"

# 6. Help is truthful about every option.
"$cedar" plan cost --help >"$tmp/help.txt"
for opt in --tokens --prompt --hit --swa-miss --json 'ced off'; do
  grep -qF -- "$opt" "$tmp/help.txt" || fail "plan cost --help does not mention '$opt'"
done
"$cedar" plan diff --help >/dev/null

# 7. Bad arguments exit 2; a plan that does not load exits 1.
expect_exit 2 plan cost "$flash" --tokens -5
expect_exit 2 plan cost "$flash" --tokens abc
expect_exit 2 plan cost "$flash" --tokens 12x
expect_exit 2 plan cost "$flash" --tokens 99999999999999999999
expect_exit 2 plan cost "$flash" --prompt 0
expect_exit 2 plan cost "$flash" --prompt 4100 --hit 4101
expect_exit 2 plan cost "$flash" --hit -1
expect_exit 2 plan cost "$flash" --swa-miss
expect_exit 2 plan cost "$flash" --bogus
expect_exit 2 plan cost "$flash" --tokens
expect_exit 2 plan cost "$flash" "$flash"
expect_exit 2 plan diff "$flash"
expect_exit 2 plan cost "$flash" --tokens 9000000000000000000
expect_exit 2 plan cost "$flash" --prompt 100000000000001
expect_exit 1 plan cost "$tmp/missing.yaml"
grep -qF 'missing.yaml' "$tmp/err" || fail "a missing plan's error does not name the file"
printf 'extends: %s\nserving: {ced: maybe}\n' "$PWD/$flash" >"$tmp/bad.yaml"
expect_exit 1 plan diff "$flash" "$tmp/bad.yaml"
grep -qF 'bad.yaml:2:' "$tmp/err" || fail "a bad plan's diagnostics do not name file:line"

echo "plan_cost.sh: ok"

#!/usr/bin/env bash
# eval_quality.sh: quality as an axis of `cedar explore` and `cedar report`
# (issue 30: cli/cmd_explore.c, cli/cmd_report.c, cli/study.c's
# study_quality_run over `cedar eval --dense-ref --json`).
#
#  1. explore --measure quality --text T over serving.ced x
#     serving.replay.decoder on tests/oracle/plans/tiny-40-bytes.yaml: every
#     variant carries bits per byte, accuracy, agreement and KL; a ced: false
#     variant agrees with its dense forward exactly (agreement 1, KL 0); the
#     objectives name quality.bits_per_byte and the front is exactly the
#     variants no other dominates over memory, work (token-layers, key-dots)
#     and bits per byte; a variant's figures equal `cedar eval` run on its
#     kept plan file (--out DIR) bitwise; pareto.png is written;
#  2. usage: --measure quality without --text, --text without it, --model
#     with --weights: exit 2;
#  3. report --text T: report.json holds each plan's quality, equal to
#     `cedar eval` on the plan; index.html has the quality table; a plan the
#     text does not fit (tiny-40, vocab 97) is reported as not run, with
#     eval's reason, and the report still succeeds.
# Skips (77) without gnuplot (report and explore --out need it).
# Run: bash tests/cli/eval_quality.sh build/cedar (from the repository root; ~1 min).
set -u
cedar=${1:?usage: eval_quality.sh /path/to/cedar}
command -v gnuplot > /dev/null || { echo "skipped: gnuplot is not installed (apt-get install gnuplot-nox)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=$(command -v /usr/bin/python3 || command -v python3)
plan=tests/oracle/plans/tiny-40-bytes.yaml
[ -f "$plan" ] || fail "$plan is missing (run from the repository root)"
printf '%s' "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, \
and nothing particular to interest me on shore, I thought I would sail about a little and see the watery part of \
the world." > "$tmp/text.txt"
win=(--context 64 --stride 32)

# ---- 1. explore --------------------------------------------------------------
"$cedar" explore "$plan" --vary serving.ced=true,false --vary serving.replay.decoder=8,16 --tokens 4096 --prompt 256 \
  --measure quality --text "$tmp/text.txt" "${win[@]}" --out "$tmp/x" --json > "$tmp/x.json" 2> "$tmp/x.err" \
  || { cat "$tmp/x.err" >&2; fail "explore --measure quality exit $?"; }
[ -s "$tmp/x/pareto.png" ] || fail "explore wrote no pareto.png"
"$py" - "$tmp/x.json" "$tmp/text.txt" <<'EOF' || fail "explore's quality figures"
import json, os, sys
j = json.load(open(sys.argv[1]))
n_ids = os.path.getsize(sys.argv[2]) - 1  # one id per byte; the first is context only
assert 'quality.bits_per_byte' in j['objectives'], j['objectives']
v = [x for x in j['variants'] if x['valid']]
assert len(v) == 4, len(v)
def obj(x):
    return (x['memory']['total'], x['work']['token_layers'], x['work']['decode_key_dots'], x['quality']['bits_per_byte'])
for x in v:
    q = x['quality']
    assert 0 < q['bits_per_byte'] < 64 and 0 <= q['accuracy'] <= 1 and 0 <= q['dense_top1_agreement'] <= 1, q
    assert q['dense_kl_nats_per_token'] >= 0 and q['tokens'] == n_ids, q
    if x['values']['serving.ced'] == 'false':
        assert q['dense_top1_agreement'] == 1 and q['dense_kl_nats_per_token'] == 0, ('dense variant', q)
def dom(a, b):
    return all(p <= q for p, q in zip(obj(a), obj(b))) and any(p < q for p, q in zip(obj(a), obj(b)))
front = sorted(x['id'] for x in v if not any(dom(y, x) for y in v if y is not x))
assert front == sorted(j['pareto']), (front, j['pareto'])
print('explore: front', front, 'bits per byte', [round(x['quality']['bits_per_byte'], 4) for x in v])
EOF
id=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["variants"][0]["id"])' "$tmp/x.json")
"$cedar" eval --plan "$tmp/x/variants/v$id.yaml" --text "$tmp/text.txt" "${win[@]}" --json > "$tmp/v.json" \
  || fail "eval on variant v$id"
"$py" - "$tmp/x.json" "$tmp/v.json" <<'EOF' || fail "explore's figures differ from cedar eval's"
import json, sys
x, e = json.load(open(sys.argv[1]))['variants'][0]['quality'], json.load(open(sys.argv[2]))
assert x['bits_per_byte'] == e['bits_per_byte'] and x['accuracy'] == e['accuracy'], (x, e)
EOF

# ---- 2. usage ------------------------------------------------------------------
for args in "--measure quality" "--text $tmp/text.txt" "--measure quality --text $tmp/text.txt --model d --weights w"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" explore "$plan" --vary serving.ced=true $args > /dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || fail "explore $args: exit $rc (want 2)"
done
rc=0
"$cedar" report "$plan" --out "$tmp/r0" --context 10 > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "report --context without --text: exit $rc (want 2)"

# ---- 3. report ---------------------------------------------------------------------
"$cedar" report "$plan" tests/oracle/plans/tiny-40.yaml --out "$tmp/r" --no-measure --text "$tmp/text.txt" \
  "${win[@]}" --json > "$tmp/r.json" 2> "$tmp/r.err" || { cat "$tmp/r.err" >&2; fail "report --text exit $?"; }
"$cedar" eval --plan "$plan" --text "$tmp/text.txt" "${win[@]}" --json --dense-ref > "$tmp/e.json" || fail "eval"
"$py" - "$tmp/r.json" "$tmp/e.json" <<'EOF' || fail "report's quality"
import json, sys
r, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
q0, q1 = r['plans'][0]['quality'], r['plans'][1]['quality']
assert q0['bits_per_byte'] == e['bits_per_byte'], (q0, e['bits_per_byte'])
assert q0['dense_kl_nats_per_token'] == e['dense']['kl_nats_per_token'], q0
assert 'vocab is 97' in q1['not_run'], q1
EOF
grep -q "Quality over" "$tmp/r/index.html" || fail "index.html has no quality table"
echo "eval_quality.sh: ok"

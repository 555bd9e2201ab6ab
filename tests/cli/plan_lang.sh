#!/usr/bin/env bash
# plan_lang.sh: the plan language, its docs and the commands agree (issue 18
# rows 10-15).
#  - row 11: the cache capacity key is serving.cache.host_bytes in the
#    loader, `serve-sim --help` and docs/runtime.md; host_cache_bytes is
#    refused with a did-you-mean; the retired serving.max_batch names
#    serving.batch.max_requests;
#  - row 12: a layer override that breaks a rule is blamed at the override's
#    line, not the base entry's; `ratio: null` unsets an inherited ratio;
#  - row 13: an extending plan without `name:` is named after its own file;
#  - row 14: `plan cost --hit C` and `graph show --hit C` take the same
#    flags and refuse or accept the same C (path b needs C on every ratio);
#  - row 15: a ratio past the window says so; a replay inherited past a
#    changed window is warned; run's --tokens, --top-p and prompt length,
#    op --out over --in, --cache-bytes suffixes, weights check's message;
#  - row 10: --json on version, graph show, graph dot and serve-sim gen;
#    unknown flags exit 2.
# Usage: bash tests/cli/plan_lang.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3
base=$PWD/tests/oracle/plans/tiny.yaml

expect() { # expect WANT PATTERN -- CMD...
  local want=$1 pat=$2; shift 3
  local rc=0
  timeout 60 "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/err" >&2; fail "$*: exit $rc, want $want"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "$*: no '$pat' in stderr"; }
}

# ---- row 11 -----------------------------------------------------------------
printf 'extends: %s\nserving: {cache: {host_cache_bytes: 100}}\n' "$base" > "$tmp/hc.yaml"
expect 1 'did you mean `host_bytes`' -- "$cedar" plan check "$tmp/hc.yaml"
"$cedar" serve-sim --help | grep -q "serving.cache.host_bytes" || fail "serve-sim --help does not name host_bytes"
for f in docs/runtime.md docs/plans.md README.md; do
  grep -q "host_cache_bytes" "$f" && fail "$f names host_cache_bytes, which the loader refuses"
done
# serving.max_batch was read by nothing: it is retired, and names its successor
printf 'extends: %s\nserving: {max_batch: 4}\n' "$base" > "$tmp/mb.yaml"
expect 1 'serving.batch.max_requests' -- "$cedar" plan check "$tmp/mb.yaml"
grep -q ':2:' "$tmp/err" || { cat "$tmp/err" >&2; fail "retired max_batch: no file:line in the error"; }
printf 'extends: %s\nserving: {cache: {host_bytes: 100}}\n' "$base" > "$tmp/hb.yaml"
"$cedar" plan check "$tmp/hb.yaml" > /dev/null || fail "host_bytes does not load"

# ---- row 12 -----------------------------------------------------------------
printf 'extends: %s\nname: ov\nlayer_overrides:\n  - {at: 2, mode: swa_only}\n' "$base" > "$tmp/ov.yaml"
expect 1 "$tmp/ov.yaml:4:5: error: layer 2: mode swa_only has no compress ratio" -- "$cedar" plan check "$tmp/ov.yaml"
grep -q "small.yaml" "$tmp/err" && fail "an override's error blames the base file"
printf 'extends: %s\nname: ov\nlayer_overrides:\n  - {at: 2, mode: swa_only, ratio: null}\n' "$base" > "$tmp/ov2.yaml"
"$cedar" plan show "$tmp/ov2.yaml" > "$tmp/show" 2>&1 || { cat "$tmp/show" >&2; fail "ratio: null does not unset"; }
grep -Eq '^L2 +encoder +swa_only' "$tmp/show" || fail "layer 2 is not swa_only after the override"
printf 'extends: %s\nname: ov\nlayer_overrides:\n  - {at: 2, ratio: 0}\n' "$base" > "$tmp/ov3.yaml"
expect 1 "ov3.yaml:4:20: error: .ratio. = 0 is out of range" -- "$cedar" plan check "$tmp/ov3.yaml"

# ---- row 13 -----------------------------------------------------------------
printf 'extends: %s\n' "$base" > "$tmp/child-plan.yaml"
"$cedar" plan show "$tmp/child-plan.yaml" | head -1 | grep -q "^plan child-plan.yaml " || fail "name not the file name"
"$cedar" run --plan "$tmp/child-plan.yaml" --tokens 1,2,3 --max-new 1 --executor direct --json > "$tmp/r.json"
$py -c "import json,sys; assert json.load(open(sys.argv[1]))['plan'] == 'child-plan.yaml'" "$tmp/r.json" \
  || fail "run shows the parent's name"

# ---- row 14 -----------------------------------------------------------------
flash=plans/v41-flash.yaml
expect 1 "ends inside a ratio-2 group of layer 2.*give --hit 32" -- "$cedar" plan cost $flash --prompt 100 --hit 33
expect 1 "ends inside a ratio-2 group of layer 2.*give --hit 32" -- "$cedar" graph show --plan $flash --prompt-len 100 --hit 33
expect 1 "ends inside a ratio-2 group" -- "$cedar" plan cost $flash --prompt 100 --hit 33 --swa-miss
expect 1 "ends inside a ratio-2 group" -- "$cedar" graph show --plan $flash --prompt-len 100 --hit 33 --swa-miss
"$cedar" plan cost $flash --prompt 100 --hit 33 --swa-hit > /dev/null || fail "plan cost --swa-hit"
"$cedar" graph show --plan $flash --prompt-len 100 --hit 33 --swa-hit > /dev/null || fail "graph show --swa-hit"
"$cedar" plan cost $flash --prompt 4100 --hit 4096 --json > "$tmp/c1.json"
"$cedar" plan cost $flash --prompt 4100 --hit 4096 --swa-miss --json > "$tmp/c2.json"
cmp -s "$tmp/c1.json" "$tmp/c2.json" || fail "plan cost --hit: path b is not the default"
"$cedar" graph show --plan $flash --prompt-len 4100 --hit 4096 --json > "$tmp/g.json"
$py - "$tmp" <<'PY' || fail "plan cost and graph show disagree on SPEC 6.6's hit"
import json, sys
d = sys.argv[1]
c = json.load(open(d + '/c1.json')); g = json.load(open(d + '/g.json'))
assert g['token_layers'] == 5200 and c['prefix_hit']['token_layers'] == 5200, (g['token_layers'], c['prefix_hit'])
assert g['edges'] == sum(len(n['waits_for']) for n in g['nodes']) and g['hit'] == 4096
PY

# ---- row 15 -----------------------------------------------------------------
printf 'extends: %s\nname: w1\nmodel: {swa: {window: 1}}\nserving: {replay: {encoder: 1, decoder: 1}}\n' "$base" > "$tmp/w1.yaml"
expect 1 "compress ratio 2 is larger than the sliding window of 1 tokens" -- "$cedar" plan check "$tmp/w1.yaml"
grep -q "page would split" "$tmp/err" && fail "ratio past the window blamed on the page"
printf 'extends: %s\nname: w16\nmodel: {swa: {window: 16}}\n' "$base" > "$tmp/w16.yaml"
expect 0 "serving.replay.decoder is 12 but model.swa.window is 16" -- "$cedar" plan check "$tmp/w16.yaml"
"$cedar" plan check "$base" 2> "$tmp/err" > /dev/null; [ -s "$tmp/err" ] && fail "a replay set beside its window is warned"
tiny=tests/oracle/plans/tiny.yaml
expect 1 "'' (item 2) is not a token id" -- "$cedar" run --plan $tiny --tokens 1,,2 --max-new 1
expect 1 "'' (item 2) is not a token id" -- "$cedar" run --plan $tiny --tokens 1, --max-new 1
expect 2 "--top-p needs --temperature" -- "$cedar" run --plan $tiny --tokens 1,2 --top-p 0.5
expect 1 "more than the 1048576 positions plan" -- "$cedar" run --prompt-len 2000000000 --max-new 1
"$cedar" op sample --help > /dev/null
printf 'extends: %s\n' "$base" > /dev/null
"$cedar" weights init --plan $tiny --seed 1 --out "$tmp/w.st" > /dev/null
expect 2 "--out .* is the --in file" -- "$cedar" op rmsnorm --in "$tmp/w.st" --out "$tmp/w.st"
printf '{"id": "a", "session": "s", "tokens": [1, 2], "max_new": 1}\n' > "$tmp/req.jsonl"
expect 1 "a prefix cache of 1024 bytes cannot hold one block" -- \
  "$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --cache-bytes 1K --executor direct
"$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --cache-bytes 1M --executor direct > /dev/null \
  || fail "--cache-bytes 1M"
# a fingerprint edited in place (same length), tensors untouched
$py - "$tmp/w.st" <<'PY'
import sys
b = bytearray(open(sys.argv[1], 'rb').read())
i = b.index(b'"cedar.fingerprint":"') + len(b'"cedar.fingerprint":"')
b[i:i + 4] = b'0000' if b[i:i + 4] != b'0000' else b'1111'
open(sys.argv[1], 'wb').write(b)
PY
expect 1 "every tensor's name, dtype and shape match the plan" -- "$cedar" weights check --plan $tiny "$tmp/w.st"
grep -q "dimensions differ" "$tmp/err" && fail "weights check blames the dimensions"

# ---- row 10 -----------------------------------------------------------------
"$cedar" version --json > "$tmp/v.json" && $py -c "import json,sys; json.load(open(sys.argv[1]))['version']" "$tmp/v.json" \
  || fail "version --json"
"$cedar" graph dot --plan $tiny --prompt-len 8 --json > "$tmp/d.json"
$py -c "import json,sys; assert json.load(open(sys.argv[1]))['dot'].startswith('digraph')" "$tmp/d.json" || fail "graph dot --json"
"$cedar" serve-sim gen --sessions 1 --turns 2 --json > "$tmp/gen.jsonl"
$py -c "import json,sys; assert len([json.loads(l) for l in open(sys.argv[1])]) == 2" "$tmp/gen.jsonl" || fail "gen --json"
for c in "version" "env" "plan check" "plan cost" "graph show" "graph dot" "run" "serve-sim" "serve-sim gen" \
         "weights list" "bench model" "op sample"; do
  rc=0; $cedar $c --bogus > /dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || fail "cedar $c --bogus: exit $rc, want 2"
done
echo "plan_lang: ok"

#!/usr/bin/env bash
# serve_sim_lines.sh: serve-sim's inputs checked as strictly as --requests
# lines (issue 28 row 14 and the low rows), each case bounded by `timeout`:
#  - --trace lines: an unknown key (a typo) refused, fractional prompt_len or
#    max_new refused (not cut), line numbers right after blank lines, a
#    \u0000 refused;
#  - --rate 1e-300 refused (the clock would lose every latency), arrivals past
#    1e9 s refused, --burst-every without --burst refused;
#  - goodput counts failed requests in its denominator;
#  - --requests: duplicate ids and a \u0000 in a prompt refused, naming lines;
#  - detokenize --file: JSON with a key other than "ids" refused.
# Usage: bash tests/cli/serve_sim_lines.sh path/to/cedar   (from the repo root)
set -uo pipefail
cedar=${1:?usage: serve_sim_lines.sh /path/to/cedar}
cd "$(dirname "$0")/../.." || exit 1
tiny=tests/oracle/plans/tiny.yaml
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect WANT PATTERN CMD...: exit WANT within 120 s, PATTERN in stderr.
expect() {
  local want=$1 pat=$2 rc=0
  shift 2
  timeout 120 "$cedar" "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/err" >&2; fail "$*: exit $rc, want $want"; }
  [ -z "$pat" ] || grep -qF -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "$*: no '$pat' in the message"; }
}
good='{"arrival_s": 0, "prompt_len": 8, "max_new": 2}'
trace() { # trace BAD-LINE: a good line, two blank lines, the bad one at line 4
  printf '%s\n\n\n%s\n' "$good" "$1" > "$tmp/t.jsonl"
}
trace '{"arrival_s": 0.1, "prompt_len": 8, "max_nwe": 2}'
expect 1 't.jsonl:4: unknown key "max_nwe"' serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"
trace '{"arrival_s": 0.1, "prompt_len": 8.5, "max_new": 2}'
expect 1 't.jsonl:4: give one of "prompt_len" (a whole number' serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"
trace '{"arrival_s": 0.1, "prompt_len": 8, "max_new": 2.5}'
expect 1 't.jsonl:4: "max_new" takes a whole number' serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"
trace '{"arrival_s": 0.1, "tokens": [1, 2], "max_new": 2, "x": "a\u0000b"}'
expect 1 't.jsonl:4: a \u0000 (NUL)' serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"
# an escaped backslash before u0000 is not a NUL: the line is refused only for its unknown key
trace '{"arrival_s": 0.1, "prompt_len": 8, "y": "\\u0000"}'
expect 1 't.jsonl:4: unknown key "y"' serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"
trace "$good"
expect 0 "" serve-sim --plan $tiny --max-batch 2 --trace "$tmp/t.jsonl"

# arrival processes
expect 2 "--rate takes requests per second in [1e-6, 1e9]" serve-sim --plan $tiny --max-batch 2 --rate 1e-300
expect 2 "--rate takes" serve-sim --plan $tiny --max-batch 2 --rate 1e300
expect 1 "past the 1e+09 s" serve-sim --plan $tiny --max-batch 2 --rate 1e-6 --num-prompts 5000
expect 2 "--burst-every goes with --burst K" serve-sim --plan $tiny --max-batch 2 --burst-every 3
expect 0 "" serve-sim --plan $tiny --max-batch 2 --burst 2 --burst-every 3 --num-prompts 4 --max-new 2 --prompt-len 8

# goodput: every request fails (NaN weights); the good count is out of all of them
"$cedar" weights init --plan $tiny --seed 3 --out "$tmp/w.st" > /dev/null || fail "weights init"
/usr/bin/python3 - "$tmp/w.st" "$tmp/nan.st" << 'PY' || fail "making NaN weights"
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = b[8 + n:]
a, e = h["norm"]["data_offsets"]
for i in range(a, e, 4):
    data[i:i + 4] = struct.pack("<I", 0x7fc00000)
h["__metadata__"].pop("cedar.hash.norm", None)
hdr = json.dumps(h).encode()
hdr += b" " * (-len(hdr) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
PY
expect 1 "failed" serve-sim --plan $tiny --weights "$tmp/nan.st" --max-batch 2 --num-prompts 3 --max-new 2 \
  --prompt-len 8 --slo-ttft-ms 1e9
grep -q "goodput 0.00 req/s (0 of 3 requests within their SLOs, 3 failed)" "$tmp/out" ||
  { cat "$tmp/out" >&2; fail "goodput does not count the failed requests"; }

# --requests: duplicate ids, \u0000 in a prompt; the good lines still run
printf '%s\n' '{"id": "a", "session": "s", "tokens": [1, 2, 3], "max_new": 1}' \
  '{"id": "a", "session": "t", "tokens": [4, 5], "max_new": 1}' \
  '{"id": "c", "session": "u", "prompt": "hi\u0000there", "max_new": 1}' \
  '{"id": "d", "session": "v", "tokens": [6, 7], "max_new": 1}' > "$tmp/r.jsonl"
expect 1 'r.jsonl: line 2: duplicate id "a" (first on line 1)' serve-sim --plan $tiny --requests "$tmp/r.jsonl" \
  --executor direct
grep -q 'line 3: a \\u0000 (NUL) in a string' "$tmp/err" || { cat "$tmp/err" >&2; fail "--requests: \\u0000 passed"; }
grep -q "^a " "$tmp/out" && grep -q "^d " "$tmp/out" || fail "--requests: the good lines did not run"

# detokenize --file: only [ids] or {"ids": [ids]}
if "$cedar" tokenize hi > /dev/null 2>&1; then
  echo '{"x": [5, 6], "ids": [100]}' > "$tmp/d.json"
  expect 2 'no other key' detokenize --file "$tmp/d.json"
  echo '{"ids": [100], "ids": [5]}' > "$tmp/d.json"
  expect 2 'no other key' detokenize --file "$tmp/d.json"
  echo '{"ids": [1.5]}' > "$tmp/d.json"
  expect 2 'non-negative integers' detokenize --file "$tmp/d.json"
  echo '{"ids": [100, 5]}' > "$tmp/d.json"
  "$cedar" detokenize --file "$tmp/d.json" > "$tmp/a.txt" && "$cedar" detokenize 100 5 > "$tmp/b.txt" &&
    cmp -s "$tmp/a.txt" "$tmp/b.txt" || fail "detokenize --file {\"ids\": ...} differs from the arguments"
else
  echo "serve_sim_lines: no tokenizer in this build; the detokenize cases are skipped"
fi
echo "serve_sim_lines: ok"

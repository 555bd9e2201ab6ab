#!/usr/bin/env bash
# bad_input.sh: bad input a new user gives cedar (issue 18 rows 2, 7, 8, 9,
# 15): each gets a clear message and exit 1 (bad content) or 2 (usage),
# before any work is done, and never a signal.
#  - output paths (--out, --dump, --dot, --trace, -o): a path that exists and
#    is not a regular file (a FIFO standing for /dev/full, a directory) is refused, so is one in
#    a missing directory, before the run (no report, no time spent);
#  - serve-sim request lines: every field checked with run's limits, naming
#    the line; the other lines still run;
#  - serve-sim --requests: a directory or a device is refused; size caps.
# Usage: bash tests/cli/bad_input.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tiny=tests/oracle/plans/tiny.yaml

# expect WANT PATTERN -- CMD...: exit WANT, PATTERN in stderr, within 60 s.
expect() {
  local want=$1 pat=$2; shift 3
  local rc=0
  timeout 60 "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || { cat "$tmp/err" >&2; fail "$*: exit $rc, want $want"; }
  grep -q -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "$*: no '$pat' in the message"; }
}

# ---- row 2 and 9: output paths ------------------------------------------
# A FIFO stands for a device: a cedar without the check would replace
# /dev/null when run as root (rename over it), or block opening a FIFO
# (bounded by timeout); the FIFO is ours to lose.
mkdir "$tmp/dir"
mkfifo "$tmp/fifo"
expect 1 "--out $tmp/fifo: exists and is not a regular file" -- \
  "$cedar" weights init --plan $tiny --seed 1 --out "$tmp/fifo"
[ -p "$tmp/fifo" ] || fail "weights init replaced the FIFO"
expect 1 "--out $tmp/dir: exists and is not a regular file" -- "$cedar" weights init --plan $tiny --seed 1 --out "$tmp/dir"
expect 1 "its directory does not exist" -- "$cedar" weights init --plan $tiny --seed 1 --out "$tmp/nonexist/w.st"
for flag in --dump --dot --trace; do
  expect 1 "$flag $tmp/nonexist/x: its directory does not exist" -- \
    "$cedar" run --plan $tiny --tokens 1,2,3 --max-new 1 $flag "$tmp/nonexist/x"
  grep -q "generated" "$tmp/out" && fail "run $flag: ran before refusing the path"
  expect 1 "$flag $tmp/fifo: exists and is not a regular file" -- \
    "$cedar" run --plan $tiny --tokens 1,2,3 --max-new 1 $flag "$tmp/fifo"
done
expect 1 "--out $tmp/dir: exists and is not a regular file" -- "$cedar" graph dot --plan $tiny --prompt-len 8 -o "$tmp/dir"
"$cedar" graph dot --plan $tiny --prompt-len 8 -o "$tmp/g.dot" && grep -q digraph "$tmp/g.dot" || fail "graph dot -o"
"$cedar" graph dot --plan $tiny --prompt-len 8 --out "$tmp/g2.dot" && cmp -s "$tmp/g.dot" "$tmp/g2.dot" || fail "graph dot --out"

# ---- row 7: request fields ---------------------------------------------
line() { printf '%s\n' '{"id": "ok1", "session": "s", "tokens": [1, 2, 3], "max_new": 1}' "$1" \
  '{"id": "ok2", "session": "t", "tokens": [4, 5], "max_new": 1}' > "$tmp/req.jsonl"; }
bad_line() { # bad_line JSON PATTERN
  line "$1"
  expect 1 "req.jsonl: line 2: $2" -- "$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --executor direct
  grep -q "^ok1 " "$tmp/out" && grep -q "^ok2 " "$tmp/out" || fail "serve-sim: the good lines around '$1' did not run"
}
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": 0}' '"max_new" must be a whole number in \[1, 1048576\]'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": -1}' '"max_new" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": 2147483648}' '"max_new" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": 1048577}' '"max_new" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": 1.5}' '"max_new" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max_new": "3"}' '"max_new" must be'
bad_line '{"id": "b", "session": "s", "new_len": 20.5}' '"new_len" must be a whole number'
bad_line '{"id": "b", "session": "s", "new_len": 0}' '"new_len" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1.5]}' '"tokens" item 1 is not a token id'
bad_line '{"id": "b", "session": "s", "tokens": []}' '"tokens" must be a non-empty array'
bad_line '{"id": "b", "session": "s", "tokens": [1], "new_len": 3}' 'give one of "tokens"'
bad_line '{"id": "b", "session": "s"}' 'give one of "tokens"'
bad_line '{"id": "b", "session": "s", "tokens": [1], "max-new": 3}' 'unknown key "max-new"'
bad_line '{"id": "b", "session": "s", "tokens": [1], "turn": -2}' '"turn" must be'
bad_line '{"id": "b", "session": "s", "tokens": [1], "seed": 1e300}' '"seed" must be'
bad_line '{"id": 7, "session": "s", "tokens": [1]}' 'not a request'
bad_line '[1, 2]' 'not a request'
bad_line '{"id": "b", "session": "s", "new_len": 100, "max_new": 1048576}' 'the session.s history, the new tokens and max_new need 1048680 positions; plan oracle-tiny holds at most 1048576'

# ---- row 8: the requests file ---------------------------------------------
expect 1 "--requests $tmp/dir: not a regular file" -- "$cedar" serve-sim --plan $tiny --requests "$tmp/dir"
expect 1 "--requests /dev/zero: not a regular file" -- "$cedar" serve-sim --plan $tiny --requests /dev/zero
expect 1 ":1: a line longer than 16 MiB" -- bash -c "head -c 20000000 /dev/zero | '$cedar' serve-sim --plan $tiny --requests -"
echo "bad_input: ok"

#!/usr/bin/env bash
# paths.sh: every command that reads a path a user names, against hostile
# paths (issue 28 rows 6 and 7; base/file.h). One table, every row tried with
#   fifo    a FIFO with no writer: refused at once, never waited on
#   zero    /dev/zero: refused (a device), never read until memory runs out
#   dir     a directory: refused
#   hostile a missing file named like a shell injection: refused, nothing run
# Each case is bounded by `timeout` (124 = it hung) and must exit 1 or 2
# with the path's name in the message, never a signal. Then the checkpoint
# directory's members as FIFOs (a shard, config.json, the index), a FIFO
# as a `.blk` in --cache-dir (dropped, the run goes on), and standard input
# over the text cap (`head -c ... /dev/zero | cedar ... -`), and a weights
# file truncated in place while a run has it mapped (runtime/load/map_guard.h).
# Usage: bash tests/cli/paths.sh path/to/cedar   (from the repo root)
set -uo pipefail
cedar=${1:?usage: paths.sh /path/to/cedar}
tiny=tests/oracle/plans/tiny.yaml
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$(dirname "$0")/../.." || exit 1

mkfifo "$tmp/fifo"
mkdir "$tmp/dir"
hostile="$tmp/x'; touch $tmp/PWNED; echo '\$(touch $tmp/PWNED2).json"
"$cedar" weights init --plan $tiny --seed 1 --out "$tmp/w.st" > /dev/null || fail "weights init"
# A trace to give `view` and a --trace for serve-sim's positive control.
tok=$("$cedar" tokenize --help | sed -n 's/.*npm cache this build found, \(.*tokenizer.json\)).*/\1/p')

# label | the command; @ stands for the path under test
table=(
  "run --weights|run --plan $tiny --weights @ --tokens 1,2,3 --max-new 1 --executor direct"
  "run --plan|run --plan @ --tokens 1,2,3 --max-new 1"
  "run --model|run --model @ --tokens 1,2,3 --max-new 1"
  "plan check|plan check @"
  "plan import|plan import @"
  "view|view @ -o $tmp/v.html"
  "serve-sim --requests|serve-sim --plan $tiny --requests @ --executor direct"
  "serve-sim --trace|serve-sim --plan $tiny --max-batch 2 --trace @"
  "weights check|weights check --plan $tiny @"
  "op --in|op rmsnorm --in @ --out $tmp/o.st"
  "tokenize --tokenizer|tokenize --tokenizer @ hi"
  "detokenize --tokenizer|detokenize --tokenizer @ 5"
  "eval --text|eval --plan $tiny --text @"
  "eval --plan|eval --plan @ --text README.md"
  "eval --model|eval --model @ --text README.md"
  "eval --tokenizer|eval --plan $tiny --tokenizer @ --text README.md"
)
if [ -n "$tok" ] && [ -f "$tok" ]; then
  table+=("tokenize --file|tokenize --file @" "detokenize --file|detokenize --file @")
else
  echo "paths: no tokenizer in this build; tokenize --file and detokenize --file rows skipped"
fi

# run_case LABEL KIND PATH CMD: exit 1 or 2 within 30 s, the path named.
run_case() {
  local label=$1 kind=$2 path=$3 cmd=$4 rc=0
  local -a argv=()
  read -r -a words <<< "$cmd"
  for w in "${words[@]}"; do [ "$w" = @ ] && argv+=("$path") || argv+=("$w"); done
  timeout 30 "$cedar" "${argv[@]}" > "$tmp/out" 2> "$tmp/err" < /dev/null || rc=$?
  [ "$rc" -ne 124 ] || fail "$label ($kind): hung (killed after 30 s)"
  [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] || { cat "$tmp/err" >&2; fail "$label ($kind): exit $rc, want 1 or 2"; }
  grep -qF -- "$path" "$tmp/err" || { cat "$tmp/err" >&2; fail "$label ($kind): the message does not name $path"; }
  [ ! -e "$tmp/PWNED" ] && [ ! -e "$tmp/PWNED2" ] || fail "$label ($kind): a name ran as a command"
}

for row in "${table[@]}"; do
  label=${row%%|*} cmd=${row#*|}
  run_case "$label" fifo "$tmp/fifo" "$cmd"
  run_case "$label" zero /dev/zero "$cmd"
  run_case "$label" hostile "$hostile" "$cmd"
  [ "$label" = "run --model" ] || run_case "$label" dir "$tmp/dir" "$cmd"
done
# the FIFO is still ours (nothing replaced or removed it)
[ -p "$tmp/fifo" ] || fail "the FIFO was replaced"

# ---- a checkpoint directory whose members are FIFOs -----------------------
ck=$tmp/ck
"$cedar" weights init --layout released --plan tests/plans/ckpt-small.yaml --seed 3 --out "$ck" \
  --shard-bytes 3M > /dev/null || fail "weights init --layout released"
shard=$(cd "$ck" && ls model-*.safetensors | head -1)
for member in config.json model.safetensors.index.json "$shard"; do
  rm -rf "$tmp/ckf" && cp -r "$ck" "$tmp/ckf" && rm "$tmp/ckf/$member" && mkfifo "$tmp/ckf/$member"
  rc=0
  timeout 30 "$cedar" run --model "$tmp/ckf" --tokens 1,2,3 --max-new 1 > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -ne 124 ] || fail "--model with $member a FIFO: hung"
  [ "$rc" -eq 1 ] && grep -qF "$member" "$tmp/err" && grep -q "not a regular file" "$tmp/err" ||
    { cat "$tmp/err" >&2; fail "--model with $member a FIFO: exit $rc, want 1 naming it"; }
  rc=0
  timeout 30 "$cedar" weights check "$tmp/ckf" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq 1 ] && grep -qF "$member" "$tmp/out" "$tmp/err" ||
    { cat "$tmp/out" "$tmp/err" >&2; fail "weights check with $member a FIFO: exit $rc, want 1 naming it"; }
done

# ---- a FIFO as a block in --cache-dir: dropped with a warning, the run goes on
printf '%s\n' '{"id": "t0", "session": "s", "turn": 0, "new_len": 300, "max_new": 2}' > "$tmp/req.jsonl"
mkdir "$tmp/cache"
"$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --executor direct --cache-dir "$tmp/cache" \
  > /dev/null 2>&1 || fail "serve-sim --cache-dir: populating"
blk=$(ls "$tmp/cache"/*.blk 2> /dev/null | head -1)
[ -n "$blk" ] || fail "serve-sim --cache-dir wrote no block (the FIFO case needs one)"
for b in "$tmp/cache"/*.blk; do rm "$b" && mkfifo "$b"; done
rc=0
CEDAR_LOG=warn timeout 30 "$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --executor direct \
  --cache-dir "$tmp/cache" > "$tmp/out" 2> "$tmp/err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/err" >&2; fail "--cache-dir with a FIFO block: exit $rc, want 0"; }
grep -q "not a regular file" "$tmp/err" || { cat "$tmp/err" >&2; fail "--cache-dir FIFO block: no warning"; }

# ---- standard input over the 256 MiB text cap: refused, not read forever --
stdin_case() { # LABEL CMD...
  local label=$1 rc=0
  shift
  head -c 300M /dev/zero | timeout 60 "$cedar" "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq 1 ] && grep -q "limit" "$tmp/err" || { cat "$tmp/err" >&2; fail "$label: exit $rc on 300 MiB of stdin"; }
}
if [ -n "$tok" ] && [ -f "$tok" ]; then
  stdin_case "tokenize --file -" tokenize --file -
  stdin_case "detokenize --file -" detokenize --file -
fi
stdin_case "serve-sim --trace -" serve-sim --plan $tiny --max-batch 2 --trace -
# ---- a shard truncated in place during a run: the file named, exit 1, no SIGBUS death
"$cedar" weights init --plan $tiny --seed 2 --out "$tmp/cut.st" > /dev/null || fail "weights init"
timeout 120 "$cedar" run --plan $tiny --weights "$tmp/cut.st" --tokens 1,2,3 --max-new 20000 --executor direct \
  > /dev/null 2> "$tmp/err" &
pid=$!
sleep 1
truncate -s 4096 "$tmp/cut.st"
rc=0
wait $pid || rc=$?
[ "$rc" -eq 1 ] && grep -qF "$tmp/cut.st: the file changed while cedar had it mapped" "$tmp/err" ||
  { cat "$tmp/err" >&2; fail "a shard truncated mid-run: exit $rc (135 = SIGBUS), want 1 naming it"; }
echo "paths: ok"

#!/usr/bin/env bash
# run_text.sh: text in and out of `cedar run` (issue 13 section 4;
# cli/run_text.c, runtime/text/chat_template.c, runtime/text/text_out.c), on
# tests/plans/text-tiny.yaml (V4.1's vocabulary at toy widths).
#
#  1. the chat format: `cedar tokenize --chat [--system S]` renders the text
#     and ids that @lenml/tokenizers' apply_chat_template (its Jinja engine
#     over the package's chat_template) renders, on prompts with Chinese,
#     emoji, whitespace runs, quotes and braces, an empty system message and
#     special-token text (node; skipped without it);
#  2. `run --prompt` prefills exactly those ids (--ids --json); the streamed
#     stdout is the text, and the text is the one-shot decode of the
#     generated ids (`cedar detokenize`); --json and the stream agree;
#  3. --stop S: ends at the first id whose text completes S, the text cut
#     before S, the ids a prefix of the unstopped run's;
#  4. EOS: a raw prompt of the EOS token with --repetition-penalty 1e-4
#     (EOS's logit x 1e4 when positive) ends by EOS on some weights seed of
#     the first 8; every run's end is consistent with its ids;
#  5. sampling: --top-k 1 equals greedy; the same --sample-seed gives the
#     same ids, another seed others, with the weights unchanged (same
#     fingerprint); --repetition-penalty 1 is off;
#  6. refusals: a prompt whose ids pass the plan's vocab (v41-mini, 512) is
#     refused naming both sizes, before any weights; no
#     tokenizer_config.json: the chat format is refused, --raw runs; a P/D
#     plan samples with --top-k as one process; usage errors exit 2; --help
#     lists the options.
# Skips (77) without the npm tokenizer (make install-deps).
# Run from the repository root: bash tests/cli/run_text.sh build/cedar
set -euo pipefail

cedar=${1:?usage: run_text.sh /path/to/cedar}
plan=tests/plans/text-tiny.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_exit() {
  local want=$1 got=0
  shift
  "$cedar" "$@" > "$tmp/out" 2> "$tmp/err" || got=$?
  [ "$got" -eq "$want" ] || fail "cedar $* exited $got, want $want: $(head -c 600 "$tmp/err")"
}
# field FILE EXPR: a Python expression over the JSON object j of FILE
field() { "$py" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

if ! "$cedar" tokenize x > /dev/null 2> "$tmp/err"; then
  grep -q "no tokenizer" "$tmp/err" && { echo "SKIP: this build found no npm tokenizer (make install-deps)"; exit 77; }
  fail "cedar tokenize x: $(cat "$tmp/err")"
fi
tj=$("$cedar" tokenize --help | sed -n 's/.*npm cache this build found, \(.*tokenizer.json\)).*/\1/p')
[ -f "$tj" ] || fail "tokenize --help does not name the tokenizer.json it uses"

# 1. The chat format against the JS implementation.
cat > "$tmp/cases.json" <<'EOF'
[{"user": "Hi"}, {"system": "Be brief.", "user": "Hello, 世界!"}, {"user": "  spaces\n\nand newlines\t"},
 {"user": "emoji 😀 and 'quotes' \"double\" {{ braces }} {% tag %}"}, {"system": "", "user": "empty system"},
 {"user": "<｜User｜>inside<｜Assistant｜>"}]
EOF
export NODE_PATH="${tj%%/node_modules/*}/node_modules"
if command -v node > /dev/null && [ -d "$NODE_PATH/@lenml/tokenizers" ]; then
  node tests/tokenizer/js_chat.cjs "$tmp/cases.json" > "$tmp/js.jsonl" || fail "node js_chat.cjs failed"
  n=$("$py" -c "import json,sys; print(len(json.load(open(sys.argv[1]))))" "$tmp/cases.json")
  for i in $(seq 0 $((n - 1))); do
    args=()
    sys=$("$py" -c "import json,sys; c=json.load(open(sys.argv[1]))[$i]; print('system' in c)" "$tmp/cases.json")
    [ "$sys" = True ] && args+=(--system "$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[$i]['system'], end='')" "$tmp/cases.json")")
    user=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[$i]['user'], end='')" "$tmp/cases.json")
    "$cedar" tokenize --chat --json "${args[@]}" -- "$user" > "$tmp/c.json" || fail "tokenize --chat case $i"
    sed -n "$((i + 1))p" "$tmp/js.jsonl" > "$tmp/j.json"
    "$py" - "$tmp/c.json" "$tmp/j.json" "$i" <<'PY' || fail "chat format case $i differs from apply_chat_template"
import json, sys
c = json.load(open(sys.argv[1])); j = json.load(open(sys.argv[2]))
if c["text"].encode() != j["text"].encode(): sys.exit(f"case {sys.argv[3]}: text {c['text']!r} vs JS {j['text']!r}")
if c["ids"] != j["ids"]: sys.exit(f"case {sys.argv[3]}: ids {c['ids']} vs JS {j['ids']}")
PY
  done
  echo "ok: the chat format of $n prompts equals apply_chat_template's text and ids"
else
  echo "note: node or @lenml/tokenizers missing: the chat format is not compared with the JS implementation"
fi

# 2. --prompt prefills those ids; the stream is the one-shot decode of the ids.
prompt='Write one sentence about cedar trees.'
"$cedar" tokenize --chat --json "$prompt" > "$tmp/chat.json"
expect_exit 0 run --plan $plan --prompt "$prompt" --ids --json --max-new 24
cp "$tmp/out" "$tmp/run.json"
"$py" - "$tmp/run.json" "$tmp/chat.json" <<'PY' || fail "run --prompt: prompt ids or fields"
import json, sys
r = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
assert r["prompt_ids"] == c["ids"], (r["prompt_ids"], c["ids"])
assert r["prompt_format"] == "chat format" and r["prompt_tokens"] == len(c["ids"])
assert r["end"] in ("max-new", "eos", "stop", "error") and len(r["tokens"]) >= 1
PY
field "$tmp/run.json" "' '.join(map(str, j['tokens'][:-1] if j['end'] == 'eos' else j['tokens']))" > "$tmp/ids.txt"
end=$(field "$tmp/run.json" "j['end']")
[ "$end" = error ] && fail "the run met an id with no token; pick another prompt"
"$cedar" detokenize --file "$tmp/ids.txt" > "$tmp/oneshot.txt"
"$py" -c "import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))['text'])" "$tmp/run.json" > "$tmp/json_text.txt"
cmp -s "$tmp/oneshot.txt" "$tmp/json_text.txt" || fail "streamed text != one-shot decode: $(head -c 200 "$tmp/json_text.txt")"
expect_exit 0 run --plan $plan --prompt "$prompt" --max-new 24
n=$(field "$tmp/chat.json" "len(j['ids'])")
"$py" - "$tmp/out" "$tmp/oneshot.txt" "$n" <<'PY' || fail "stdout does not open with the streamed text"
import sys
out = open(sys.argv[1], "rb").read(); text = open(sys.argv[2], "rb").read(); n = sys.argv[3]
head = text + (b"" if text.endswith(b"\n") else b"\n")
assert out.startswith(head), (out[:200], head[:200])
rest = out[len(head):].decode()
assert rest.startswith("plan text-tiny"), rest[:100]
assert f"prompt {n} tokens (chat format); generated 24, ended by max-new (24 tokens)" in rest, rest
PY
echo "ok: run --prompt prefills the chat ids; the streamed text is the one-shot decode ($(wc -c < "$tmp/oneshot.txt") bytes)"

# 3. --stop: a piece of the unstopped text.
stop=$("$py" -c "import sys; t=open(sys.argv[1]).read(); print(t[len(t)//2:len(t)//2+3], end='')" "$tmp/oneshot.txt")
[ -n "$stop" ] || fail "no text to take a stop string from"
expect_exit 0 run --plan $plan --prompt "$prompt" --json --max-new 24 --stop "$stop" --stop "never in it \x01"
"$py" - "$tmp/out" "$tmp/run.json" "$tmp/oneshot.txt" "$stop" <<'PY' || fail "--stop"
import json, sys
s = json.load(open(sys.argv[1])); r = json.load(open(sys.argv[2])); full = open(sys.argv[3]).read(); stop = sys.argv[4]
assert s["end"] == "stop" and s["stop_string"] == stop, (s["end"], s.get("stop_string"))
assert s["text"] == full[:full.index(stop)], (s["text"], full[:full.index(stop)])
n = len(s["tokens"]); assert s["tokens"] == r["tokens"][:n] and n < len(r["tokens"])
PY
expect_exit 0 run --plan $plan --prompt "$prompt" --max-new 24 --stop "$stop"
grep -q 'ended by stop string 1 ' "$tmp/out" || fail "the report does not say the stop string ended it"
echo "ok: --stop '$stop' ends the text before it"

# 4. EOS: the EOS token in a raw prompt, its logit raised by a penalty below 1.
eos_seen=0
for seed in 0 1 2 3 4 5 6 7; do
  expect_exit 0 run --plan $plan --seed $seed --raw --prompt '<｜end▁of▁sentence｜>' --repetition-penalty 0.0001 \
    --max-new 4 --json --ids
  "$py" - "$tmp/out" <<'PY' || fail "EOS run, seed $seed: end inconsistent with the ids"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["prompt_ids"] == [1] and j["prompt_format"] == "raw text"
if j["end"] == "eos": assert j["tokens"][-1] == 1 and 1 not in j["tokens"][:-1]
else: assert j["end"] == "max-new" and 1 not in j["tokens"] and len(j["tokens"]) == 4
PY
  if [ "$(field "$tmp/out" "j['end']")" = eos ]; then eos_seen=$((eos_seen + 1)); break; fi
done
[ $eos_seen -ge 1 ] || fail "no weights seed of 8 ended by EOS (the penalty raises a positive EOS logit 1e4-fold)"
"$cedar" run --plan $plan --seed $seed --raw --prompt '<｜end▁of▁sentence｜>' --repetition-penalty 0.0001 \
  --max-new 4 > "$tmp/out" || fail "EOS run (text)"
grep -q "ended by EOS (id 1)" "$tmp/out" || fail "the report does not say EOS ended it: $(grep prompt "$tmp/out")"
echo "ok: EOS ends generation (weights seed $seed)"

# 5. Sampling: top-k 1 = greedy; seeds; penalty 1 = off.
tokens() { field "$tmp/out" "j['tokens']"; }
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json
greedy=$(tokens)
fp=$(field "$tmp/out" "j['weights_fingerprint']")
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --temperature 1.5 --top-k 1 --sample-seed 3
[ "$(tokens)" = "$greedy" ] || fail "--top-k 1 must equal greedy: $(tokens) vs $greedy"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --repetition-penalty 1
[ "$(tokens)" = "$greedy" ] || fail "--repetition-penalty 1 must be off"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --repetition-penalty 1.8
pen=$(tokens)
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --repetition-penalty 1.8
[ "$(tokens)" = "$pen" ] || fail "the penalty is not deterministic"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --temperature 1.2 --top-k 40 --sample-seed 7
a=$(tokens)
[ "$(field "$tmp/out" "j['weights_fingerprint']")" = "$fp" ] || fail "--sample-seed changed the weights"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --temperature 1.2 --top-k 40 --sample-seed 7
[ "$(tokens)" = "$a" ] || fail "the same --sample-seed must give the same ids"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 12 --json --temperature 1.2 --top-k 40 --sample-seed 8
[ "$(tokens)" != "$a" ] || fail "another --sample-seed gave the same 12 ids"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 2 --json --ids
[ "$(field "$tmp/out" "j['prompt_ids']")" = "[5, 6, 7, 8]" ] || fail "--ids with --tokens: no prompt_ids"
expect_exit 0 run --plan $plan --tokens 5,6,7,8 --max-new 2 --ids
grep -q "^prompt 4 tokens: 5 6 7 8; generated 2:" "$tmp/out" || fail "--ids with --tokens: $(grep prompt "$tmp/out")"
echo "ok: top-k 1 = greedy, seeds, penalty"

# 6. Refusals.
start=$(date +%s)
expect_exit 1 run --prompt "Hi"
grep -q "vocab is 512" "$tmp/err" && grep -q "128815 ids" "$tmp/err" && grep -q "128804" "$tmp/err" ||
  fail "the oversize prompt's refusal does not name both sizes: $(cat "$tmp/err")"
[ $(($(date +%s) - start)) -lt 20 ] || fail "the refusal came after the weights"
mkdir "$tmp/tk" && cp "$tj" "$tmp/tk/tokenizer.json"
expect_exit 1 run --plan $plan --tokenizer "$tmp/tk/tokenizer.json" --prompt "Hi" --max-new 1
grep -q "no tokenizer_config.json" "$tmp/err" || fail "no config: $(cat "$tmp/err")"
expect_exit 0 run --plan $plan --tokenizer "$tmp/tk/tokenizer.json" --raw --prompt "Hi" --max-new 2
# a P/D plan samples with top-k as one process does (tests/cli/pd_sample.sh: bitwise, every option)
expect_exit 0 run --plan tests/plans/pd-tiny-40.yaml --tokens 1,2 --temperature 1 --top-k 3 --max-new 4
pd=$(grep '^prompt' "$tmp/out")
expect_exit 0 run --plan tests/oracle/plans/tiny-40.yaml --tokens 1,2 --temperature 1 --top-k 3 --max-new 4
[ "$pd" = "$(grep '^prompt' "$tmp/out")" ] || fail "P/D + top-k: other tokens than one process"
expect_exit 2 run --raw --tokens 1
expect_exit 2 run --plan $plan --prompt x --raw --system s
expect_exit 2 run --plan $plan --tokens 1 --top-k 3
expect_exit 2 run --plan $plan --tokens 1 --repetition-penalty 0
expect_exit 2 run --plan $plan --tokens 1 --stop x
expect_exit 2 run --plan $plan --prompt x --stop ""
expect_exit 0 run --help
for opt in --prompt --raw --system --stop --ids --top-k --repetition-penalty --sample-seed; do
  grep -q -- "$opt" "$tmp/out" || fail "--help does not mention $opt"
done
expect_exit 0 tokenize --help
grep -q -- "--chat" "$tmp/out" || fail "tokenize --help does not mention --chat"
expect_exit 2 tokenize --system s x
expect_exit 2 detokenize --chat 1
echo "run_text: ok"

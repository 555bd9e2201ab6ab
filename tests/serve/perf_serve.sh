#!/usr/bin/env bash
# perf_serve.sh: cedar serve's streamed latency against serve-sim's on the
# same workload, in one run (issue 27's goals; docs/PERF.md "cedar serve").
# Not a ctest (it times things); every wait is bounded.
#
#   bash tests/serve/perf_serve.sh build/cedar [PLAN] [STREAMS] [PROMPT_LEN] [MAX_NEW]
#   (defaults: plans/v41-mini.yaml 64 32 32; BATCH="--chunk C --step-tokens T" goes to both sides)
#
# 0. one workload for both sides: a trace of S prompts of L random ids, all
#    at time 0, max_new M (the same ids, so the same tokens and experts);
# 1. `cedar serve-sim --max-batch S --trace T --no-cache`: the engine with
#    no HTTP; run again after step 2, so the drift between two runs of the
#    same thing (the noise floor on a shared machine) is printed beside the
#    overhead;
# 2. `cedar serve --max-batch S --no-cache` on a free loopback port and
#    `cedar bench serve --trace T --concurrency S` against it (the same
#    requests, sent at once, greedy): TTFT, TPOT and ITL as the client
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
read -r -a batch <<<"${BATCH:-}"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# the workload, as a trace both sides read: S prompts of L random ids below 256, all at time 0
"$py" -c "
import json, random, sys
rng = random.Random(1)
for i in range($S):
    print(json.dumps({'arrival_s': 0, 'tokens': [rng.randrange(256) for _ in range($L)], 'max_new': $M}))
" >"$tmp/trace.jsonl"
sim() {
  timeout 1800 "$cedar" serve-sim --plan "$plan" --max-batch "$S" --trace "$tmp/trace.jsonl" \
    --no-cache ${batch[@]+"${batch[@]}"} --json | tail -1 >"$1"
}
sim "$tmp/sim.json"

"$cedar" serve --plan "$plan" --port 0 --port-file "$tmp/port" --no-cache --max-batch "$S" --max-waiting $((4 * S)) \
  --max-tokens $((M > 16 ? M : 16)) ${batch[@]+"${batch[@]}"} --quiet >"$tmp/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do [ -s "$tmp/port" ] && break; kill -0 "$pid" 2>/dev/null || { cat "$tmp/serve.log"; exit 1; }; sleep 0.1; done
url=http://127.0.0.1:$(cat "$tmp/port")
curl -s "$url/metrics" >"$tmp/m0"
rc=0
timeout 1800 "$cedar" bench serve --url "$url" --trace "$tmp/trace.jsonl" --concurrency "$S" --timeout-s 1700 --json >"$tmp/http.jsonl" 2>"$tmp/http.err" || rc=$?
curl -s "$url/metrics" >"$tmp/m1"
kill -TERM "$pid"
wait "$pid" || true
pid=
[ "$rc" = 0 ] || echo "bench serve exited $rc: $(head -5 "$tmp/http.err")"
sim "$tmp/sim2.json" # serve-sim again after: how far two runs of the same thing drift here (the noise floor)

"$py" - "$tmp" "$plan" "$S" "$L" "$M" "${BATCH:-}" <<'EOF'
import json, sys
tmp, plan, S, L, M = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
sim = json.load(open(f"{tmp}/sim.json"))["totals"]
sim2 = json.load(open(f"{tmp}/sim2.json"))["totals"]
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
print(f"workload: {S} streams sent at once, prompts of {L} tokens, max_tokens {M}, greedy, no prefix cache; plan {plan}"
      f"{'; ' + sys.argv[6] if sys.argv[6] else ''}")
print("| side | TTFT p50 | TPOT mean | ITL p50 | ITL p99 | p99/p50 | output tokens | errors |")
print("|---|---|---|---|---|---|---|---|")
for name, t in (("serve-sim (no HTTP), before", sim), (f"cedar serve + bench serve, {S} SSE streams", http),
                ("serve-sim (no HTTP), after", sim2)):
    print(f"| {name} | {t['p50_ttft_ms']:,.1f} ms | {t['mean_tpot_ms']:,.2f} ms | {t['median_itl_ms']:,.2f} ms | "
          f"{t['p99_itl_ms']:,.2f} ms | {t['p99_itl_ms'] / t['median_itl_ms']:.2f} | {t['total_output_tokens']:.0f} | "
          f"{t['failed']:.0f} |")
print(f"the server's own ITL over the same run (/metrics, engine clock): mean {srv_itl:.2f} ms over {n:.0f} gaps")
ref = (sim["mean_tpot_ms"] + sim2["mean_tpot_ms"]) / 2
print(f"overhead per token against serve-sim (TPOT means, serve-sim's two runs averaged): "
      f"{100 * (http['mean_tpot_ms'] / ref - 1):+.2f}%; the two serve-sim runs differ by "
      f"{100 * abs(sim['mean_tpot_ms'] - sim2['mean_tpot_ms']) / ref:.2f}% (the noise floor of this comparison)")
print(f"HTTP delivery inside the same run (client TPOT mean over the server's ITL mean): "
      f"{100 * (http['mean_tpot_ms'] / srv_itl - 1):+.2f}%")
EOF

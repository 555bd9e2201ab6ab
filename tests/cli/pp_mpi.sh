#!/usr/bin/env bash
# pp_mpi.sh: layer stages on 2, 3 and 4 StarPU-MPI ranks (runtime/dist/pipeline.h,
# `mpirun -np N cedar run --plan P` with serving.placement.stages).
#
#  1. tiny-40 on 2 stages (StarPU executor, one worker a rank), 3 stages
#     whose ranks are out of layer order and 4 stages with a boundary at the
#     encoder/decoder cut (direct executor): rank 0 prints the one report,
#     with the pipeline section (through StarPU-MPI, busy time per rank);
#     each rank's --dump (DUMP, DUMP.rankN) equals the one-process dump of
#     the plan without stages bitwise in every tensor of the layers that
#     rank holds, and in the logits, positions and tokens (pp_cmp.py);
#  2. plans/v41-mini-pp2.yaml (the shipped plan) the same on 2 ranks, --json;
#  3. mpirun -np 1 is refused naming both numbers (needs 2, gave 1);
#  4. a transfer a rank never sends (CEDAR_PIPE_TEST_FAULT=hold): the
#     receiver fails the request once nothing came for CEDAR_PD_DEADLINE_S,
#     naming the node, and the job ends (exit != 0), never hangs;
#  5. a rank dying mid-step (CEDAR_PIPE_TEST_FAULT=die:R:K: rank R SIGKILLs
#     itself at its K-th transfer, R cycling from a random rank, K random;
#     CEDAR_PP_KILLS runs, default 3) under --mca orte_enable_recovery 1, so Open MPI does not end
#     the job for us: every other rank fails the request on its own within
#     the deadline (CEDAR_PD_DEADLINE_S=10) and exits non-zero, naming the
#     deadline; none hangs (the end of a request meets every rank with a
#     deadline before StarPU-MPI's shutdown barrier, which has none);
#  6. a rank killed from outside (SIGKILL by pid) under plain mpirun: the job
#     ends, no hang;
#  7. layer stages cut inside KV readers' groups (pp3kv-tiny-40: L8's
#     entries to rank 1, L20's to rank 2) on 3 ranks, direct and StarPU,
#     bitwise as in 1, the KV bytes reported;
#  8. --trace under mpirun (StarPU, one worker a rank): one Chrome trace with
#     a process per rank and a transfer flow per transfer message
#     (trace_check.py: the rules Perfetto and speedscope apply; the count
#     from --json), readable by `cedar view`; --json carries the bubbles
#     (efficiency + bubble fraction = 1, the ideal C / (C + S - 1)) and the
#     KV bytes shipped, equal to `plan cost --per-rank`'s kv_ship_bytes.
# Every mpirun runs under `timeout`, so a hang fails the test. Skips (77)
# where mpirun is missing or cedar was built without StarPU-MPI.
# Run from the repository root: bash tests/cli/pp_mpi.sh build/cedar (~3-5 min).
set -euo pipefail
cedar=${1:?usage: pp_mpi.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
export CEDAR_PD_DEADLINE_S=60
mpi() { timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe "$@"; }
ids() { local out="" i; for ((i = 1; i <= $1; i++)); do out+="${out:+,}$(( (i * $2 + 5) % 97 ))"; done; echo "$out"; }
toks37=$(ids 37 7); toks101=$(ids 101 13)
common=(--tokens "$toks37" --chunk 16 --max-new 4) # tiny-40's vocab (97) takes ids, not bytes
T40=tests/oracle/plans/tiny-40.yaml

"$cedar" run --plan $T40 "${common[@]}" --dump "$tmp/one.st" > "$tmp/one.txt"
tok_one=$(grep '^prompt' "$tmp/one.txt")

# run NP PLAN EXECUTOR LAYERS...: mpirun, one report, the dumps against one process
run() {
  local np=$1 plan=$2 ex=$3; shift 3
  local rc=0
  local w=(); [ "$ex" = starpu ] && w=(--workers 1) # one StarPU worker a rank
  mpi -np "$np" "$cedar" run --plan "$plan" "${common[@]}" --executor "$ex" "${w[@]}" --dump "$tmp/pp$np.st" \
    > "$tmp/pp$np.txt" 2> "$tmp/pp$np.err" || rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$tmp/pp$np.err" >&2; fail "mpirun -np $np timed out (a hang)"; }
  [ "$rc" -eq 0 ] || { cat "$tmp/pp$np.err" >&2; fail "mpirun -np $np $plan: exit $rc"; }
  if grep -q "in one process" "$tmp/pp$np.txt"; then
    echo "skipped: this cedar was built without StarPU-MPI: the stages ran in one process"
    exit 77
  fi
  [ "$(grep -c '^prompt 37 tokens; generated' "$tmp/pp$np.txt")" -eq 1 ] || { cat "$tmp/pp$np.txt"; fail "want one report"; }
  grep -q "^pipeline: .* stages on $np ranks, through StarPU-MPI" "$tmp/pp$np.txt" || { cat "$tmp/pp$np.txt"; fail "no pipeline line"; }
  grep -q "agrees: global" "$tmp/pp$np.txt" || { cat "$tmp/pp$np.txt"; fail "the gathered global entries disagree with the plan"; }
  [ "$(grep '^prompt' "$tmp/pp$np.txt")" = "$tok_one" ] || fail "$np ranks: tokens differ from one process"
  local args=() r=0
  for layers in "$@"; do
    if [ "$r" -eq 0 ]; then args+=("$tmp/pp$np.st:$layers"); else args+=("$tmp/pp$np.st.rank$r:$layers"); fi
    r=$((r + 1))
  done
  "$py" tests/cli/pp_cmp.py "$tmp/one.st" "${args[@]}" || fail "$np ranks ($plan, $ex) differ from one process"
}

# 1. 2, 3 and 4 ranks (LAYERS in rank order)
run 2 tests/plans/pp2-tiny-40.yaml starpu 0-13 14-39
run 3 tests/plans/pp3-tiny-40.yaml direct 8-13 14-39 0-7
run 4 tests/plans/pp4-tiny-40.yaml direct 0-7 8-13 14-19 20-39
grep -q "rank 3: prefill busy" "$tmp/pp4.txt" || { cat "$tmp/pp4.txt"; fail "no busy time of rank 3"; }

# 2. the shipped plan, --json
rc=0
mpi -np 2 "$cedar" run --plan plans/v41-mini-pp2.yaml --prompt-len 37 --chunk 16 --max-new 3 --executor direct --json \
  > "$tmp/v.json" 2> "$tmp/v.err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/v.err" >&2; fail "v41-mini-pp2: exit $rc"; }
"$py" - "$tmp/v.json" <<'PY' || fail "v41-mini-pp2 --json"
import json, sys
j = json.load(open(sys.argv[1]))
p = j["pipeline"]
assert p["via"] == "starpu-mpi" and p["stages"] == 2 and p["ranks"] == 2, p
assert p["act_bytes_prefill"] > 0 and len(p["rank"]) == 2, p
assert all(r["prefill_busy_s"] > 0 for r in p["rank"]), p
PY

# 3. fewer ranks than the placement names
rc=0
mpi -np 1 "$cedar" run --plan tests/plans/pp2-tiny-40.yaml --tokens 1,2,3 --max-new 1 > /dev/null 2> "$tmp/np1.err" || rc=$?
[ "$rc" -ne 0 ] || fail "mpirun -np 1 ran a 2-rank placement"
grep -q "needs 2 ranks, but mpirun gave 1" "$tmp/np1.err" || { cat "$tmp/np1.err"; fail "the refusal names both numbers"; }
grep -q "pp2-tiny-40.yaml:9:" "$tmp/np1.err" || { cat "$tmp/np1.err"; fail "the refusal names the stage's place"; }

# 4. a transfer never sent: the receiver fails within the deadline
rc=0
start=$(date +%s)
CEDAR_PD_DEADLINE_S=5 mpi -x CEDAR_PD_DEADLINE_S -x CEDAR_PIPE_TEST_FAULT=hold -np 2 "$cedar" run --plan tests/plans/pp2-tiny-40.yaml \
  "${common[@]}" --executor direct > /dev/null 2> "$tmp/hold.err" || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "a held transfer hung the job"
[ "$rc" -ne 0 ] || fail "a held transfer: the job succeeded"
# rank 1 waits for rank 0's held activations; under key_slot: vendor rank 0 also waits every step for the
# slot source L20's new entry from rank 1 (graph_place.c: key_copies_whole), which rank 1 holds: either
# deadline may end the job first
grep -Eq "nothing arrived from rank [01] for 5 s" "$tmp/hold.err" || { cat "$tmp/hold.err"; fail "no deadline message"; }
[ $(( $(date +%s) - start )) -lt 120 ] || fail "the held transfer took over 120 s to fail"

# 5. a rank dies mid-step; the others fail on their own within the deadline
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
kills=${CEDAR_PP_KILLS:-3}
first=$RANDOM # the dying rank cycles from a random one, so three runs see three ranks die
for ((i = 0; i < kills; i++)); do
  who=$(( (first + i) % 4 )) k=$((1 + RANDOM % 60)) d=$tmp/die$i
  mkdir -p "$d"
  t0=$(date +%s) rc=0
  CEDAR_PD_DEADLINE_S=10 timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe --mca orte_enable_recovery 1 \
    -x CEDAR_PD_DEADLINE_S -x CEDAR_PIPE_TEST_FAULT="die:$who:$k" -np 4 \
    bash -c '"$@"; echo $? > '"$d"'/rc.$OMPI_COMM_WORLD_RANK' _ "$cedar" run --plan tests/plans/pp4-tiny-40.yaml \
    --tokens "$toks101" --chunk 7 --max-new 40 --executor direct > /dev/null 2> "$d/err" || rc=$?
  secs=$(( $(date +%s) - t0 ))
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { tail -20 "$d/err" >&2; fail "die:$who:$k: the job hung (timeout)"; }
  grep -q "kills itself (SIGKILL) at message $k" "$d/err" || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $who did not die"; }
  for r in 0 1 2 3; do
    [ "$r" -eq "$who" ] && continue
    # a rank that failed on its own and then called MPI_Abort (a message
    # still posted) ends the job: Open MPI kills the ranks still running,
    # which may have printed why they failed, or may still have been inside
    # a wait whose deadline started later (a rank upstream of the dead one
    # posts its send after the downstream rank posted its receive: under
    # ASan on 2 cores CI saw rank 1 ended so, 2026-12-02). What holds: no
    # rank reports success, and a rank without an exit status was ended by
    # an abort that a rank's own deadline started (checked below).
    if [ -f "$d/rc.$r" ]; then
      [ "$(cat "$d/rc.$r")" -ne 0 ] || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $r reported success"; }
    else
      grep -q "MPI_ABORT was invoked" "$d/err" && grep -q "cedar: error: rank [0-9]*: .*ending the job" "$d/err" \
        || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $r never ended, and no rank's own failure ended the job"; }
    fi
  done
  grep -q "for 10 s (CEDAR_PD_DEADLINE_S)\|did not complete in 10 s\|did not end the request" "$d/err" \
    || { tail -20 "$d/err" >&2; fail "die:$who:$k: no rank named the deadline"; }
  [ "$secs" -lt 120 ] || fail "die:$who:$k: the others took $secs s to fail"
  echo "rank $who died at its transfer $k: every other rank failed on its own, the job ended in $secs s"
done

# 6. a rank killed from outside (by its pid) under plain mpirun: the job ends, nobody hangs
# (the smaller form, CEDAR_TEST_SMALL=1 in the ASan build: the last rank only)
whos="1 3"; [ "${CEDAR_TEST_SMALL:-0}" = 1 ] && whos="3"
for who in $whos; do
  rm -f "$tmp"/pid.*
  rc=0
  ( mpi -np 4 bash -c 'echo $$ > '"$tmp"'/pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' "$cedar" run \
      --plan tests/plans/pp4-tiny-40.yaml --tokens "$toks101" --chunk 7 --max-new 400 --executor direct > /dev/null 2> "$tmp/kill.err" ) &
  job=$!
  i=0; while [ ! -f "$tmp/pid.$who" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
  # a random moment 0.5-1.4 s in; 400 decode steps keep the job running past it on an idle machine
  # (40 ended first there: "finished before it could be killed")
  sleep "$(( RANDOM % 2 )).$(( 5 + RANDOM % 5 ))"
  [ -f "$tmp/pid.$who" ] || fail "rank $who never started"
  kill -9 "$(cat "$tmp/pid.$who")" 2> /dev/null || fail "rank $who finished before it could be killed"
  t0=$(date +%s); wait "$job" || rc=$?
  # 137 is also mpirun's exit when a rank died of SIGKILL: a hang is the timeout's 124, or taking 60 s
  [ "$rc" -ne 124 ] && [ "$(( $(date +%s) - t0 ))" -lt 60 ] || { tail -20 "$tmp/kill.err" >&2; fail "rank $who killed: the job hung (exit $rc)"; }
  [ "$rc" -ne 0 ] || fail "rank $who killed: the job reported success"
  echo "rank $who killed: the job ended in $(( $(date +%s) - t0 )) s (exit $rc)"
done

# 7. KV readers in another stage
run 3 tests/plans/pp3kv-tiny-40.yaml direct 0-10 11-22 23-39
grep -q "KV entries shipped to reader stages: prefill [1-9]" "$tmp/pp3.txt" || { cat "$tmp/pp3.txt"; fail "pp3kv: no KV bytes shipped"; }
run 3 tests/plans/pp3kv-tiny-40.yaml starpu 0-10 11-22 23-39

# 8. one trace for every rank, the bubbles in --json
rc=0
mpi -np 3 "$cedar" run --plan tests/plans/pp3kv-tiny-40.yaml "${common[@]}" --executor starpu --workers 1 \
  --trace "$tmp/t.json" --json > "$tmp/t.out" 2> "$tmp/t.err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/t.err" >&2; fail "mpirun --trace: exit $rc"; }
xfers=$("$py" - "$tmp/t.out" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["pipeline"]
assert p["ranks"] == 3 and p["chunks"] == 3, p
assert 0 < p["prefill_efficiency"] <= 1 and abs(p["prefill_efficiency"] + p["prefill_bubble_fraction"] - 1) < 1e-12, p
assert abs(p["ideal_efficiency"] - 3 / (3 + 3 - 1)) < 1e-12 and abs(p["ideal_bubble_fraction"] - 0.4) < 1e-12, p
assert p["kv_bytes_prefill"] > 0 and p["kv_bytes_decode"] > 0, p
assert all(0 <= r["prefill_idle_fraction"] < 1 for r in p["rank"]), p
assert p["transfers"] == sum(r["messages"] for r in p["rank"]) > 0, p
print(p["transfers"])
PY
) || fail "--json pipeline figures"
"$cedar" plan cost tests/plans/pp3kv-tiny-40.yaml --per-rank --tokens 37 --json > "$tmp/pc.json" || fail "plan cost --per-rank"
"$py" - "$tmp/t.out" "$tmp/pc.json" <<'PY' || fail "the KV bytes shipped differ from plan cost --per-rank"
import json, sys
run, pc = json.load(open(sys.argv[1]))["pipeline"], json.load(open(sys.argv[2]))
want = sum(r["kv_ship_bytes"] for r in pc["ranks"])
assert run["kv_bytes_prefill"] == want > 0, (run["kv_bytes_prefill"], want)
PY
"$py" tests/cli/trace_check.py "$tmp/t.json" --ranks 3 --transfers "$xfers" || fail "the pipeline trace (above)"
"$cedar" view "$tmp/t.json" -o "$tmp/t.html" > /dev/null || fail "cedar view cannot read the pipeline trace"
echo "pp_mpi: ok"

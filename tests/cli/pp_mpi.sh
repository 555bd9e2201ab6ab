#!/usr/bin/env bash
# pp_mpi.sh: layer stages on 2, 3 and 4 StarPU-MPI ranks (runtime/pipeline.h,
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
#  5. a rank killed mid-request: the job ends, no hang.
# Every mpirun runs under `timeout`, so a hang fails the test. Skips (77)
# where mpirun is missing or cedar was built without StarPU-MPI.
# Run from the repository root: bash tests/cli/pp_mpi.sh build/cedar (~1-2 min).
set -euo pipefail
cedar=${1:?usage: pp_mpi.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ldd "$cedar" 2>/dev/null | grep libasan > /dev/null; then # as pd_mpi.sh: Open MPI's own leaks suppressed
  export OMPI_MCA_mca_base_component_disable_dlclose=1
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan-openmpi.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
fi
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
grep -q "nothing arrived from rank 0 for 5 s" "$tmp/hold.err" || { cat "$tmp/hold.err"; fail "no deadline message"; }
[ $(( $(date +%s) - start )) -lt 120 ] || fail "the held transfer took over 120 s to fail"

# 5. a rank killed mid-request (by its pid): the job ends, nobody hangs
for who in 1 3; do
  rm -f "$tmp"/pid.*
  rc=0
  ( mpi -np 4 bash -c 'echo $$ > '"$tmp"'/pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' "$cedar" run \
      --plan tests/plans/pp4-tiny-40.yaml --tokens "$toks101" --chunk 7 --max-new 40 --executor direct > /dev/null 2> "$tmp/kill.err" ) &
  job=$!
  i=0; while [ ! -f "$tmp/pid.$who" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
  sleep $(( 1 + RANDOM % 2 ))
  [ -f "$tmp/pid.$who" ] || fail "rank $who never started"
  kill -9 "$(cat "$tmp/pid.$who")" 2> /dev/null || fail "rank $who finished before it could be killed"
  t0=$(date +%s); wait "$job" || rc=$?
  # 137 is also mpirun's exit when a rank died of SIGKILL: a hang is the timeout's 124, or taking 60 s
  [ "$rc" -ne 124 ] && [ "$(( $(date +%s) - t0 ))" -lt 60 ] || { tail -20 "$tmp/kill.err" >&2; fail "rank $who killed: the job hung (exit $rc)"; }
  [ "$rc" -ne 0 ] || fail "rank $who killed: the job reported success"
  echo "rank $who killed: the job ended in $(( $(date +%s) - t0 )) s (exit $rc)"
done
echo "pp_mpi: ok"

#!/usr/bin/env bash
# pd_faults.sh: P/D faults under `mpirun -np 2` (runtime/dist/pd_run.c, runtime/comm/comm_mpi.c),
# on the tiny P/D plan (tests/plans/pd-tiny-40.yaml: seconds a run).
#
# Open MPI runs with --mca orte_enable_recovery 1, so a rank that dies does
# not take the other down with it: what each rank does alone is what is
# checked. Each rank's exit status is recorded by a wrapper shell.
#
#  1. P killed mid-transfer, N runs (CEDAR_PD_KILLS, default 10; 50 for the
#     issue's count) at a random message K of the package (the test fault
#     p-dies:K: P SIGKILLs itself as it posts its K-th message, K uniform in
#     1..messages + 1, the last being "before the record"): D fails the
#     request with the stall message naming the first missing message
#     within the deadline (CEDAR_PD_DEADLINE_S=10; the ranks meet before it counts) plus a margin, says it
#     freed the request with no KV pages left in use, and exits 1 (MPI_Abort:
#     StarPU-MPI cannot cancel a posted receive); never hangs, never exits 0.
#     The runs go in batches of CEDAR_PD_BATCH (default 4) at once.
#  2. D killed after K messages arrived (d-dies:K), 3 runs: P notices (no
#     answer from D within the deadline), frees the request (its pages
#     returned, none in use) and exits 1.
#  3. A corrupt package (a KV message's byte flipped after its checksum) and
#     a truncated one (the first KV message sent cut to half): D refuses it
#     naming the checksum, answers P, and both exit 1 cleanly (no abort);
#     P says D refused it and frees the request.
# Every mpirun runs under `timeout`. Under `make asan` Open MPI's own
# allocations are suppressed as in pd_mpi.sh and cedar's are reported (the
# clean exits of 3 run LeakSanitizer; an MPI_Abort does not).
# Skips (77) where mpirun is missing or cedar has no StarPU-MPI.
# Run from the repository root: bash tests/cli/pd_faults.sh build/cedar
set -euo pipefail
cedar=${1:?usage: pd_faults.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
export CEDAR_PD_DEADLINE_S=10
kills=${CEDAR_PD_KILLS:-10}
batch=${CEDAR_PD_BATCH:-4}
plan=tests/plans/pd-tiny-40.yaml
toks=$(seq 0 36 | awk '{printf "%s%d", (NR > 1 ? "," : ""), ($1 * 37 + 11) % 97}')
args=(run --plan "$plan" --tokens "$toks" --chunk 16 --max-new 4 --workers 1)

# one job: fault $1 in directory $2; each rank's exit status in $2/rc.RANK, output in $2/out
job() {
  mkdir -p "$2"
  local t0; t0=$(date +%s)
  timeout -k 5 120 mpirun --mca orte_enable_recovery 1 -x CEDAR_PD_DEADLINE_S -x CEDAR_PD_TEST_FAULT="$1" -np 2 \
    bash -c '"$@"; echo $? > '"$2"'/rc.$OMPI_COMM_WORLD_RANK' _ "$cedar" "${args[@]}" > "$2/out" 2>&1 || echo $? > "$2/timeout"
  echo $(( $(date +%s) - t0 )) > "$2/secs"
}

# a clean run first: the plan runs, and how many messages its package has
"$cedar" plan check "$plan" > /dev/null || fail "$plan does not load"
mpirun -np 2 "$cedar" "${args[@]}" > "$tmp/ok.txt" 2> "$tmp/ok.err" || { cat "$tmp/ok.err" >&2; fail "a clean P/D run failed"; }
if grep -q "in one process" "$tmp/ok.txt"; then
  echo "skipped: this cedar was built without StarPU-MPI: both ranks ran locally"; exit 77
fi
msgs=$(sed -n 's/^  moved \([0-9]*\) messages:.*/\1/p' "$tmp/ok.txt")
[ -n "$msgs" ] || { cat "$tmp/ok.txt"; fail "no message count in the clean run's report"; }
xfer=$((msgs - 2)) # the record and the logits follow the transfer messages

# ---- 1. P killed at a random message ------------------------------------------
t_all=$(date +%s)
worst=0
for ((i = 0; i < kills; i += batch)); do
  for ((j = i; j < i + batch && j < kills; j++)); do
    k=$((1 + RANDOM % (xfer + 1)))
    echo "$k" > "$tmp/k.$j"
    job "p-dies:$k" "$tmp/p$j" &
  done
  wait
done
for ((j = 0; j < kills; j++)); do
  d=$tmp/p$j k=$(cat "$tmp/k.$j")
  [ ! -f "$d/timeout" ] || { cat "$d/out" >&2; fail "run $j (P dies at message $k): mpirun hit its timeout (a hang)"; }
  [ "$(cat "$d/rc.0" 2> /dev/null)" = 137 ] || { cat "$d/out" >&2; fail "run $j: P did not die (rc $(cat "$d/rc.0" 2> /dev/null))"; }
  rc1=$(cat "$d/rc.1" 2> /dev/null || echo none)
  [ "$rc1" != 0 ] && [ "$rc1" != none ] || { cat "$d/out" >&2; fail "run $j (P dies at message $k): D exit $rc1, want a failure"; }
  grep -q "the P->D transfer stalled: no message for 10 s (CEDAR_PD_DEADLINE_S): [0-9]* of [0-9]* messages arrived, first missing: " "$d/out" ||
    { cat "$d/out" >&2; fail "run $j (P dies at message $k): no stall message from D"; }
  grep -q "D freed the request: [0-9]* KV pages returned, 0 still in use" "$d/out" ||
    { cat "$d/out" >&2; fail "run $j: D did not say it freed the request"; }
  s=$(cat "$d/secs")
  [ "$s" -gt "$worst" ] && worst=$s
done
# a run is start-up + the prefill up to K + the deadline + MPI_Abort; 90 s bounds it on a loaded machine
[ "$worst" -lt 90 ] || fail "a run with P killed took ${worst} s"
echo "P killed at a random message, $kills runs ($batch at once): D failed each within the deadline," \
  "freed the request, exited non-zero; slowest run ${worst} s, all in $(( $(date +%s) - t_all )) s"

# ---- 2. D killed --------------------------------------------------------------------
for ((j = 0; j < 3; j++)); do job "d-dies:$((1 + RANDOM % xfer))" "$tmp/d$j" & done
wait
for ((j = 0; j < 3; j++)); do
  d=$tmp/d$j
  [ ! -f "$d/timeout" ] || { cat "$d/out" >&2; fail "D killed: mpirun hit its timeout (a hang)"; }
  [ "$(cat "$d/rc.1" 2> /dev/null)" = 137 ] || { cat "$d/out" >&2; fail "D killed: D did not die"; }
  [ "$(cat "$d/rc.0" 2> /dev/null)" = 1 ] || { cat "$d/out" >&2; fail "D killed: P exit $(cat "$d/rc.0" 2> /dev/null), want 1"; }
  grep -q "the decode rank stopped taking the package: nothing completed for 10 s.*P freed the request: [0-9]* KV pages returned, 0 still in use" "$d/out" ||
    { cat "$d/out" >&2; fail "D killed: P did not notice and free the request"; }
done
echo "D killed at a random message, 3 runs: P noticed within the deadline, freed the request, exited 1"

# ---- 3. a corrupt and a truncated package --------------------------------------------
for f in corrupt truncate; do
  d=$tmp/$f
  job "$f" "$d"
  [ ! -f "$d/timeout" ] || { cat "$d/out" >&2; fail "$f: a hang"; }
  [ "$(cat "$d/rc.0" 2> /dev/null)" = 1 ] && [ "$(cat "$d/rc.1" 2> /dev/null)" = 1 ] ||
    { cat "$d/out" >&2; fail "$f: exits P $(cat "$d/rc.0" 2> /dev/null), D $(cat "$d/rc.1" 2> /dev/null); want 1 and 1"; }
  grep -q "^cedar run: xfer L[0-9]*.kv c0: the payload fails its checksum (XXH3); the package is refused" "$d/out" ||
    { cat "$d/out" >&2; fail "$f: D did not refuse it by its checksum"; }
  grep -q "^cedar run: the decode rank refused the package: .*checksum.*P freed the request: [0-9]* KV pages returned, 0 still in use" "$d/out" ||
    { cat "$d/out" >&2; fail "$f: P did not hear the refusal"; }
  ! grep -q "AddressSanitizer\|LeakSanitizer" "$d/out" || { cat "$d/out" >&2; fail "$f: sanitizer report"; }
done
echo "a corrupt and a truncated package over MPI: refused by checksum on D, P told, both exit 1"
echo "pd_faults: ok"

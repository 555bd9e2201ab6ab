#!/usr/bin/env bash
# pdx_mpi.sh: prefill (P) and decode (D) apart, combined with layer stages
# and with routed experts on ranks (runtime/dist/pd_stage.c; docs/placement.md,
# "P/D with stages and experts"), on 3 and 4 StarPU-MPI ranks.
#
#  1. one process (no mpirun): each combined plan runs every role here, its
#     --dump bitwise the plan without placement's (tiny-40), and the P/D
#     section says "in one process";
#  2. mpirun: stages + P/D on 3 ranks (P pipelined on 0-1, D on 2: two P
#     stages feed one decode home) and 4 ranks (P on 0-1, D on 2-3); experts
#     + P/D on 3 ranks (P 0, D 1, rank 2 a shard of both roles); stages +
#     experts + P/D on 4 ranks. Rank 0 prints the one report with the P/D
#     section (through StarPU-MPI, the bytes per class equal to the plan's
#     package) and the pipeline / experts sections; each rank's --dump
#     (DUMP, DUMP.rankN) equals the one-process dump bitwise in every tensor
#     of the layers it decodes, and in the logits, positions and tokens
#     (pp_cmp.py; a prefill rank holds no layer after the handoff); stages
#     + P/D on 4 ranks also on the StarPU executor, one worker a rank;
#  3. plans/v41-mini-pp2-pd.yaml (shipped) on 4 ranks, --json: the P/D,
#     pipeline (bubbles) sections;
#  4. a 4-rank placement under mpirun -np 3 is refused naming both numbers
#     and the place in the plan;
#  5. a corrupt KV message (CEDAR_PD_TEST_FAULT=corrupt: each prefill rank
#     flips a byte of its first KV message after its checksum): each decode
#     home refuses the package naming the checksum, every rank fails the
#     request and the job ends cleanly (exit 1, no MPI_Abort needed);
#  6. a rank killed mid-request (CEDAR_PIPE_TEST_FAULT=die:R:K, a prefill
#     rank and a decode rank in turn) under --mca orte_enable_recovery 1:
#     every other rank fails the request on its own within the deadline
#     (CEDAR_PD_DEADLINE_S=10), naming it; none hangs.
# Every mpirun runs under `timeout`, so a hang fails the test. Skips (77)
# where mpirun is missing or cedar was built without StarPU-MPI.
# Run from the repository root: bash tests/cli/pdx_mpi.sh build/cedar (~2-4 min).
set -euo pipefail
cedar=${1:?usage: pdx_mpi.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci}
ids() { local out="" i; for ((i = 1; i <= $1; i++)); do out+="${out:+,}$(( (i * $2 + 5) % 97 ))"; done; echo "$out"; }
toks37=$(ids 37 7); toks101=$(ids 101 13)
common=(--tokens "$toks37" --chunk 16 --max-new 4 --executor direct) # tiny-40's vocab (97) takes ids, not bytes
T40=tests/oracle/plans/tiny-40.yaml
P=tests/plans

"$cedar" run --plan $T40 "${common[@]}" --dump "$tmp/one.st" > "$tmp/one.txt"
tok_one=$(grep '^prompt' "$tmp/one.txt")

# 1. one process plays every role
for plan in pdpp3 pdpp4 pdep3 pdppep4; do
  "$cedar" run --plan $P/$plan-tiny-40.yaml "${common[@]}" --dump "$tmp/$plan.local.st" > "$tmp/$plan.local.txt" \
    || fail "$plan in one process"
  grep -q "^P/D: .* in one process (local copies)" "$tmp/$plan.local.txt" || { cat "$tmp/$plan.local.txt"; fail "$plan: no local P/D line"; }
  grep -q "the plan's package agrees" "$tmp/$plan.local.txt" || { cat "$tmp/$plan.local.txt"; fail "$plan: bytes disagree with the plan"; }
  [ "$(grep '^prompt' "$tmp/$plan.local.txt")" = "$tok_one" ] || fail "$plan in one process: tokens differ"
  "$py" tests/cli/pp_cmp.py "$tmp/one.st" "$tmp/$plan.local.st:0-39" > /dev/null || fail "$plan in one process differs"
done
echo "one process: every combined plan bitwise the plan without placement"

command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
export CEDAR_PD_DEADLINE_S=60
mpi() { timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe "$@"; }

# run NP PLAN LAYERS...: mpirun, one report, each rank's dump against one process
run() {
  local np=$1 plan=$2; shift 2
  local rc=0 out=$tmp/$plan.np$np a=("${common[@]}")
  [ -n "${SP:-}" ] && a=(--tokens "$toks37" --chunk 16 --max-new 4 --executor starpu --workers 1) # one worker a rank
  mpi -np "$np" "$cedar" run --plan "$P/$plan-tiny-40.yaml" "${a[@]}" --dump "$out.st" > "$out.txt" 2> "$out.err" || rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$out.err" >&2; fail "$plan -np $np timed out (a hang)"; }
  [ "$rc" -eq 0 ] || { cat "$out.err" >&2; fail "$plan -np $np: exit $rc"; }
  if grep -q "in one process" "$out.txt"; then
    echo "skipped: this cedar was built without StarPU-MPI: the roles ran in one process"
    exit 77
  fi
  [ "$(grep -c '^prompt 37 tokens; generated' "$out.txt")" -eq 1 ] || { cat "$out.txt"; fail "$plan: want one report"; }
  grep -q "^P/D: prefill on rank 0 cpu, decode on rank [0-9] cpu, through StarPU-MPI" "$out.txt" || { cat "$out.txt"; fail "$plan: no P/D line"; }
  grep -q "the plan's package agrees" "$out.txt" || { cat "$out.txt"; fail "$plan: the bytes moved disagree with the plan's package"; }
  [ "$(grep '^prompt' "$out.txt")" = "$tok_one" ] || fail "$plan -np $np: tokens differ from one process"
  local args=() r=0
  for layers in "$@"; do
    if [ "$r" -eq 0 ]; then args+=("$out.st:$layers"); else args+=("$out.st.rank$r:$layers"); fi
    r=$((r + 1))
  done
  "$py" tests/cli/pp_cmp.py "$tmp/one.st" "${args[@]}" || fail "$plan on $np ranks differs from one process"
}

# 2. stages + P/D, experts + P/D, both (LAYERS: what each rank decodes, in rank order)
run 3 pdpp3 - - 0-39
grep -q "^pipeline: 2 stages on 3 ranks, through StarPU-MPI" "$tmp/pdpp3.np3.txt" || { cat "$tmp/pdpp3.np3.txt"; fail "pdpp3: no pipeline line"; }
run 4 pdpp4 - - 0-13 14-39
SP=1 run 4 pdpp4 - - 0-13 14-39 # the StarPU executor (the experts run on the direct one under mpirun)
run 3 pdep3 - 0-39 -
grep -q "^experts: " "$tmp/pdep3.np3.txt" || { cat "$tmp/pdep3.np3.txt"; fail "pdep3: no experts section"; }
for r in 0 1 2; do # P's owner, D's owner (each computes its own shard) and the rank serving both
  grep -q "^  rank $r: [1-9][0-9]* rows" "$tmp/pdep3.np3.txt" || { cat "$tmp/pdep3.np3.txt"; fail "pdep3: rank $r computed no expert rows"; }
done
run 4 pdppep4 - - 0-13 14-39

# 3. the shipped plan, --json
rc=0
mpi -np 4 "$cedar" run --plan plans/v41-mini-pp2-pd.yaml --prompt-len 37 --chunk 16 --max-new 3 --executor direct --json \
  > "$tmp/v.json" 2> "$tmp/v.err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/v.err" >&2; fail "v41-mini-pp2-pd: exit $rc"; }
"$py" - "$tmp/v.json" <<'PY' || fail "v41-mini-pp2-pd --json"
import json, sys
j = json.load(open(sys.argv[1]))
p = j["pipeline"]
assert p["via"] == "starpu-mpi" and p["stages"] == 2 and p["ranks"] == 4, p
assert p["act_bytes_prefill"] > 0 and p["act_bytes_decode"] > 0 and len(p["rank"]) == 4, p
assert 0 < p["prefill_efficiency"] <= 1, p
d = j["transfer"]
assert d["via"] == "starpu-mpi" and d["agrees"] and d["bytes"]["global_kv"] == d["plan_bytes"]["global_kv"] > 0, d
print("P/D:", {k: d[k] for k in d if not isinstance(d[k], (dict, list))})
print("pipeline:", {k: p[k] for k in p if not isinstance(p[k], (dict, list))})
PY

# 4. fewer ranks than the placement names
rc=0
mpi -np 3 "$cedar" run --plan $P/pdpp4-tiny-40.yaml --tokens 1,2,3 --max-new 1 > /dev/null 2> "$tmp/np3.err" || rc=$?
[ "$rc" -ne 0 ] || fail "mpirun -np 3 ran a 4-rank placement"
grep -q "needs 4 ranks, but mpirun gave 3" "$tmp/np3.err" || { cat "$tmp/np3.err"; fail "the refusal names both numbers"; }
grep -q "pdpp4-tiny-40.yaml:[0-9]*:[0-9]*: serving.placement.stages\[1\].decode" "$tmp/np3.err" \
  || { cat "$tmp/np3.err"; fail "the refusal names the stage's decode home"; }

# 5. a corrupt package: refused on the decode homes, the request fails everywhere
rc=0
CEDAR_PD_DEADLINE_S=20 mpi -x CEDAR_PD_DEADLINE_S -x CEDAR_PD_TEST_FAULT=corrupt -np 4 "$cedar" run \
  --plan $P/pdpp4-tiny-40.yaml "${common[@]}" > /dev/null 2> "$tmp/corrupt.err" || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$tmp/corrupt.err" >&2; fail "a corrupt package hung the job"; }
[ "$rc" -ne 0 ] || fail "a corrupt package: the job succeeded"
grep -q "fails its checksum" "$tmp/corrupt.err" || { cat "$tmp/corrupt.err"; fail "no checksum refusal"; }
[ "$(grep -c "^cedar run: " "$tmp/corrupt.err")" -eq 4 ] || { cat "$tmp/corrupt.err"; fail "want every rank to fail the request"; }

# 6. a rank dies mid-request; the others fail on their own within the deadline
# (the smaller form, CEDAR_TEST_SMALL=1 in the ASan build: the decode rank only)
whos="1 3"; [ "${CEDAR_TEST_SMALL:-0}" = 1 ] && whos="3"
for who in $whos; do # a prefill rank (in the prefill) and a decode rank (in the decode)
  k=$((1 + RANDOM % 3)) d=$tmp/die$who
  mkdir -p "$d"
  t0=$(date +%s) rc=0
  CEDAR_PD_DEADLINE_S=10 timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe --mca orte_enable_recovery 1 \
    -x CEDAR_PD_DEADLINE_S -x CEDAR_PIPE_TEST_FAULT="die:$who:$k" -np 4 \
    bash -c '"$@"; echo $? > '"$d"'/rc.$OMPI_COMM_WORLD_RANK' _ "$cedar" run --plan $P/pdpp4-tiny-40.yaml \
    --tokens "$toks101" --chunk 7 --max-new 8 --executor direct > /dev/null 2> "$d/err" || rc=$?
  secs=$(( $(date +%s) - t0 ))
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { tail -20 "$d/err" >&2; fail "die:$who:$k: the job hung (timeout)"; }
  grep -q "kills itself (SIGKILL) at message $k" "$d/err" || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $who did not die"; }
  for r in 0 1 2 3; do
    [ "$r" -eq "$who" ] && continue
    if [ -f "$d/rc.$r" ]; then # (as pp_mpi.sh: a rank that failed may be ended by another's MPI_Abort)
      [ "$(cat "$d/rc.$r")" -ne 0 ] || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $r reported success"; }
    else
      grep -q "MPI_ABORT was invoked" "$d/err" || { tail -20 "$d/err" >&2; fail "die:$who:$k: rank $r never ended"; }
    fi
  done
  grep -q "10 s (CEDAR_PD_DEADLINE_S)\|did not complete in 10 s\|did not end the request" "$d/err" \
    || { tail -20 "$d/err" >&2; fail "die:$who:$k: no rank named the deadline"; }
  [ "$secs" -lt 120 ] || fail "die:$who:$k: the others took $secs s to fail"
  echo "rank $who died at its transfer $k: the others failed the request, the job ended in $secs s"
done
echo "pdx_mpi: ok"

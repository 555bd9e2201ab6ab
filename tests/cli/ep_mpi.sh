#!/usr/bin/env bash
# ep_mpi.sh: routed experts on 2, 3 and 4 StarPU-MPI ranks
# (runtime/dist/expert_par.h, `mpirun -np N cedar run --plan P` with
# serving.placement.experts).
#
#  0. `cedar graph show` of ep2's decode graph has, for a layer, the route,
#     a dispatch TRANSFER to rank 1, rank 1's shard, the combine TRANSFER
#     back and the sum, chained by edges (and no transfer to rank 0's own
#     shard);
#  1. without mpirun, tiny-40 with experts in 2 shards runs every shard in
#     this process: its --dump equals the plan without placement bitwise;
#  2. tiny-40 experts on 2 ranks and on 4 (named out of order): rank 0 (the
#     owner of every layer) dumps every tensor bitwise the one-process
#     plan's, each shard rank the logits, positions and tokens (ep_cmp.py);
#     rank 0 prints one report with the experts section through
#     StarPU-MPI, and its --json load figures (rows, expert-rows, dispatch
#     and combine bytes per rank) equal the one-process run's; each rank
#     holds only its shard's routed experts: their stored-format bytes
#     equal `plan cost --per-rank`'s experts of that rank;
#  3. both together: 2 stages whose ranks serve each other's experts (2
#     ranks), 2 stages plus an experts-only rank for layers 4-39 (3
#     ranks), and 2 stages on ranks 1-2 with one expert on each of 4 ranks
#     (rank 0, holding experts only, dumps rank 0's files): each stage's rank bitwise the one-process state of its layers
#     (pp_cmp.py), the experts-only rank the model-wide tensors; held
#     expert bytes equal the accounting on every rank;
#  4. plans/v41-mini-ep2.yaml (the shipped plan) on 2 ranks against
#     v41-mini in one process, --json;
#  5. the StarPU executor across ranks is refused with the reason;
#  6. a shard that never answers (CEDAR_EP_TEST_FAULT=hold): the owner
#     fails the request once nothing came for CEDAR_PD_DEADLINE_S, naming
#     the layer and the rank, and the job ends (exit != 0), never hangs;
#  7. a rank killed mid-request (owner or shard): the job ends, no hang.
# Every mpirun runs under `timeout`, so a hang fails the test. Skips (77)
# where mpirun is missing or cedar was built without StarPU-MPI.
# Run from the repository root: bash tests/cli/ep_mpi.sh build/cedar (~2 min).
set -euo pipefail
cedar=${1:?usage: ep_mpi.sh /path/to/cedar}
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
common=(--tokens "$toks37" --chunk 16 --max-new 4 --executor direct) # tiny-40's vocab (97) takes ids, not bytes
T40=tests/oracle/plans/tiny-40.yaml
P=tests/plans

"$cedar" run --plan $T40 "${common[@]}" --dump "$tmp/one.st" > "$tmp/one.txt"
tok_one=$(grep '^prompt' "$tmp/one.txt")

# figures.py A.json B.json: the experts sections' per-rank load figures agree
cat > "$tmp/figures.py" <<'PY'
import json, sys
a, b = (json.load(open(p))["experts"] for p in sys.argv[1:3])
keys = ("rows", "expert_rows", "dispatch_bytes", "dispatch_meta_bytes", "combine_bytes")
fa = [{k: r[k] for k in keys} for r in a["rank"]]
fb = [{k: r[k] for k in keys} for r in b["rank"]]
assert fa == fb, (fa, fb)
assert a["passes"] == b["passes"] and a["passes"] > 0, (a["passes"], b["passes"])
assert sum(r["expert_rows"] for r in a["rank"]) > 0
print("load figures agree:", fa)
PY

# 0. the graph: route, a dispatch transfer to rank 1, rank 1's shard, the combine back, the sum after it
"$cedar" graph show --plan $P/ep2-tiny-40.yaml --decode 5 > "$tmp/g.txt"
"$py" - "$tmp/g.txt" <<'PY' || { cat "$tmp/g.txt"; fail "ep2 decode graph: no dispatch/combine transfer nodes with their edges"; }
import re, sys
nodes = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\d+)\s+(.*?)\s+pos \[.*after (.*)$", line)
    if m:
        nodes[m.group(2)] = (int(m.group(1)), set(int(x) for x in m.group(3).split() if x != "-"))
route, disp, shard, comb, total = (nodes[n] for n in ("L7.moe dec", "xfer L7.disp1 dec r0>r1", "L7.moe_shard1 dec",
                                                      "xfer L7.out1 dec r1>r0", "L7.moe_sum dec"))
assert route[0] in disp[1] and disp[0] in shard[1] and shard[0] in comb[1] and comb[0] in total[1], nodes
assert "xfer L7.disp0 dec r0>r0" not in nodes and "L7.moe_shard0 dec" in nodes
PY
grep -q "transfer 80 moe_shard 80 moe_sum 40" "$tmp/g.txt" || { cat "$tmp/g.txt"; fail "ep2 decode graph: op counts"; }

# 1. one process
"$cedar" run --plan $P/ep2-tiny-40.yaml "${common[@]}" --dump "$tmp/ep1.st" --json > "$tmp/ep1.json"
"$py" tests/cli/ep_cmp.py "$tmp/one.st" "$tmp/ep1.st" || fail "one process, ep2: differs from the plan without placement"
"$py" -c 'import json,sys; e=json.load(open(sys.argv[1]))["experts"]; assert e["via"]=="local" and e["shards"]==2, e' \
  "$tmp/ep1.json" || fail "one-process --json experts section"
"$cedar" run --plan $P/ep4-tiny-40.yaml "${common[@]}" --json > "$tmp/ep1x4.json"

# run NP PLAN: mpirun with --dump and --json (then again for the text report)
run() {
  local np=$1 plan=$2 rc=0
  mpi -np "$np" "$cedar" run --plan "$plan" "${common[@]}" --dump "$tmp/ep$np.st" --json \
    > "$tmp/ep$np.json" 2> "$tmp/ep$np.err" || rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$tmp/ep$np.err" >&2; fail "mpirun -np $np timed out (a hang)"; }
  [ "$rc" -eq 0 ] || { cat "$tmp/ep$np.err" >&2; fail "mpirun -np $np $plan: exit $rc"; }
  if "$py" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["experts"]["via"] != "local")' "$tmp/ep$np.json"; then
    echo "skipped: this cedar was built without StarPU-MPI: the shards ran in one process"
    exit 77
  fi
}

# held J: every rank's routed-expert weights (stored formats) are what plan cost --per-rank gives it
held() {
  "$py" - "$1" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["experts"]
for r in e["rank"]:
    assert r["held_expert_bytes"] == r["accounted_expert_bytes"] and r["held_expert_bytes"] > 0, r
print("held experts = plan cost --per-rank:", [r["held_expert_bytes"] for r in e["rank"]])
PY
}

# 2. experts only, 2 and 4 ranks
run 2 $P/ep2-tiny-40.yaml
held "$tmp/ep2.json" || fail "2 ranks: held experts differ from the accounting"
"$py" tests/cli/ep_cmp.py "$tmp/one.st" "$tmp/ep2.st" "$tmp/ep2.st.rank1" || fail "2 ranks differ from one process"
"$py" "$tmp/figures.py" "$tmp/ep1.json" "$tmp/ep2.json" || fail "2 ranks: load figures differ from one process"
run 4 $P/ep4-tiny-40.yaml
"$py" tests/cli/ep_cmp.py "$tmp/one.st" "$tmp/ep4.st" "$tmp/ep4.st.rank1" "$tmp/ep4.st.rank2" "$tmp/ep4.st.rank3" ||
  fail "4 ranks differ from one process"
"$py" "$tmp/figures.py" "$tmp/ep1x4.json" "$tmp/ep4.json" || fail "4 ranks: load figures differ from one process"
held "$tmp/ep4.json" || fail "4 ranks: held experts differ from the accounting"
rc=0
mpi -np 2 "$cedar" run --plan $P/ep2-tiny-40.yaml "${common[@]}" > "$tmp/t2.txt" 2> "$tmp/t2.err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/t2.err" >&2; fail "text report run: exit $rc"; }
[ "$(grep -c '^prompt 37 tokens; generated' "$tmp/t2.txt")" -eq 1 ] || { cat "$tmp/t2.txt"; fail "want one report"; }
[ "$(grep '^prompt' "$tmp/t2.txt")" = "$tok_one" ] || fail "2 ranks: tokens differ from one process"
grep -q "^experts: 4 routed experts of 40 layers in 2 shards, through StarPU-MPI" "$tmp/t2.txt" ||
  { cat "$tmp/t2.txt"; fail "no experts line"; }
grep -q "^  rank 1: [1-9][0-9]* rows, [1-9][0-9]* expert-rows" "$tmp/t2.txt" || { cat "$tmp/t2.txt"; fail "no load of rank 1"; }

# 3. both together: stages and experts
mpi -np 2 "$cedar" run --plan $P/ppep2-tiny-40.yaml "${common[@]}" --dump "$tmp/pe2.st" > "$tmp/pe2.txt" 2> "$tmp/pe2.err" ||
  { cat "$tmp/pe2.err" >&2; fail "ppep2: mpirun failed"; }
grep -q "^pipeline: 2 stages on 2 ranks, through StarPU-MPI" "$tmp/pe2.txt" || { cat "$tmp/pe2.txt"; fail "ppep2: no pipeline line"; }
grep -q "^experts: .* through StarPU-MPI" "$tmp/pe2.txt" || { cat "$tmp/pe2.txt"; fail "ppep2: no experts line"; }
"$py" tests/cli/pp_cmp.py "$tmp/one.st" "$tmp/pe2.st:0-13" "$tmp/pe2.st.rank1:14-39" || fail "ppep2 differs from one process"
mpi -np 3 "$cedar" run --plan $P/ppep3-tiny-40.yaml "${common[@]}" --dump "$tmp/pe3.st" > "$tmp/pe3.txt" 2> "$tmp/pe3.err" ||
  { cat "$tmp/pe3.err" >&2; fail "ppep3: mpirun failed"; }
"$py" tests/cli/pp_cmp.py "$tmp/one.st" "$tmp/pe3.st:0-13" "$tmp/pe3.st.rank1:14-39" || fail "ppep3 differs from one process"
"$py" - "$tmp/one.st" "$tmp/pe3.st.rank2" <<'PY' || fail "ppep3: the experts-only rank's logits differ"
import json, re, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [k for k in a if not re.match(r"L\d+\.", k) and a[k] != b.get(k)]
assert not bad, bad
PY
grep -q "^  rank 2: [1-9][0-9]* rows" "$tmp/pe3.txt" || { cat "$tmp/pe3.txt"; fail "ppep3: no load of rank 2"; }
mpi -np 4 "$cedar" run --plan $P/ppep4-tiny-40.yaml "${common[@]}" --dump "$tmp/pe4.st" > "$tmp/pe4.txt" 2> "$tmp/pe4.err" ||
  { cat "$tmp/pe4.err" >&2; fail "ppep4: mpirun failed"; }
"$py" tests/cli/pp_cmp.py "$tmp/one.st" "$tmp/pe4.st.rank1:0-19" "$tmp/pe4.st.rank2:20-39" || fail "ppep4 differs from one process"
for r in 0 3; do
  f="$tmp/pe4.st"; [ $r -eq 0 ] || f="$f.rank$r"
  "$py" - "$tmp/one.st" "$f" <<'PY' || fail "ppep4: experts-only rank $r's logits differ"
import json, re, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [k for k in a if not re.match(r"L\d+\.", k) and a[k] != b.get(k)]
assert not bad, bad
PY
done
for f in pe2 pe3 pe4; do
  [ "$(grep -c "^  rank [0-9] holds [1-9][0-9]* B of routed experts" "$tmp/$f.txt")" -eq "${f#pe}" ] &&
    ! grep -q "(differs)" "$tmp/$f.txt" || { cat "$tmp/$f.txt"; fail "$f: held experts differ from the accounting"; }
done

# 4. the shipped plan against v41-mini in one process
V=(--prompt-len 37 --chunk 16 --max-new 3 --executor direct)
"$cedar" run --plan plans/v41-mini.yaml "${V[@]}" --dump "$tmp/v1.st" > /dev/null
rc=0
mpi -np 2 "$cedar" run --plan plans/v41-mini-ep2.yaml "${V[@]}" --dump "$tmp/v2.st" --json > "$tmp/v.json" 2> "$tmp/v.err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/v.err" >&2; fail "v41-mini-ep2: exit $rc"; }
"$py" tests/cli/ep_cmp.py "$tmp/v1.st" "$tmp/v2.st" "$tmp/v2.st.rank1" || fail "v41-mini-ep2 differs from v41-mini"
"$py" - "$tmp/v.json" <<'PY' || fail "v41-mini-ep2 --json"
import json, sys
e = json.load(open(sys.argv[1]))["experts"]
assert e["via"] == "starpu-mpi" and e["shards"] == 2 and e["layers"] == 40, e
r = {x["rank"]: x for x in e["rank"]}
assert r[0]["dispatch_bytes"] > 0 and r[1]["combine_bytes"] > 0 and r[1]["expert_rows"] > 0, e
assert e["expected_dispatch_bytes_per_token"] > 0 and e["dispatch_bytes_per_token"] > 0, e
assert all(x["held_expert_bytes"] == x["accounted_expert_bytes"] > 0 for x in e["rank"]), e
PY

# 5. the StarPU executor across ranks
rc=0
mpi -np 2 "$cedar" run --plan $P/ep2-tiny-40.yaml --tokens 1,2,3 --max-new 1 --executor starpu --workers 1 \
  > /dev/null 2> "$tmp/sp.err" || rc=$?
[ "$rc" -ne 0 ] || fail "the StarPU executor ran experts across ranks"
grep -q "run with --executor direct" "$tmp/sp.err" || { cat "$tmp/sp.err"; fail "the refusal says what to do"; }

# 6. a shard that never answers: the owner fails within the deadline
rc=0
start=$(date +%s)
CEDAR_PD_DEADLINE_S=5 mpi -x CEDAR_PD_DEADLINE_S -x CEDAR_EP_TEST_FAULT=hold:3 -np 2 "$cedar" run \
  --plan $P/ep2-tiny-40.yaml "${common[@]}" > /dev/null 2> "$tmp/hold.err" || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "a held answer hung the job"
[ "$rc" -ne 0 ] || fail "a held answer: the job succeeded"
grep -q "xfer L[0-9]*.out1 .*nothing from rank 1 for 5 s" "$tmp/hold.err" || { cat "$tmp/hold.err"; fail "no deadline message"; }
[ $(( $(date +%s) - start )) -lt 120 ] || fail "the held answer took over 120 s to fail"

# 7. a rank killed mid-request (by its pid): the job ends, nobody hangs
for who in 0 1; do
  rm -f "$tmp"/pid.*
  rc=0
  ( mpi -np 2 bash -c 'echo $$ > '"$tmp"'/pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' "$cedar" run \
      --plan $P/ep2-tiny-40.yaml --tokens "$toks101" --chunk 7 --max-new 40 --executor direct > /dev/null 2> "$tmp/kill.err" ) &
  job=$!
  i=0; while [ ! -f "$tmp/pid.$who" ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
  sleep $(( 1 + RANDOM % 2 ))
  [ -f "$tmp/pid.$who" ] || fail "rank $who never started"
  kill -9 "$(cat "$tmp/pid.$who")" 2> /dev/null || fail "rank $who finished before it could be killed"
  t0=$(date +%s); wait "$job" || rc=$?
  [ "$rc" -ne 124 ] && [ "$(( $(date +%s) - t0 ))" -lt 60 ] || { tail -20 "$tmp/kill.err" >&2; fail "rank $who killed: the job hung (exit $rc)"; }
  [ "$rc" -ne 0 ] || fail "rank $who killed: the job reported success"
  echo "rank $who killed: the job ended in $(( $(date +%s) - t0 )) s (exit $rc)"
done
echo "ep_mpi: ok"

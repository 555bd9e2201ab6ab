#!/usr/bin/env bash
# engram_tier.sh: serving.engram.tier and the Engram prefetch through the
# cedar binary (runtime/model/engram_tier.h, docs/runtime.md "Engram tiers and
# prefetch").
#
#  1. `plan check` says where the tables live; `plan cost --json` counts
#     them resident in the memory tier and mapped (not resident) in mmap;
#  2. `cedar run --dump` of tiny-40 in memory, mmap and with the prefetch
#     off, on the direct executor and on StarPU (2 workers), are the same
#     tensors bitwise (logits, tokens, KV, rings, tails); so are memory and
#     mmap over a weights file (--weights: the tables read in place);
#  3. --trace on StarPU: the trace has the "Engram prefetch" counter lane
#     and otherData.engram_prefetch (tasks, time, overlap fraction, started
#     ahead of the first layer = all of them), and run prints the figure;
#  4. a damaged tables file (truncated; another seed's) is refused with the
#     reason and the fix, exit 1, and left as it was;
#  5. P/D under mpirun (when available): pd-tiny-40-mmap's dump equals the
#     one-process tiny-40's bitwise.
#  6. `cedar bench engram` runs its three variants and says they agree.
# Run from the repository root: bash tests/cli/engram_tier.sh build/cedar (~75 s on 2 loaded cores).
set -euo pipefail
cedar=${1:?usage: engram_tier.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp # the derived tables files land here
T40=tests/oracle/plans/tiny-40.yaml MMAP=tests/plans/tiny-40-mmap.yaml NOPF=tests/plans/tiny-40-noprefetch.yaml

# 1. plan check / plan cost
"$cedar" plan check "$MMAP" | grep -q "Engram tables: mmap" || fail "plan check does not say the tables are mapped"
"$cedar" plan check "$T40" | grep -q "Engram tables: memory" || fail "plan check does not say the tables are in memory"
"$cedar" plan cost "$MMAP" --json > "$tmp/cm.json"
"$cedar" plan cost "$T40" --json > "$tmp/cr.json"
"$py" - "$tmp/cm.json" "$tmp/cr.json" <<'PY'
import json, sys
m, r = (json.load(open(p))["engram"] for p in sys.argv[1:3])
assert m["mmap"] == 1 and m["resident_bytes"] == 0 and m["mapped_bytes"] == m["table_bytes"] > 0, m
assert r["mmap"] == 0 and r["resident_bytes"] == r["table_bytes"] and r["mapped_bytes"] == 0, r
assert m["table_bytes"] == m["rows"] * m["row_bytes"] and m["rows_per_token"] == 2 * 3 * 2, m
PY

# 2. bitwise across tiers, prefetch and executors
ids=$("$py" -c 'print(",".join(str((i * 13 + 5) % 97) for i in range(45)))') # tiny-40's vocab is 97
common=(--tokens "$ids" --chunk 16 --max-new 4)
"$cedar" run --plan "$T40" "${common[@]}" --dump "$tmp/base.st" > /dev/null
cmp_dumps() {
  "$py" - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, "differ: %s" % bad[:8]
PY
}
i=0
for cfg in "$MMAP|direct" "$NOPF|direct" "$MMAP|starpu" "$NOPF|starpu" "$T40|starpu"; do
  plan=${cfg%|*} ex=${cfg#*|} i=$((i + 1))
  extra=(--executor "$ex"); [ "$ex" = starpu ] && extra+=(--workers 2)
  "$cedar" run --plan "$plan" "${common[@]}" "${extra[@]}" --dump "$tmp/d$i.st" > /dev/null 2> "$tmp/d$i.err" ||
    { cat "$tmp/d$i.err" >&2; fail "$plan on $ex"; }
  cmp_dumps "$tmp/base.st" "$tmp/d$i.st" || fail "$plan on $ex differs from tiny-40 (memory, direct)"
done
ls "$tmp"/cedar-engram-*.safetensors > /dev/null || fail "no derived tables file in \$TMPDIR"
# the mmap tier over a weights file: its tables read in place from the file's mapping
"$cedar" weights init --plan "$T40" --seed 4 --out "$tmp/w.st" > /dev/null
"$cedar" run --plan "$T40" --weights "$tmp/w.st" "${common[@]}" --dump "$tmp/wr.st" > /dev/null
"$cedar" run --plan "$MMAP" --weights "$tmp/w.st" "${common[@]}" --dump "$tmp/wm.st" > /dev/null
cmp_dumps "$tmp/wr.st" "$tmp/wm.st" || fail "--weights: the mmap tier differs from the memory tier"

# 3. the trace
"$cedar" run --plan "$MMAP" "${common[@]}" --workers 2 --trace "$tmp/t.json" > /dev/null 2> "$tmp/t.err" ||
  { cat "$tmp/t.err" >&2; fail "run --trace"; }
grep -q "^cedar run: --trace: Engram prefetch: [0-9]* tasks" "$tmp/t.err" || { cat "$tmp/t.err"; fail "no prefetch figure"; }
"$py" - "$tmp/t.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
pf = d["otherData"]["engram_prefetch"]
xs = [e for e in ev if e["ph"] == "X" and e["args"]["op"] == "engram_rows"]
cs = [e for e in ev if e["ph"] == "C" and e["name"] == "Engram prefetch"]
assert pf["tasks"] == len(xs) > 0, (pf, len(xs))
assert pf["started_ahead_of_first_layer"] == pf["tasks"], pf
assert 0 <= pf["overlap_fraction"] <= 1 and abs(pf["us"] - sum(e["dur"] for e in xs)) < 1e-3 * max(1, pf["us"]) + 1, pf
assert len(cs) == 2 * len(xs) and max(c["args"]["running"] for c in cs) >= 1 and cs[-1]["args"]["running"] == 0, len(cs)
print("trace: %d prefetches, %.1f%% beside layer compute" % (pf["tasks"], 100 * pf["overlap_fraction"]))
PY

# 4. damaged tables files
f=$(ls "$tmp"/cedar-engram-*.safetensors | head -1)
size=$(stat -c %s "$f")
cp "$f" "$tmp/keep.st"
head -c $((size - 64)) "$tmp/keep.st" > "$f"
rc=0; "$cedar" run --plan "$MMAP" --tokens 1,2,3,4,5,6,7,8 --max-new 1 > /dev/null 2> "$tmp/bad.err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/bad.err"; fail "a truncated tables file: exit $rc, want 1"; }
grep -q "the Engram tables file" "$tmp/bad.err" && grep -q "delete it" "$tmp/bad.err" || { cat "$tmp/bad.err"; fail "truncated: no reason or fix"; }
[ "$(stat -c %s "$f")" -eq $((size - 64)) ] || fail "the refused file was rewritten"
cp "$tmp/keep.st" "$f"
# another seed derives another file name: point a plan at this seed's file
cat > "$tmp/other-seed.yaml" <<EOF
extends: $PWD/$MMAP
serving:
  engram: {file: $f}
EOF
rc=0; "$cedar" run --plan "$tmp/other-seed.yaml" --seed 9 --tokens 1,2,3,4,5,6,7,8 --max-new 1 > /dev/null 2> "$tmp/seed.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "Engram tables of seed" "$tmp/seed.err" || { cat "$tmp/seed.err"; fail "another seed's tables: exit $rc"; }

# 5. P/D under mpirun
if command -v mpirun > /dev/null; then
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CEDAR_PD_DEADLINE_S=60
  . tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
  rc=0
  timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe -np 2 "$cedar" run --plan tests/plans/pd-tiny-40-mmap.yaml \
    "${common[@]}" --workers 1 --dump "$tmp/pd.st" > "$tmp/pd.txt" 2> "$tmp/pd.err" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/pd.err" >&2; fail "mpirun -np 2 pd-tiny-40-mmap: exit $rc"; }
  cmp_dumps "$tmp/base.st" "$tmp/pd.st" || fail "P/D with the mmap tier differs from one process"
else
  echo "note: mpirun is not installed: the P/D case is skipped"
fi

# 6. the benchmark
"$cedar" bench engram --plan "$T40" --steps 3 --prompt-len 8 > "$tmp/b.txt" || { cat "$tmp/b.txt"; fail "bench engram"; }
grep -q "bitwise equal" "$tmp/b.txt" || { cat "$tmp/b.txt"; fail "bench engram did not compare the variants"; }
# 7. a released-layout checkpoint
"$cedar" weights init --layout released --plan "$T40" --seed 4 --out "$tmp/ck" --shard-bytes 64K > /dev/null
[ "$(ls "$tmp"/ck/*.safetensors | wc -l)" -gt 1 ] || fail "the checkpoint has one shard"
"$cedar" run --model "$tmp/ck" --plan "$T40" "${common[@]}" --dump "$tmp/cr.st" > /dev/null
printf 'extends: %s\nserving:\n  engram: {prefetch: false}\n' "$PWD/$MMAP" > "$tmp/mmap-nopf.yaml"
i=0
for cfg in "$MMAP|direct" "$tmp/mmap-nopf.yaml|direct" "$MMAP|starpu"; do
  plan=${cfg%|*} ex=${cfg#*|} i=$((i + 1))
  extra=(--executor "$ex"); [ "$ex" = starpu ] && extra+=(--workers 2)
  "$cedar" run --model "$tmp/ck" --plan "$plan" "${common[@]}" "${extra[@]}" --dump "$tmp/cm$i.st" > /dev/null \
    2> "$tmp/cm$i.err" || { cat "$tmp/cm$i.err" >&2; fail "--model with $plan on $ex"; }
  cmp_dumps "$tmp/cr.st" "$tmp/cm$i.st" || fail "--model: $plan on $ex differs from the memory tier"
done
if command -v mpirun > /dev/null; then
  rc=0
  timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe -np 2 "$cedar" run --model "$tmp/ck" \
    --plan tests/plans/pd-tiny-40-mmap.yaml "${common[@]}" --workers 1 --dump "$tmp/cpd.st" > "$tmp/cpd.txt" \
    2> "$tmp/cpd.err" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$tmp/cpd.err" >&2; fail "mpirun -np 2 --model pd-tiny-40-mmap: exit $rc"; }
  cmp_dumps "$tmp/cr.st" "$tmp/cpd.st" || fail "--model: P/D with the mmap tier differs from one process"
fi
"$cedar" bench engram --model "$tmp/ck" --steps 3 --prompt-len 8 > "$tmp/cb.txt" 2>&1 ||
  { cat "$tmp/cb.txt"; fail "bench engram --model"; }
grep -q "bitwise equal" "$tmp/cb.txt" || { cat "$tmp/cb.txt"; fail "bench engram --model did not compare the variants"; }
# the shard holding layer 1's table values: truncated, then damaged inside the values
shard=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["weight_map"]["layers.1.engram.embed.weight"])' \
  "$tmp/ck/model.safetensors.index.json")
cp -r "$tmp/ck" "$tmp/ckcut"
size=$(stat -c %s "$tmp/ckcut/$shard")
truncate -s $((size - 100)) "$tmp/ckcut/$shard"
rc=0; "$cedar" run --model "$tmp/ckcut" --plan "$MMAP" --tokens 1,2,3 --max-new 1 > /dev/null 2> "$tmp/cut.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "$shard" "$tmp/cut.err" && grep -q "truncated" "$tmp/cut.err" ||
  { cat "$tmp/cut.err"; fail "a truncated shard under mmap: exit $rc, or the message lacks the shard and the reason"; }
cp "$tmp/ck/$shard" "$tmp/ckcut/$shard"
"$py" - "$tmp/ckcut/$shard" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
t = json.loads(b[8:8 + n])["layers.1.engram.embed.weight"]["data_offsets"]
for k in range(t[0], t[1], 97): b[8 + n + k] ^= 0x21   # flip bits across the values
open(p, "wb").write(b)
PY
"$cedar" run --model "$tmp/ckcut" --plan "$MMAP" "${common[@]}" > /dev/null 2> "$tmp/dmg.err" ||
  { cat "$tmp/dmg.err"; fail "damaged table bytes under mmap: the run failed (it reads no hash there)"; }
rc=0; "$cedar" weights check "$tmp/ckcut" > /dev/null 2> "$tmp/chk.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "content hash" "$tmp/chk.err" || { cat "$tmp/chk.err"; fail "weights check of a damaged table: exit $rc"; }
rc=0; "$cedar" run --model "$tmp/ckcut" --plan "$T40" --tokens 1,2,3 --max-new 1 > /dev/null 2> "$tmp/dmgm.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "damaged" "$tmp/dmgm.err" || { cat "$tmp/dmgm.err"; fail "the memory tier accepted a damaged table: exit $rc"; }
echo "engram_tier: ok"

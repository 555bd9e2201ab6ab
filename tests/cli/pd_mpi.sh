#!/usr/bin/env bash
# pd_mpi.sh: prefill on rank 0 and decode on rank 1 through StarPU-MPI
# (`mpirun -np 2 cedar run --plan plans/v41-mini-pd.yaml`, runtime/dist/pd.h).
#
#  1. the decode rank prints the single-process report plus the transfer
#     figures ("through StarPU-MPI", bytes by state class that agree with
#     the plan's package); the prefill rank prints no report;
#  2. its --dump equals the one-process run of plans/v41-mini.yaml bitwise:
#     every tensor (prefill and decode logits, tokens, every source's Main
#     KV and Indexer K, tail positions, every ring's entries and positions);
#     with several chunks (KV streamed chunk by chunk), an odd prompt (a
#     tail in the package), on the StarPU and the direct executor, with the
#     decoder replay on P and on D (serving.placement.replay: decode);
#  3. --json has a "transfer" object (via starpu-mpi, agrees, KV bytes),
#     its bytes by class equal `cedar plan cost --json`'s pd_package;
#  4. mpirun -np 1 is refused naming both numbers (needs 2, gave 1);
#  5. a KV message P never sends (the test hook CEDAR_PD_TEST_FAULT=hold-kv):
#     D fails the request once no message came for CEDAR_PD_DEADLINE_S, naming it, and
#     ends the job (exit 1), never hangs;
#  6. P (three times) or D killed at a random point: the job ends, no hang
#     (what each rank does alone when the other dies: pd_faults.sh);
#  7. --trace writes one Chrome trace: a process per rank, P's prefill graph
#     on rank 0, D's decode steps and a receive per message on rank 1, a
#     flow per transfer from its send to its receive (tests/cli/
#     trace_check.py: the format rules Perfetto and speedscope apply);
#     `cedar view` reads it; speedscope in headless chromium loads it when
#     both are installed (as trace.sh).
# Every mpirun runs under `timeout`, so a hang fails the test instead of
# blocking CI. Skips (77) where mpirun is missing or cedar was built
# without StarPU-MPI, saying which.
# Run from the repository root: bash tests/cli/pd_mpi.sh build/cedar (~1-2 min).
set -euo pipefail
cedar=${1:?usage: pd_mpi.sh /path/to/cedar}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "skipped: mpirun is not installed (Debian: openmpi-bin)"; exit 77; }
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. tests/cli/mpi_asan.sh; mpi_asan_env "$cedar" # Open MPI's own leaks suppressed under ASan
export CEDAR_PD_DEADLINE_S=60
mpi() { timeout -k 10 240 mpirun --allow-run-as-root --oversubscribe "$@"; }
common=(--prompt-len 37 --chunk 16 --max-new 4 --workers 1)

# 1-2: StarPU executor, text report and dump
rc=0
mpi -np 2 "$cedar" run --plan plans/v41-mini-pd.yaml "${common[@]}" --dump "$tmp/pd.st" > "$tmp/pd.txt" 2> "$tmp/pd.err" || rc=$?
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$tmp/pd.err" >&2; fail "mpirun -np 2 timed out (a hang)"; }
[ "$rc" -eq 0 ] || { cat "$tmp/pd.err" >&2; fail "mpirun -np 2 exit $rc"; }
if grep -q "in one process" "$tmp/pd.txt"; then
  echo "skipped: this cedar was built without StarPU-MPI (CMake found no starpumpi-1.3 or MPI): both ranks ran locally"
  exit 77
fi
[ "$(grep -c '^prompt 37 tokens; generated' "$tmp/pd.txt")" -eq 1 ] || { cat "$tmp/pd.txt"; fail "want exactly one report (the decode rank's)"; }
grep -q "^P/D: prefill on rank 0 cpu, decode on rank 1 cpu, through StarPU-MPI" "$tmp/pd.txt" || { cat "$tmp/pd.txt"; fail "no P/D line"; }
grep -q "the plan's package agrees" "$tmp/pd.txt" || { cat "$tmp/pd.txt"; fail "bytes moved disagree with the plan"; }
"$cedar" run --plan plans/v41-mini.yaml "${common[@]}" --dump "$tmp/one.st" > "$tmp/one.txt"
cmp_dumps() { # the tensors of two safetensors files, bitwise (metadata names the plan: skipped)
  "$py" - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
bad = [k for k in a if a[k] != b[k]]
assert not bad, "differ: %s" % bad[:8]
assert any(k.endswith("main_kv") for k in a) and any(k.endswith(".swa") for k in a), sorted(a)[:8]
print("%d tensors equal" % len(a))
PY
}
cmp_dumps "$tmp/pd.st" "$tmp/one.st" || fail "P/D (starpu) differs from one process"
tok_pd=$(grep '^prompt' "$tmp/pd.txt"); tok_one=$(grep '^prompt' "$tmp/one.txt")
[ "$tok_pd" = "$tok_one" ] || fail "tokens: '$tok_pd' vs '$tok_one'"

# 2-3: direct executor, --json, an even prompt over several chunks
mpi -np 2 "$cedar" run --plan plans/v41-mini-pd.yaml --prompt-len 48 --chunk 16 --max-new 3 --executor direct \
  --json --dump "$tmp/pdj.st" > "$tmp/pd.json" 2> "$tmp/pdj.err" || { cat "$tmp/pdj.err" >&2; fail "mpirun --json"; }
"$cedar" run --plan plans/v41-mini.yaml --prompt-len 48 --chunk 16 --max-new 3 --executor direct --dump "$tmp/onej.st" > /dev/null
cmp_dumps "$tmp/pdj.st" "$tmp/onej.st" || fail "P/D (direct) differs from one process"
"$cedar" plan cost plans/v41-mini-pd.yaml --prompt 48 --json > "$tmp/cost.json"
"$py" - "$tmp/pd.json" "$tmp/cost.json" <<'PY' || fail "--json transfer object"
import json, sys
j = json.load(open(sys.argv[1]))
k = json.load(open(sys.argv[2]))["pd_package"]
for c in ("global_kv", "swa_encoder", "swa_decoder", "tails", "encoder_outputs"):
    assert j["transfer"]["bytes"][c] == k[c], (c, j["transfer"]["bytes"][c], k[c])
t = j["transfer"]
assert t["via"] == "starpu-mpi" and t["agrees"] is True, t
assert t["bytes"]["global_kv"] == t["plan_bytes"]["global_kv"] > 0, t
assert 0 <= t["overlap"] <= 1 and t["transfer_s"] >= 0, t
assert len(j["tokens"]) == 3, j["tokens"]
PY

# 2: the decoder replay on D (SPEC 7.6): P ships the kept encoder outputs, D replays and samples y1
printf 'extends: %s/plans/v41-mini-pd.yaml\nname: v41-mini-pd-replay-d\nserving:\n  placement:\n    replay: decode\n' \
  "$PWD" > "$tmp/replay-d.yaml"
mpi -np 2 "$cedar" run --plan "$tmp/replay-d.yaml" "${common[@]}" --dump "$tmp/pdd.st" > "$tmp/pdd.txt" 2> "$tmp/pdd.err" \
  || { cat "$tmp/pdd.err" >&2; fail "mpirun, replay on D"; }
grep -q "decoder replay on D: y1 sampled and delivered by D" "$tmp/pdd.txt" || { cat "$tmp/pdd.txt"; fail "replay on D: no y1 line"; }
grep -q "decoder SWA 0 B" "$tmp/pdd.txt" || fail "replay on D shipped decoder rings"
grep -q "the plan's package agrees" "$tmp/pdd.txt" || { cat "$tmp/pdd.txt"; fail "replay on D: bytes disagree"; }
cmp_dumps "$tmp/pdd.st" "$tmp/one.st" || fail "P/D with the replay on D differs from one process"

# 4: more ranks than mpirun gave
rc=0
mpi -np 1 "$cedar" run --plan plans/v41-mini-pd.yaml --prompt-len 8 --max-new 1 > /dev/null 2> "$tmp/np1.err" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "mpirun -np 1: exit $rc, want a refusal"
grep -q "needs 2 ranks, but mpirun gave 1" "$tmp/np1.err" || { cat "$tmp/np1.err" >&2; fail "np 1: message"; }
# 5: a message that never arrives: D fails the request within the deadline
#    naming it, then ends the job (StarPU-MPI cannot cancel a posted receive)
rc=0; t0=$(date +%s)
CEDAR_PD_DEADLINE_S=20 mpi -x CEDAR_PD_DEADLINE_S -x CEDAR_PD_TEST_FAULT=hold-kv -np 2 "$cedar" run \
  --plan plans/v41-mini-pd.yaml "${common[@]}" > /dev/null 2> "$tmp/hold.err" || rc=$?
dt=$(( $(date +%s) - t0 ))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || { cat "$tmp/hold.err" >&2; fail "held message: exit $rc (hang or success)"; }
grep -q "stalled: no message for 20 s.*first missing: xfer L20.kv" "$tmp/hold.err" || { cat "$tmp/hold.err" >&2; fail "held message: no deadline message"; }
echo "held KV message: refused after ${dt} s (exit $rc)"

# 6: a rank killed at a random point: the job ends (Open MPI), nobody hangs
# (the smaller form, CEDAR_TEST_SMALL=1 in the ASan build: each rank once)
whos="0 0 0 1"; [ "${CEDAR_TEST_SMALL:-0}" = 1 ] && whos="0 1"
for who in $whos; do
  rm -f "$tmp"/pid.*
  rc=0
  ( mpi -np 2 bash -c 'echo $$ > '"$tmp"'/pid.$OMPI_COMM_WORLD_RANK; exec "$0" "$@"' "$cedar" run \
      --plan plans/v41-mini-pd.yaml "${common[@]}" > /dev/null 2>&1 ) &
  job=$!
  sleep $(( 3 + RANDOM % 7 ))
  [ -f "$tmp/pid.$who" ] && kill -9 "$(cat "$tmp/pid.$who")" 2> /dev/null || true
  t0=$(date +%s); wait "$job" || rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || [ "$(( $(date +%s) - t0 ))" -lt 60 ] || fail "rank $who killed: the job hung"
  echo "rank $who killed: the job ended in $(( $(date +%s) - t0 )) s (exit $rc)"
done
# 7: one trace for both ranks
mpi -np 2 "$cedar" run --plan plans/v41-mini-pd.yaml "${common[@]}" --trace "$tmp/t.json" > "$tmp/tr.txt" 2> "$tmp/tr.err" \
  || { cat "$tmp/tr.err" >&2; fail "mpirun --trace"; }
msgs=$(sed -n 's/^  moved \([0-9]*\) messages:.*/\1/p' "$tmp/tr.txt")
"$py" tests/cli/trace_check.py --selftest > /dev/null || fail "trace_check.py accepts broken traces"
"$py" tests/cli/trace_check.py "$tmp/t.json" --ranks 2 --transfers $((msgs - 2)) || fail "the multi-rank trace (above)"
"$cedar" view "$tmp/t.json" -o "$tmp/t.html" > /dev/null || fail "cedar view cannot read the multi-rank trace"
chromium=$(command -v chromium || command -v chromium-browser || true)
ss=${CEDAR_SPEEDSCOPE:-}
if [ -z "$ss" ] && command -v npm > /dev/null; then ss="$(npm root -g 2> /dev/null)/speedscope"; fi
index="$ss/dist/release/index.html"
if [ -n "$chromium" ] && [ -f "$index" ]; then
  printf 'window.alert = function (m) { document.title = "ALERT: " + m; };\nspeedscope.loadFileFromBase64("t.json", "%s");\n' \
    "$(base64 -w0 "$tmp/t.json")" > "$tmp/loader.js"
  title=$(timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --allow-file-access-from-files \
    --user-data-dir="$tmp/chromium" --virtual-time-budget=10000 --dump-dom \
    "file://$index#localProfilePath=$tmp/loader.js" 2> /dev/null | sed -n 's:.*<title>\([^<]*\)</title>.*:\1:p')
  [ "$title" = "t.json - speedscope" ] || fail "speedscope did not load the multi-rank trace (page title '$title')"
  echo "multi-rank trace: speedscope in headless chromium loaded it"
else
  echo "multi-rank trace: speedscope check skipped (chromium: ${chromium:-none}; speedscope: $index)"
fi
echo "pd_mpi: ok"

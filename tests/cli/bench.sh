#!/usr/bin/env bash
# bench.sh: the shape of `cedar bench ops`, never its timings (these VMs are
# noisy; docs/PERF.md reads the numbers). One fast run (--reps 1, one op)
# must report both peaks and the op's rows with positive, consistent numbers;
# --help must name every option and op the command accepts; bad arguments
# exit 2 and a plan that does not load exits 1.
# Run from the repository root: bash tests/cli/bench.sh build/cedar
set -euo pipefail

cedar=${1:?usage: bench.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The fast run: peaks, then rmsnorm's two rows (a chunk and a decode step).
"$cedar" bench ops --reps 1 --filter rmsnorm --json > "$tmp/out.json" || fail "bench ops --json exited $?"
"$py" - "$tmp/out.json" <<'EOF' || fail "the JSON report is not what --help describes"
import json, sys
j = json.load(open(sys.argv[1]))
def pos(x): return isinstance(x, (int, float)) and x > 0
g, c = j["peaks"]["sgemm"], j["peaks"]["memcpy"]
assert pos(g["gflops"]) and pos(g["best_s"]) and g["m"] == g["n"] == g["k"] == 1024 and g["threads"] == 1, g
assert pos(c["gbs"]) and pos(c["best_s"]) and c["bytes"] == 256 << 20 and c["counted"] == "read+write", c
# The peaks are what their own numbers say, and physically possible: not a
# timing assertion, a check that the measured work was not optimized away
# (GCC once removed the memcpy as a dead store: 1.9e9 GB/s).
assert c["gbs"] < 1e3 and g["gflops"] < 1e4, (g, c)
assert abs(g["gflops"] * 1e9 * g["best_s"] - 2 * 1024**3) < 1e-6 * 2 * 1024**3, g
assert abs(c["gbs"] * 1e9 * c["best_s"] - 2 * c["bytes"]) < 1e-6 * 2 * c["bytes"], c
assert j["plan"] == "v41-mini" and j["machine"]["nproc"] >= 1 and j["machine"]["cpu"], j["machine"]
assert j["machine"]["isa"] in ("default", "avx2", "avx512"), j["machine"]
rows = j["ops"]
assert [r["name"] for r in rows] == ["rmsnorm", "rmsnorm"], [r["name"] for r in rows]
assert rows[0]["shape"] == "n=%d d=256" % j["chunk"] and rows[1]["shape"] == "n=1 d=256", rows
for r in rows:
    for k in ("best_s", "median_s", "flops", "bytes", "gflops", "gbs", "floor_s", "ratio", "mem_ratio"):
        assert pos(r[k]), (k, r)
    assert r["reps"] == 1 and r["calls_per_rep"] >= 1 and r["median_s"] >= r["best_s"], r
    # rmsnorm: 4 n d flops, 4 (2 n d + d) bytes; derived columns consistent.
    n = int(r["shape"].split()[0][2:])
    assert r["flops"] == 4 * n * 256 and r["bytes"] == 4 * (2 * n * 256 + 256), r
    floor = max(r["flops"] / (g["gflops"] * 1e9), r["bytes"] / (c["gbs"] * 1e9))
    assert abs(r["floor_s"] - floor) <= 1e-9 * floor and abs(r["ratio"] - r["best_s"] / floor) <= 1e-9 * r["ratio"], r
    assert r["bound"] in ("compute", "memory"), r
EOF

# A GEMM-shaped row carries the time of its own GEMMs alone (x gemm); others do not.
"$cedar" bench ops --reps 1 --filter swa_kv --json > "$tmp/gemm.json" || fail "bench ops --filter swa_kv: exit $?"
"$py" - "$tmp/gemm.json" <<'EOF' || fail "the x gemm fields are not what --help describes"
import json, sys
rows = json.load(open(sys.argv[1]))["ops"]
assert [r["name"] for r in rows] == ["swa_kv_pack", "swa_kv_pack"], rows
for r in rows:
    assert r["gemm_s"] > 0 and abs(r["gemm_ratio"] - r["best_s"] / r["gemm_s"]) <= 1e-9 * r["gemm_ratio"], r
EOF
"$py" -c 'import json,sys; assert all("gemm_s" not in r for r in json.load(open(sys.argv[1]))["ops"])' "$tmp/out.json" ||
  fail "rmsnorm rows carry a GEMM time"

# CEDAR_ISA picks the kernels' level and the report says which; an unknown
# name is a warning, not a failure.
CEDAR_ISA=default "$cedar" bench ops --reps 1 --filter sample_greedy > "$tmp/isa.txt" 2>&1 ||
  fail "CEDAR_ISA=default: exit $?"
grep -q "cedar's kernels at default (CEDAR_ISA)" "$tmp/isa.txt" || fail "CEDAR_ISA=default is not reported"
CEDAR_ISA=sse9 "$cedar" bench ops --reps 1 --filter sample_greedy > "$tmp/isa.txt" 2>&1 ||
  fail "CEDAR_ISA=sse9: exit $?"
grep -q "CEDAR_ISA=sse9 is not one of default, avx2, avx512" "$tmp/isa.txt" || fail "an unknown CEDAR_ISA is not named"

# The table says the same things.
"$cedar" bench ops --reps 1 --filter sample_greedy > "$tmp/table.txt"
grep -q '^peak sgemm 1024x1024x1024: [0-9.]* GFLOP/s' "$tmp/table.txt" || fail "table: no sgemm peak"
grep -q '^peak memcpy 256 MiB: [0-9.]* GB/s counting read + write' "$tmp/table.txt" || fail "table: no memcpy peak"
grep -q '^sample_greedy  *V=512 ' "$tmp/table.txt" || fail "table: no sample_greedy row"

# --help is truthful: it documents every option the parser takes (each one is
# exercised in this file) in its options list, and lists the op names, each
# of which --filter accepts.
"$cedar" bench --help > "$tmp/help.txt"
"$cedar" bench ops --help | cmp -s - "$tmp/help.txt" || fail "'bench ops --help' differs from 'bench --help'"
for opt in --plan --flash --reps --json --filter --help; do
  grep -qE -- "^  (-h, )?$opt( |$)" "$tmp/help.txt" || fail "--help's options list lacks $opt"
done
ops=$(sed -n '/^ops:/,/^$/p' "$tmp/help.txt" | tail -n +2)
[ "$(echo $ops | wc -w)" -ge 20 ] || fail "--help lists too few ops: $ops"
for op in $ops; do  # --reps 0 stops the run after the filter was checked
  out=$("$cedar" bench ops --filter "$op" --reps 0 2>&1 || true)
  case $out in *"no op name contains"*) fail "--help lists '$op' but --filter rejects it" ;; esac
done

# Usage errors exit 2 with a message; a plan that does not load exits 1.
expect() {  # expect CODE PATTERN cmd...
  local code=$1 pat=$2 rc=0
  shift 2
  "$@" > /dev/null 2> "$tmp/err.txt" || rc=$?
  [ "$rc" -eq "$code" ] || fail "$* exited $rc, not $code"
  grep -q -- "$pat" "$tmp/err.txt" || { cat "$tmp/err.txt" >&2; fail "$*: no '$pat'"; }
}
expect 2 "unknown option '--bogus'" "$cedar" bench ops --bogus
expect 2 "expected 'ops'" "$cedar" bench
expect 2 "unknown benchmark 'nope'" "$cedar" bench nope
expect 2 "expected an integer from 1" "$cedar" bench ops --reps 0
expect 2 "expected an integer from 1" "$cedar" bench ops --reps 3x
expect 2 "needs a value" "$cedar" bench ops --reps
expect 2 "no op name contains 'nosuchop'" "$cedar" bench ops --filter nosuchop
expect 2 "give one" "$cedar" bench ops --flash --plan plans/v41-mini.yaml
expect 2 "unexpected argument 'extra'" "$cedar" bench ops extra
expect 1 "did not load" "$cedar" bench ops --plan "$tmp/missing.yaml" --filter rmsnorm
expect 2 "(got 'baz')" "$cedar" bench model --executor direct,baz
expect 2 "(got 'foo')" "$cedar" run --executor foo
echo "bench: ok"

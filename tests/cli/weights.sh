#!/usr/bin/env bash
# weights.sh: `cedar weights init|check|list` (cli/cmd_weights.c).
#
# init on plans/v41-mini.yaml with a seed into a temp dir; check passes (and
# passes for plans/alt-no-pool.yaml, which has the same tensors); check
# against tests/plans/small.yaml fails with exit 1 and names the
# fingerprint; the same seed gives the same bytes; list --json parses and
# agrees with the file; the flash plan's init is refused with its size;
# bad options exit 2. Not here: the tensor list and values in detail
# (tests/test_weights.c).
# Run from the repository root: bash tests/cli/weights.sh build/cedar
set -euo pipefail

cedar=${1:?usage: weights.sh /path/to/cedar}
mini=plans/v41-mini.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
[ -f "$mini" ] || { echo "FAIL: $mini is missing (run from the repository root)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_exit CODE ARGS...: cedar must exit with CODE; stdout in $tmp/out, stderr in $tmp/err.
expect_exit() {
  local want=$1 got=0
  shift
  "$cedar" "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  [ "$got" = "$want" ] || { cat "$tmp/err" >&2; fail "cedar $* exited $got, want $want"; }
}

# 1. init, then check against the plan and a plan with the same tensors.
expect_exit 0 weights init --plan "$mini" --seed 42 --out "$tmp/w.safetensors" --json
"$py" - "$tmp/out" <<'EOF' || fail "init --json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["plan"] == "v41-mini" and j["seed"] == 42 and j["tensors"] == 1084, j
assert len(j["fingerprint"]) == 16, j
EOF
[ -s "$tmp/w.safetensors" ] || fail "init wrote no file"
expect_exit 0 weights check --plan "$mini" "$tmp/w.safetensors"
grep -q "ok for plan v41-mini" "$tmp/out" || fail "check printed: $(cat "$tmp/out")"
expect_exit 0 weights check --plan plans/alt-no-pool.yaml "$tmp/w.safetensors"

# 2. The same seed gives the same bytes; another seed does not.
expect_exit 0 weights init --plan "$mini" --seed 42 --out "$tmp/w2.safetensors"
cmp -s "$tmp/w.safetensors" "$tmp/w2.safetensors" || fail "seed 42 twice gave different files"
expect_exit 0 weights init --plan "$mini" --seed 43 --out "$tmp/w2.safetensors"
! cmp -s "$tmp/w.safetensors" "$tmp/w2.safetensors" || fail "seeds 42 and 43 gave the same file"
rm -f "$tmp/w2.safetensors"

# 3. Against another plan: exit 1, the fingerprint named, JSON too.
expect_exit 1 weights check --plan tests/plans/small.yaml "$tmp/w.safetensors"
grep -q "fingerprint" "$tmp/err" || fail "check against small does not name the fingerprint: $(head -3 "$tmp/err")"
grep -q "and [0-9]* more" "$tmp/err" || fail "check does not cut its list short"
expect_exit 1 weights check --plan tests/plans/small.yaml "$tmp/w.safetensors" --json
"$py" - "$tmp/out" <<'EOF' || fail "check --json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["valid"] is False and j["plan"] == "small", j
assert "fingerprint" in j["problems"][0] and j["file_fingerprint"] != j["fingerprint"], j["problems"][0]
assert len(j["problems"]) > 20
EOF

# 4. A truncated file: exit 1 with the file named.
head -c 1000 "$tmp/w.safetensors" >"$tmp/cut.safetensors"
expect_exit 1 weights check --plan "$mini" "$tmp/cut.safetensors"
grep -q "cut.safetensors" "$tmp/err" || fail "truncated file not named: $(cat "$tmp/err")"

# 5. list --json parses and agrees with the file's header.
expect_exit 0 weights list --plan "$mini" --json
"$py" - "$tmp/out" "$tmp/w.safetensors" <<'EOF' || fail "list --json"
import json, struct, sys
j = json.load(open(sys.argv[1]))
with open(sys.argv[2], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
meta = hdr.pop("__metadata__")
assert j["plan"] == "v41-mini" and j["count"] == len(j["tensors"]) == len(hdr) == 1084
assert j["total_bytes"] == sum(t["bytes"] for t in j["tensors"])
assert meta["cedar.fingerprint"] == j["fingerprint"] and meta["cedar.seed"] == "42" and meta["cedar.plan"] == "v41-mini"
for t in j["tensors"]:
    h = hdr[t["name"]]
    assert h["dtype"] == t["dtype"] and h["shape"] == t["shape"], t
    assert h["data_offsets"][1] - h["data_offsets"][0] == t["bytes"], t
EOF
expect_exit 0 weights list --plan "$mini"
tail -1 "$tmp/out" | grep -q "1084 tensors" || fail "list: $(tail -1 "$tmp/out")"

# 6. The flash plan is refused with its size, before any work.
expect_exit 1 weights init --plan plans/v41-flash.yaml --seed 1 --out "$tmp/flash.safetensors"
grep -q "TiB" "$tmp/err" && grep -q -- "--max-bytes" "$tmp/err" || fail "flash refusal: $(cat "$tmp/err")"
[ ! -e "$tmp/flash.safetensors" ] || fail "flash init wrote a file"
expect_exit 1 weights init --plan "$mini" --seed 1 --max-bytes 100M --out "$tmp/x.safetensors"
grep -q "v41-mini" "$tmp/err" || fail "--max-bytes refusal"

# 7. Usage: help exits 0, bad options 2.
expect_exit 0 weights --help
expect_exit 0 weights init --help
grep -q -- "--max-bytes" "$tmp/out" || fail "init --help"
expect_exit 0 weights check --help
expect_exit 0 weights list --help
expect_exit 2 weights
expect_exit 2 weights frobnicate
expect_exit 2 weights init --out "$tmp/x.safetensors"
expect_exit 2 weights init --seed 1
expect_exit 2 weights init --seed -1 --out "$tmp/x.safetensors"
expect_exit 2 weights init --seed 1 --out "$tmp/x.safetensors" --max-bytes 8X
expect_exit 2 weights check
expect_exit 2 weights check --seed 1 "$tmp/w.safetensors"
expect_exit 2 weights list --bogus
expect_exit 1 weights list --plan /nonexistent.yaml
echo "weights.sh: ok"

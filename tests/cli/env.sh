#!/usr/bin/env bash
# env.sh: CLI test of `cedar env`, `cedar --help` and `cedar version`.
#
# Checks that `cedar env` (text and --json) names StarPU, hwloc and a CUDA
# line (devices, or the CUDA error name / "not built with CUDA"), the CUDA
# kernels built and whether nodes run on CUDA (or why not), that the
# JSON parses and lists at least one StarPU worker, that bad flags are usage
# errors (exit 2), that `cedar --help` lists `env`, and that `cedar version`
# prints a version. It does not check the values, which depend on the machine.
#
# Run: bash tests/cli/env.sh build/cedar   (from the repo root; ctest runs it
# as cli_env with HWLOC_COMPONENTS=-pci).
set -u
cedar=${1:?usage: env.sh /path/to/cedar}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_grep FILE REGEX WHAT
expect_grep() { grep -Eq -- "$2" "$1" || { fail "$3: no match for /$2/ in:"; sed 's/^/  | /' "$1" >&2; }; }

"$cedar" env >"$tmp/env.txt" 2>"$tmp/env.err"; rc=$?
[ "$rc" -eq 0 ] || { fail "cedar env exited $rc"; cat "$tmp/env.err" >&2; }
expect_grep "$tmp/env.txt" '^cedar [0-9]+\.[0-9]+\.[0-9]+' "env: cedar version line"
expect_grep "$tmp/env.txt" '^  StarPU +[0-9]+\.[0-9]+\.[0-9]+' "env: StarPU version"
expect_grep "$tmp/env.txt" '^  hwloc +' "env: hwloc line"
expect_grep "$tmp/env.txt" '^  (libyaml|cJSON|OpenBLAS) +' "env: other libraries"
expect_grep "$tmp/env.txt" '^  CUDA +(runtime [0-9]|not built with CUDA)' "env: CUDA library line"
expect_grep "$tmp/env.txt" '^StarPU workers' "env: StarPU workers section"
expect_grep "$tmp/env.txt" '^ +[0-9]+ +CPU ' "env: at least one CPU worker"
expect_grep "$tmp/env.txt" '^CUDA devices:' "env: CUDA devices section"
expect_grep "$tmp/env.txt" '^  ([0-9]+  .*compute capability [0-9]+\.[0-9]+|none: (cudaError[A-Za-z]+|not built with CUDA|the CUDA runtime reports 0))' \
  "env: CUDA devices or the reason there are none"
expect_grep "$tmp/env.txt" '^CUDA kernels: [0-9]+ of [0-9]+ ops.*[0-9]+ of [0-9]+ node op groups' "env: CUDA kernels built"
expect_grep "$tmp/env.txt" '^  nodes (run on CUDA here|do not run on CUDA here: .+)' "env: whether nodes run on CUDA, or why not"

# STARPU_NCPU is honoured.
STARPU_NCPU=1 "$cedar" env >"$tmp/env1.txt" 2>/dev/null || fail "STARPU_NCPU=1 cedar env exited $?"
n=$(grep -Ec '^ +[0-9]+ +CPU ' "$tmp/env1.txt")
[ "$n" -eq 1 ] || fail "STARPU_NCPU=1: expected 1 CPU worker, saw $n"

"$cedar" env --json >"$tmp/env.json" 2>"$tmp/env.json.err"; rc=$?
[ "$rc" -eq 0 ] || { fail "cedar env --json exited $rc"; cat "$tmp/env.json.err" >&2; }
expect_grep "$tmp/env.json" '"starpu"' "json: starpu key"
expect_grep "$tmp/env.json" '"hwloc"' "json: hwloc key"
expect_grep "$tmp/env.json" '"cuda_devices"' "json: cuda_devices key"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if command -v "$py" >/dev/null 2>&1; then
  "$py" - "$tmp/env.json" <<'PY' || fail "json: structure check failed"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["cedar"]["version"], "cedar.version"
assert d["libraries"]["starpu"]["version"], "starpu version"
assert d["libraries"]["hwloc"]["api_runtime"], "hwloc version"
assert d["topology"]["pus"] >= 1, "topology.pus"
assert len(d["starpu"]["workers"]) >= 1, "starpu.workers"
cu = d["cuda_devices"]
assert cu["devices"] or cu["error_name"].startswith(("cudaError", "not built with CUDA")) \
    or cu["count"] == 0, "cuda_devices: neither devices nor a reason"
k = d["cuda_kernels"]
assert k["ops_total"] >= 1 and k["op_groups_total"] >= 1, "cuda_kernels totals"
assert isinstance(k["ops"], list) and isinstance(k["op_groups"], list), "cuda_kernels lists"
assert k["runs_nodes"] or k["why_not"], "cuda_kernels: neither runs_nodes nor a reason"
PY
fi

"$cedar" env --help >"$tmp/help.txt" 2>&1 || fail "cedar env --help exited $?"
expect_grep "$tmp/help.txt" '--json' "env --help mentions --json"
"$cedar" env --no-such-flag >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "cedar env --no-such-flag exited $rc, expected 2"
"$cedar" env extra-arg >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "cedar env extra-arg exited $rc, expected 2"

"$cedar" --help >"$tmp/top.txt" 2>&1 || fail "cedar --help exited $?"
expect_grep "$tmp/top.txt" '^  env ' "cedar --help lists env"
"$cedar" version >"$tmp/ver.txt" 2>&1 || fail "cedar version exited $?"
expect_grep "$tmp/ver.txt" '^cedar [0-9]+\.[0-9]+\.[0-9]+' "cedar version"

if [ "$fails" -ne 0 ]; then
  echo "env.sh: $fails failure(s)" >&2
  exit 1
fi
echo "env.sh: ok"

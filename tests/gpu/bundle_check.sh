#!/usr/bin/env bash
# bundle_check.sh: what can be checked of the GPU bundle on a machine
# without a GPU (ctest gpu_bundle; skips, 77, when gpu-bundle/ is not built).
#
#  - the folder is at most 60 MiB and has the binaries run.sh calls;
#  - with no Debian library reachable: the bundle's cedar is started through
#    the dynamic loader with ld.so.cache off and a library path of only
#    gpu-bundle/lib, a folder holding links to glibc's own libraries (what
#    any Linux has) and CUDA's lib64 (cuBLAS: the GPU machine's CUDA gives
#    it), so a dependency the bundle lacks fails to load;
#    LD_LIBRARY_PATH is emptied. `cedar env` runs that way, and
#    `cedar run` on v41-mini gives the same tokens as the regular build's
#    cedar (argument 1) on the CPU;
#  - the bundle's test_devstate runs the same way (its device half refuses:
#    no GPU here).
# Run: bash tests/gpu/bundle_check.sh build/cedar (from the repository root).
set -u
ref=${1:?usage: bundle_check.sh /path/to/regular/cedar}
B=${GPU_BUNDLE:-gpu-bundle}
[ -x "$B/bin/cedar" ] || { echo "bundle_check: no $B/bin/cedar (tests/gpu/bundle.sh builds it): skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

total=$(du -sb "$B" | cut -f1)
[ "$total" -le $((60 * 1024 * 1024)) ] || fail "bundle is $total bytes, over 60 MiB"
for b in cedar test_backend_ops test_devstate test_gpu_graph test_gpu_compress_step test_gpu_attn_speed \
  test_gpu_bandwidth test_gpu_qlinear; do [ -x "$B/bin/$b" ] || fail "no $B/bin/$b"; done

# glibc's libraries only, by their sonames, from where this system keeps them.
mkdir -p "$tmp/glibc"
for so in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
  p=$(ldconfig -p | awk -v n="$so" '$1 == n && /x86-64/ {print $NF; exit}')
  [ -n "$p" ] && ln -s "$p" "$tmp/glibc/$so"
done
loader=/lib64/ld-linux-x86-64.so.2
# CUDA 13's cuBLAS comes from the GPU machine's CUDA, as in run.sh.
cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
scrubbed() { env -u LD_LIBRARY_PATH HWLOC_COMPONENTS=-pci "$loader" --inhibit-cache --library-path "$B/lib:$tmp/glibc:$cuda_lib" "$@"; }

scrubbed "$B/bin/cedar" env >"$tmp/env.txt" 2>&1 || { fail "bundle cedar env failed without system libraries:"; sed 's/^/  | /' "$tmp/env.txt" >&2; }
grep -q '^CUDA devices:' "$tmp/env.txt" || fail "bundle cedar env: no CUDA section"
grep -q 'StarPU.*with CUDA' "$tmp/env.txt" || fail "bundle cedar env: StarPU is not the CUDA build"

args=(run --plan plans/v41-mini.yaml --prompt-len 12 --max-new 4 --json)
scrubbed "$B/bin/cedar" "${args[@]}" >"$tmp/b.json" 2>"$tmp/b.err" || { fail "bundle cedar run failed:"; sed 's/^/  | /' "$tmp/b.err" >&2; }
HWLOC_COMPONENTS=-pci "$ref" "${args[@]}" >"$tmp/r.json" 2>"$tmp/r.err" || { fail "reference cedar run failed"; cat "$tmp/r.err" >&2; }
/usr/bin/python3 - "$tmp/b.json" "$tmp/r.json" <<'PY' || fail "bundle and reference tokens differ"
import json, sys
b, r = (json.load(open(p))["tokens"] for p in sys.argv[1:3])
print(f"bundle tokens {b}, reference {r}")
sys.exit(0 if b == r and len(b) == 4 else 1)
PY

scrubbed "$B/bin/test_devstate" >"$tmp/ds.txt" 2>&1 || { fail "bundle test_devstate failed:"; sed 's/^/  | /' "$tmp/ds.txt" >&2; }

if [ "$fails" -ne 0 ]; then
  echo "bundle_check: $fails failure(s)" >&2
  exit 1
fi
echo "bundle_check: ok ($((total / 1024 / 1024)) MiB, runs without Debian's libraries, tokens as the regular build)"

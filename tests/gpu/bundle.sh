#!/usr/bin/env bash
# tests/gpu/bundle.sh: build, on this machine, the folder the GPU machine
# runs: cedar and the test programs tests/gpu/run.sh calls, built for CUDA
# against StarPU-CUDA (.ci/starpu-cuda.sh), plus every shared library they
# need that is not the C library or the CUDA driver, so it runs where there
# are CUDA, CMake and Python but no Debian libraries and no network.
#
#   tests/gpu/bundle.sh [OUT]     default OUT: gpu-bundle/ (git-ignored), at most 60 MiB
#
#   OUT/bin/   cedar, test_backend_ops, test_devstate, test_gpu_graph, test_gpu_compress_step,
#              test_gpu_attn_speed, test_gpu_bandwidth, test_gpu_qlinear (stripped)
#   OUT/lib/   the ldd closure of those, minus glibc's own libraries and libcuda
#              (the driver's): StarPU-CUDA, hwloc, libyaml, OpenBLAS (+ gfortran,
#              quadmath), cJSON, xxHash, PCRE2, utf8proc, libcudart 13, ...
#   OUT/MANIFEST  each file, its size and where it came from
#
# The binaries find OUT/lib through LD_LIBRARY_PATH (run.sh sets it; this
# machine has no patchelf to rewrite RPATHs). cuBLAS and cuSPARSE are not
# carried (600 MB and 160 MB): the GPU machine's CUDA 13 gives them
# (CUDA_HOME/lib64 on run.sh's path); the CUDA runtime (libcudart.so.13,
# 0.7 MB) is carried. Built with -DCEDAR_WITH_MPI=OFF (StarPU-CUDA is built
# without MPI) and -DCEDAR_NCCL=OFF (libnccl is 200+ MB; one GPU there).
#
# Checks before it says ok: every binary's dependencies resolve from OUT/lib
# alone (ldd with LD_LIBRARY_PATH=OUT/lib and the system's library paths
# left out of the answer), and the total is under the 60 MiB the device
# call carries. Test it here: tests/gpu/bundle_check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$root/gpu-bundle}
PREFIX=${STARPU_CUDA_PREFIX:-$root/.deps/starpu-cuda}
BUILD=${BUNDLE_BUILD:-$root/build-gpu}
LIMIT=$((60 * 1024 * 1024))
export PATH=/usr/local/cuda/bin:$PATH

[ -f "$PREFIX/lib/pkgconfig/starpu-1.3.pc" ] || {
  echo "bundle: no StarPU-CUDA at $PREFIX; run .ci/starpu-cuda.sh first (or set STARPU_CUDA_PREFIX)" >&2
  exit 1
}
grep -q '^#define STARPU_USE_CUDA 1' "$PREFIX/include/starpu/1.3/starpu_config.h" ||
  { echo "bundle: $PREFIX is a StarPU without CUDA" >&2; exit 1; }

# 1. cedar for CUDA against StarPU-CUDA.
# The default build type (the numbers of the regular build), no RPATH: the
# binaries must find their libraries in the bundle, never in this tree.
CMAKE_LAUNCHER=${CMAKE_LAUNCHER-$(command -v ccache || true)}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
mkdir -p "$BUILD"
PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig cmake -S "$root" -B "$BUILD" -DCEDAR_CUDA=ON -DCEDAR_WITH_MPI=OFF \
  -DCEDAR_NCCL=OFF -DCMAKE_SKIP_RPATH=ON ${CMAKE_LAUNCHER:+-DCMAKE_C_COMPILER_LAUNCHER=$CMAKE_LAUNCHER \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=$CMAKE_LAUNCHER} >"$BUILD/bundle-configure.log" 2>&1 ||
  { tail -30 "$BUILD/bundle-configure.log" >&2; exit 1; }
bins=(cedar test_backend_ops test_devstate test_gpu_graph test_gpu_compress_step test_gpu_attn_speed test_gpu_bandwidth
  test_gpu_qlinear)
nice cmake --build "$BUILD" -j"${JOBS:-2}" --target "${bins[@]}" >"$BUILD/bundle-build.log" 2>&1 ||
  { tail -40 "$BUILD/bundle-build.log" >&2; exit 1; }

# 2. The folder.
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for b in "${bins[@]}"; do
  f=$(find "$BUILD" -name "$b" -type f -perm -u+x | head -1)
  [ -n "$f" ] || { echo "bundle: $b was not built" >&2; exit 1; }
  cp "$f" "$OUT/bin/$b"
  strip "$OUT/bin/$b"
done

# Libraries that every Linux with a CUDA driver has (glibc's, the driver's),
# and CUDA 13's own large libraries, which come from the GPU machine's CUDA
# (CUDA_HOME/lib64, run.sh puts it on the path): cuBLAS and cuBLASLt
# (600 MB; cedar's linear layers), cuSPARSE and the nvJitLink it loads
# (StarPU-CUDA links cuSPARSE when configure finds it), NCCL (218 MB; off
# in this build anyway).
system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libcuda.so.*) return 0 ;;
    libcublas.so.*|libcublasLt.so.*|libcusparse.so.*|libnvJitLink.so.*|libnccl.so.*) return 0 ;;
  esac
  return 1
}
declare -A seen=()
queue=("$OUT"/bin/*)
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  while read -r name _ path _; do
    [ -n "$name" ] || continue
    system_lib "$name" && continue
    [ -n "${seen[$name]:-}" ] && continue
    if [ "$path" = "not" ] || [ ! -f "$path" ]; then
      echo "bundle: $f needs $name, which ldd cannot find here" >&2
      exit 1
    fi
    seen[$name]=$path
    cp -L "$path" "$OUT/lib/$name"
    chmod u+w "$OUT/lib/$name"
    strip --strip-unneeded "$OUT/lib/$name" 2>/dev/null || true
    queue+=("$OUT/lib/$name")
  done < <(LD_LIBRARY_PATH=$PREFIX/lib ldd "$f" | awk '/=>/ {print $1, $2, $3, $4}')
done

# 3. Checks: resolves from OUT/lib alone; under the limit.
bad=0
for f in "$OUT"/bin/* "$OUT"/lib/*; do
  while read -r name _ path _; do
    system_lib "$name" && continue
    case "$path" in
      "$OUT"/lib/*) ;;
      *) echo "bundle: $(basename "$f") resolves $name to $path, outside the bundle" >&2; bad=1 ;;
    esac
  done < <(LD_LIBRARY_PATH=$OUT/lib ldd "$f" | awk '/=>/ {print $1, $2, $3, $4}')
done
[ $bad = 0 ] || exit 1
{
  echo "# gpu-bundle built $(date -u +%FT%TZ) from $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
  for b in "${bins[@]}"; do echo "bin/$b $(stat -c %s "$OUT/bin/$b")"; done
  for n in "${!seen[@]}"; do echo "lib/$n $(stat -c %s "$OUT/lib/$n") ${seen[$n]}"; done | sort
} >"$OUT/MANIFEST"
total=$(du -sb "$OUT" | cut -f1)
echo "bundle: $OUT: $(ls "$OUT/lib" | wc -l) libraries, $((total / 1024 / 1024)) MiB ($total bytes; limit 60 MiB)"
[ "$total" -le "$LIMIT" ] || { echo "bundle: over 60 MiB" >&2; exit 1; }

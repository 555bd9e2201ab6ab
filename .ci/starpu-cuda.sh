#!/usr/bin/env bash
# .ci/starpu-cuda.sh: build StarPU 1.3.10 with CUDA 13 from Debian's source
# package into a prefix that cedar's CMake finds through pkg-config.
#
#   .ci/starpu-cuda.sh [PREFIX]        default PREFIX: .deps/starpu-cuda (git-ignored)
#   PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cmake -S . -B build-cuda -DCEDAR_CUDA=ON -DCEDAR_USE_MPI=OFF
#
# Why: Debian's libstarpu is CPU-only (no CUDA workers, no CUDA memory node).
# The source is Debian's own (`apt-get source starpu=1.3.10+dfsg-2`) fetched
# through a private sources list and a private apt state directory under
# WORK, so the system's apt lists, cache and lock are never touched.
#
# What it changes in StarPU, each a small sed with a check that it applied
# (so a different source fails loudly instead of building something else):
#   - cudaDeviceProp::computeMode is gone in CUDA 13: driver_cuda.c asks
#     cudaDeviceGetAttribute(cudaDevAttrComputeMode) instead;
#   - cudaThreadExit() is gone in CUDA 13: perfmodel_bus.c names it only in
#     a pre-CUDA-4 #else branch that never compiles; it becomes
#     cudaDeviceReset(), its documented replacement, so the name is gone;
#   - CUDA 13's cublas_v2.h is an error after the legacy cublas.h, which
#     driver_cuda.h includes and starpu_cublas.c uses (cublasInit,
#     cublasSetKernelStream, cublasShutdown): the header includes cublas_v2.h
#     and those calls become their per-handle equivalents (cublasSetStream on
#     the worker's handle; init and shutdown are the handles' own);
#   - Debian's NVCCFLAGS (-std=c++03) are not used: CUDA 13's headers need
#     C++17, so NVCCFLAGS is set here.
# Configured without MPI, OpenCL, FxT, Fortran, docs, examples and tests:
# cedar's bundle (tests/gpu/bundle.sh) carries only libstarpu-1.3 and hwloc.
# configure finds cuBLAS and cuSPARSE beside CUDA and links them; the bundle
# takes both from the GPU machine's CUDA 13.
#
# Time on this machine (2 cores shared with other builds): see docs/cuda.md.
# Not a CI stage: CI compiles cedar's CUDA code against Debian's CPU StarPU
# (docs/cuda.md says why); this script is for the GPU bundle.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${1:-$root/.deps/starpu-cuda}
WORK=${STARPU_WORK:-$root/.deps/starpu-work}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-2}
VERSION=1.3.10+dfsg-2

[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "starpu-cuda: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME)" >&2; exit 1; }
command -v dpkg-source >/dev/null || { echo "starpu-cuda: dpkg-source missing (apt-get install dpkg-dev)" >&2; exit 1; }
mkdir -p "$WORK"
cd "$WORK"
t0=$SECONDS

# 1. Debian's source, through apt state of our own.
src=$WORK/starpu-1.3.10+dfsg
if [ ! -f "$src/configure.ac" ]; then
  mkdir -p apt/etc apt/lists/partial apt/cache/archives/partial
  echo "deb-src http://deb.debian.org/debian bookworm main" > apt/etc/sources.list
  APT=(apt-get -q -o "Dir::Etc::SourceList=$WORK/apt/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache" -o Debug::NoLocking=1)
  "${APT[@]}" update
  "${APT[@]}" source "starpu=$VERSION"
fi

# 2. The CUDA 13 fixes, each checked.
fix() { # file, sed expression, text that must be present afterwards (a file already fixed is left alone)
  grep -q -- "$3" "$src/$1" && return 0
  sed -i "$2" "$src/$1"
  grep -q -- "$3" "$src/$1" || { echo "starpu-cuda: fix did not apply to $1 ($3)" >&2; exit 1; }
}
fix src/drivers/cuda/driver_cuda.c \
  's/if (props\[devid\]\.computeMode == cudaComputeModeExclusive)/int _cedar_cm = 0; cudaDeviceGetAttribute(\&_cedar_cm, cudaDevAttrComputeMode, devid); if (_cedar_cm == cudaComputeModeExclusive)/' \
  'cudaDevAttrComputeMode'
fix src/core/perfmodel/perfmodel_bus.c 's/cudaThreadExit()/cudaDeviceReset()/' 'cudaDeviceReset()'
# CUDA 13's cublas_v2.h refuses to be included after the legacy cublas.h,
# and StarPU includes both (driver_cuda.h the legacy one, starpu_cublas.c
# both): the driver header takes cublas_v2.h (it calls no cuBLAS), and
# starpu_cublas.c's legacy calls become their handle equivalents.
fix src/drivers/cuda/driver_cuda.h 's|#include <cublas.h>|#include <cublas_v2.h>|' '#include <cublas_v2.h>'
fix src/drivers/cuda/starpu_cublas.c \
  '/^#include <cublas.h>$/d
   s|cublasStatus cublasst = cublasInit();|cublasStatus_t cublasst = CUBLAS_STATUS_SUCCESS; /* cedar: no legacy cublasInit in CUDA 13 beside cublas_v2.h */|
   s|cublasShutdown();|(void)0; /* cedar: no legacy cublasShutdown */|
   s|cublasSetKernelStream(starpu_cuda_get_local_stream());|cublasSetStream(starpu_cublas_get_local_handle(), starpu_cuda_get_local_stream());|g' \
  'no legacy cublasInit in CUDA 13'
if grep -nE 'cublasInit\(|cublasShutdown\(|cublasSetKernelStream\(|#include <cublas.h>' "$src/src/drivers/cuda/starpu_cublas.c" \
     "$src/src/drivers/cuda/driver_cuda.h"; then
  echo "starpu-cuda: legacy cuBLAS calls left (above)" >&2; exit 1
fi
# Code lines (not comments) still naming a CUDA 13 removal fail the build here.
if grep -rnE '^[[:space:]]*[^/*[:space:]].*(cudaThreadExit\(\)|\.computeMode\b)' "$src/src" --include=*.c; then
  echo "starpu-cuda: CUDA 13 removals left in the source (above)" >&2; exit 1
fi

# 3. Configure and build out of tree.
cd "$src"
[ -x configure ] || autoreconf -fi >/dev/null
mkdir -p "$WORK/build"
cd "$WORK/build"
if [ ! -f Makefile ]; then
  NVCCFLAGS="-std=c++17 -Xcompiler -fPIC -arch=sm_90" \
  "$src/configure" --prefix="$PREFIX" --with-cuda-dir="$CUDA_HOME" \
    --disable-opencl --disable-mpi --disable-fortran --disable-openmp \
    --disable-starpufft --disable-build-doc --disable-build-examples \
    --disable-build-tests --without-fxt --disable-glpk --enable-blas-lib=none >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
fi
grep -q '^#define STARPU_USE_CUDA 1' src/common/config.h ||
  { echo "starpu-cuda: configure did not enable CUDA (see $WORK/build/configure.log)" >&2; exit 1; }
nice make -j"$JOBS" -s >make.log 2>&1 || { tail -60 make.log >&2; exit 1; }
make -s install >>make.log 2>&1
grep -q STARPU_USE_CUDA "$PREFIX/include/starpu/1.3/starpu_config.h"
echo "starpu-cuda: StarPU 1.3.10 with CUDA in $PREFIX ($((SECONDS - t0)) s)"
echo "starpu-cuda: PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig"

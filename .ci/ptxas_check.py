#!/usr/bin/env python3
"""ptxas_check.py: compile every CUDA source for sm_90a with warnings as
errors, record each kernel's registers, stack and spills from ptxas
(-Xptxas -v), and fail when any kernel spills.

    ptxas_check.py [--nvcc NVCC] [--launcher ccache] [--json OUT.json] [-I DIR]... FILE.cu...
    ptxas_check.py --selftest [--nvcc NVCC]

Each FILE.cu is compiled on its own to a cubin (nothing is linked) with
    nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -cubin
         -Werror all-warnings -Xcompiler=-Wall,-Wextra,-Werror -Xptxas -v
so a warning from the front end, the host compiler or ptxas fails the file.
ptxas prints, per entry function,
    ptxas info    : Compiling entry function '_Z..' for 'sm_90a'
    ptxas info    : Function properties for _Z..
        N bytes stack frame, S bytes spill stores, L bytes spill loads
    ptxas info    : Used R registers, ...
and this script keeps (file, kernel, registers, stack, spill stores, spill
loads) for each, prints a table, writes it as JSON with --json, and exits 1
when a kernel has S or L > 0 (naming it), 2 when a file does not compile.

--selftest compiles two kernels written here: one that keeps 64 values live
under -maxrregcount=32 (it must be reported as spilling and fail the check)
and a plain one (it must pass), so the check is known to be able to fail.

CTest: ptxas_spills (cedar's .cu files) and ptxas_selftest. CI runs both.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ARCH = ["-gencode", "arch=compute_90a,code=sm_90a"]
FLAGS = ["-std=c++17", "-cubin", "-Werror", "all-warnings", "-Xcompiler=-Wall,-Wextra,-Werror", "-Xptxas", "-v"]

RE_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
RE_PROPS = re.compile(r"Function properties for (\S+)")
RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_REGS = re.compile(r"Used (\d+) registers")


def demangle(names):
    """Readable names through c++filt when present; the mangled ones otherwise."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def parse(text):
    """ptxas -v output -> [{kernel, arch, registers, stack, spill_stores, spill_loads}] for entry functions."""
    kernels, by_name, props_for = [], {}, None
    for line in text.splitlines():
        m = RE_ENTRY.search(line)
        if m:
            k = {"kernel": m.group(1), "arch": m.group(2), "registers": None, "stack": 0,
                 "spill_stores": 0, "spill_loads": 0}
            kernels.append(k)
            by_name[m.group(1)] = k
            props_for = None
            continue
        m = RE_PROPS.search(line)
        if m:
            props_for = by_name.get(m.group(1))  # device functions have properties too; keep entries only
            continue
        m = RE_STACK.search(line)
        if m and props_for is not None:
            props_for["stack"], props_for["spill_stores"], props_for["spill_loads"] = map(int, m.groups())
            continue
        m = RE_REGS.search(line)
        if m and kernels and kernels[-1]["registers"] is None:
            kernels[-1]["registers"] = int(m.group(1))
    return kernels


LAUNCHER = []  # e.g. ["ccache"]: --launcher, CMake's CMAKE_CUDA_COMPILER_LAUNCHER


def compile_one(nvcc, src, includes, extra):
    with tempfile.TemporaryDirectory() as d:
        cmd = [*LAUNCHER, nvcc, *ARCH, *FLAGS, *extra, *[f"-I{i}" for i in includes], "-o", os.path.join(d, "k.cubin"), src]
        p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr, cmd


def check(nvcc, files, includes, extra=(), quiet=False):
    """(status, rows, failures): status 0 clean, 1 spills, 2 a file failed to compile."""
    rows, fails, status = [], [], 0
    for src in files:
        rc, out, cmd = compile_one(nvcc, src, includes, list(extra))
        if rc != 0:
            fails.append(f"{src}: nvcc failed (exit {rc}); warnings are errors here:\n  {' '.join(cmd)}\n{out}")
            status = 2
            continue
        ks = parse(out)
        for k, name in zip(ks, demangle([k["kernel"] for k in ks])):
            k["file"], k["name"] = src, name
            rows.append(k)
            if k["spill_stores"] or k["spill_loads"]:
                fails.append(f"{src}: kernel {name} spills ({k['spill_stores']} bytes stored, {k['spill_loads']} "
                             f"loaded, {k['registers']} registers): cut its live values or split it")
                status = max(status, 1)
    if not quiet:
        print(f"{'registers':>9} {'stack':>6} {'spill st':>8} {'spill ld':>8}  kernel (file)")
        for k in rows:
            print(f"{k['registers'] or 0:>9} {k['stack']:>6} {k['spill_stores']:>8} {k['spill_loads']:>8}  "
                  f"{k['name']} ({os.path.relpath(k['file'])})")
        print(f"ptxas_check: {len(rows)} kernels in {len(files)} files, "
              f"{sum(1 for k in rows if k['spill_stores'] or k['spill_loads'])} spilling")
    return status, rows, fails


SPILL_SRC = r"""
// Deliberately spills: 64 live floats under -maxrregcount=32.
__global__ void cedar_selftest_spills(float *out, const float *in, int n) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; i++) v[i] = in[(threadIdx.x * 64 + i) % n] * (float)(i + 1);
  float acc = 0.f;
#pragma unroll
  for (int r = 0; r < 8; r++)
#pragma unroll
    for (int i = 0; i < 64; i++) acc += v[i] * v[(i + r * 7) & 63];
  out[threadIdx.x] = acc;
}
"""
CLEAN_SRC = r"""
__global__ void cedar_selftest_clean(float *out, const float *in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2.f * in[i];
}
"""


def selftest(nvcc):
    ok = True
    with tempfile.TemporaryDirectory() as d:
        spill, clean = os.path.join(d, "spill.cu"), os.path.join(d, "clean.cu")
        open(spill, "w").write(SPILL_SRC)
        open(clean, "w").write(CLEAN_SRC)
        st, rows, fails = check(nvcc, [spill], [], ["-maxrregcount=32"], quiet=True)
        if st != 1 or not rows or not any("cedar_selftest_spills" in f for f in fails):
            print(f"selftest FAIL: the spilling kernel was not caught (status {st}, rows {rows}, {fails})")
            ok = False
        else:
            print(f"selftest: spilling kernel caught: {fails[0]}")
        st, rows, fails = check(nvcc, [clean], [], quiet=True)
        if st != 0 or len(rows) != 1 or rows[0]["registers"] is None:
            print(f"selftest FAIL: the clean kernel was not passed with its registers (status {st}, {rows}, {fails})")
            ok = False
        else:
            print(f"selftest: clean kernel passes ({rows[0]['registers']} registers)")
        bad = os.path.join(d, "warn.cu")
        open(bad, "w").write("__global__ void w(float *o) { int unused = 3; o[0] = 1.f; }\n")
        st, _, _ = check(nvcc, [bad], [], quiet=True)
        if st != 2:
            print(f"selftest FAIL: a warning did not fail the compile (status {st})")
            ok = False
        else:
            print("selftest: a warning fails the compile")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--json")
    ap.add_argument("--launcher", default="", help="a compiler launcher such as ccache (empty: none)")
    ap.add_argument("-I", dest="includes", action="append", default=[])
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    if a.launcher:
        LAUNCHER[:] = [a.launcher]
    if a.selftest:
        return selftest(a.nvcc)
    if not a.files:
        print("ptxas_check: no .cu files given")
        return 0
    st, rows, fails = check(a.nvcc, a.files, a.includes)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arch": "sm_90a", "kernels": rows}, f, indent=1)
    for f in fails:
        print("FAIL:", f)
    return st


if __name__ == "__main__":
    sys.exit(main())

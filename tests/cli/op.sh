#!/usr/bin/env bash
# op.sh: `cedar op` end to end: tensors written by an independent safetensors
# writer (Python + NumPy, below), run through cedar, read back and compared
# with NumPy in float64. Also the error paths: missing tensor, wrong dtype,
# unknown parameter, damaged file.
# Usage: bash tests/cli/op.sh path/to/cedar   (from the repo root)
set -euo pipefail
cedar=$1
py=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }
$py -c 'import numpy' 2> /dev/null || { echo "numpy missing for /usr/bin/python3"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/st.py" <<'PY'
import json, struct, sys
import numpy as np
DT = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "F64": np.float64}
def save(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        dt = {np.dtype(v): k for k, v in DT.items()}[arr.dtype]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], DT[v["dtype"]]).reshape(v["shape"])
            for k, v in header.items() if k != "__metadata__"}
PY

# Inputs for rmsnorm, linear, embed.
$py - "$tmp" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); from st import save
import numpy as np
r = np.random.default_rng(7)
x = r.uniform(-2, 2, (5, 37)).astype(np.float32)
save(sys.argv[1] + "/in.st", {"x": x, "gamma": r.uniform(0.5, 1.5, 37).astype(np.float32),
     "w": r.uniform(-1, 1, (11, 37)).astype(np.float32), "table": r.uniform(-1, 1, (9, 6)).astype(np.float32),
     "tokens": np.array([3, 0, 8, 3], np.int32)})
save(sys.argv[1] + "/bad_tok.st", {"table": np.ones((9, 2), np.float32), "tokens": np.array([1, 9], np.int32)})
PY
"$cedar" op rmsnorm --in "$tmp/in.st" --out "$tmp/rms.st" --param eps=1e-5 > /dev/null
"$cedar" op linear --in "$tmp/in.st" --out "$tmp/lin.st" --json > "$tmp/lin.json"
"$cedar" op embed --in "$tmp/in.st" --out "$tmp/emb.st" > /dev/null
$py - "$tmp" <<'PY' || fail "outputs differ from NumPy"
import sys, json; sys.path.insert(0, sys.argv[1]); from st import load
import numpy as np
t = sys.argv[1]; i = load(t + "/in.st")
x = i["x"].astype(np.float64)
ref = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-5) * i["gamma"]
got = load(t + "/rms.st")["out"]
# fp32 sum of 37 squares, then sqrt, divide, multiply: gamma(37 + 4) relative.
u = 2.0 ** -24; tol = 41 * u / (1 - 41 * u)
assert np.all(np.abs(got - ref) <= tol * np.abs(ref) + 1e-30), "rmsnorm"
w = i["w"].astype(np.float64)
ref = x @ w.T; absref = np.abs(x) @ np.abs(w).T
got = load(t + "/lin.st")["y"]
assert got.shape == (5, 11)
assert np.all(np.abs(got - ref) <= 37 * u / (1 - 37 * u) * absref), "linear"   # gamma(K) sum|x||w|
assert json.load(open(t + "/lin.json"))["outputs"][0] == {"name": "y", "dtype": "F32", "shape": [5, 11]}
emb = load(t + "/emb.st")["out"]
assert np.array_equal(emb, i["table"][[3, 0, 8, 3]]), "embed is a bitwise copy"
PY

# Errors: each exits 1 with a message naming the problem, and writes nothing.
expect_err() {  # expect_err CODE PATTERN cmd...
  local code=$1 pat=$2; shift 2
  local rc=0; "$@" > /dev/null 2> "$tmp/err.txt" || rc=$?
  [ "$rc" -eq "$code" ] || fail "$* exited $rc, not $code"
  grep -q "$pat" "$tmp/err.txt" || { cat "$tmp/err.txt" >&2; fail "$*: no '$pat'"; }
}
expect_err 1 "input 'x' must be F32 with 3 dims" "$cedar" op rope --in "$tmp/in.st" --out "$tmp/x.st"
$py - "$tmp" <<'PY'
import sys; sys.path.insert(0, sys.argv[1]); from st import save
import numpy as np
save(sys.argv[1] + "/only_x.st", {"x": np.ones((2, 3), np.float32), "table": np.ones((4, 2), np.float64)})
PY
expect_err 1 "missing input tensor 'gamma'" "$cedar" op rmsnorm --in "$tmp/only_x.st" --out "$tmp/x.st"
expect_err 1 "table' has dtype F64" "$cedar" op embed --in "$tmp/only_x.st" --out "$tmp/x.st"
expect_err 1 "token 9 at position 1 is outside the vocabulary" "$cedar" op embed --in "$tmp/bad_tok.st" --out "$tmp/x.st"
expect_err 2 "has no parameter 'epz'" "$cedar" op rmsnorm --in "$tmp/in.st" --out "$tmp/x.st" --param epz=1
expect_err 2 "unknown op 'nope'" "$cedar" op nope
expect_err 2 "needs --in and --out" "$cedar" op linear --in "$tmp/in.st"
head -c 20 "$tmp/in.st" > "$tmp/short.st"
expect_err 1 "short.st" "$cedar" op linear --in "$tmp/short.st" --out "$tmp/x.st"
[ ! -e "$tmp/x.st" ] || fail "a failed op wrote its output file"

# --list names every op, and each op's --help names its inputs.
"$cedar" op --list | grep -q '^rope ' || fail "--list"
for op in $("$cedar" op --list | awk '{print $1}'); do
  "$cedar" op "$op" --help | grep -q "^usage: cedar op $op" || fail "$op --help"
done
echo "op: ok"

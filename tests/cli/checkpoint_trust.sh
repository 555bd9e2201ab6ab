#!/usr/bin/env bash
# checkpoint_trust.sh: what a checkpoint directory or weights file must not
# be trusted with (issue 28 rows 3, 9, 15; runtime/load/ckpt_write.c,
# runtime/load/checkpoint.c, runtime/load/weights_finite.c, runtime/load/ckpt_config.c).
#
#  1. rewriting a checkpoint replaces the whole set: seed 1 sharded, then
#     seed 2 as one model.safetensors into the same DIR leaves no index and
#     no shard, and the file equals a fresh seed-2 write; the reverse leaves
#     no model.safetensors; a file that is not a checkpoint's is kept;
#  2. a directory holding both model.safetensors and an index that does not
#     name it is refused by `weights check` and `run --model`, naming both;
#  3. `weights check` refuses non-finite values: a NaN in a norm of a cedar
#     weights file, the E8M0 scale 0xFF in a checkpoint shard (both without
#     content hashes, as a file from elsewhere comes; without the damage the
#     same files pass), naming the file and tensor; `--hash` records no hash
#     for them (the files stay byte for byte);
#  4. config.json: a string `rope_scaling`, a string `text_config` and a key
#     given twice are refused by `plan import`, naming the key; the
#     generator's own config imports.
# Run from the repository root: bash tests/cli/checkpoint_trust.sh build/cedar (~20 s)
set -euo pipefail
cedar=${1:?usage: checkpoint_trust.sh /path/to/cedar}
plan=tests/plans/ckpt-small.yaml
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_exit() {
  local want=$1 got=0
  shift
  "$cedar" "$@" > "$tmp/out" 2> "$tmp/err" || got=$?
  [ "$got" = "$want" ] || { cat "$tmp/out" "$tmp/err" >&2; fail "cedar $* exited $got, want $want"; }
}
init() { expect_exit 0 weights init --layout released --plan "$plan" --seed "$1" --shard-bytes "$2" --out "$3"; }
# st_edit FILE [TENSOR ELEMENT HEXBYTES]: drop the cedar.hash.* metadata, and patch bytes at an element of a tensor
st_edit() {
  "$py" - "$@" <<'PY'
import json, struct, sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = b[8 + n:]
if len(sys.argv) > 2:
    name, elem, raw = sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
    t = h[name]
    at = t["data_offsets"][0] + elem * len(raw)
    data[at:at + len(raw)] = raw
h["__metadata__"] = {k: v for k, v in h.get("__metadata__", {}).items() if not k.startswith("cedar.hash.")}
head = json.dumps(h, separators=(",", ":")).encode()
head += b" " * (-len(head) % 8)
open(path, "wb").write(struct.pack("<Q", len(head)) + head + bytes(data))
PY
}
# shard_with DIR DTYPE: a shard file of DIR and the name of its first tensor of DTYPE
shard_with() {
  "$py" - "$1" "$2" <<'PY'
import glob, json, struct, sys
for p in sorted(glob.glob(sys.argv[1] + "/model*.safetensors")):
    f = open(p, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    for k, v in h.items():
        if k != "__metadata__" and v["dtype"] == sys.argv[2]:
            print(p, k)
            sys.exit(0)
sys.exit(1)
PY
}

# 1. the writer replaces the whole set
init 1 1M "$tmp/d"
echo keep > "$tmp/d/tokenizer.json"
[ -f "$tmp/d/model.safetensors.index.json" ] || fail "the sharded write has no index"
init 2 0 "$tmp/d"
init 2 0 "$tmp/fresh2"
[ ! -e "$tmp/d/model.safetensors.index.json" ] || fail "the seed-1 index outlived the single-file rewrite"
ls "$tmp/d" | grep -q 'model-.*-of-' && fail "seed-1 shards outlived the rewrite: $(ls "$tmp/d")"
cmp -s "$tmp/d/model.safetensors" "$tmp/fresh2/model.safetensors" || fail "the rewritten file is not seed 2's"
[ "$(cat "$tmp/d/tokenizer.json")" = keep ] || fail "a file that is not the checkpoint's was removed"
ls -a "$tmp/d" | grep -q cedar-ckpt && fail "the writer's staging directory was left: $(ls -a "$tmp/d")"
expect_exit 0 weights check "$tmp/d"
init 3 1M "$tmp/d"
init 3 1M "$tmp/fresh3"
[ ! -e "$tmp/d/model.safetensors" ] || fail "the single file outlived the sharded rewrite"
for f in "$tmp"/fresh3/model-*; do cmp -s "$f" "$tmp/d/$(basename "$f")" || fail "$(basename "$f") is not seed 3's"; done
[ "$(ls "$tmp/d" | grep -c 'model-.*-of-')" = "$(ls "$tmp/fresh3" | grep -c 'model-.*-of-')" ] || fail "shard count"

# 2. the reader refuses two checkpoints' files in one directory
cp "$tmp/fresh2/model.safetensors" "$tmp/d/"
expect_exit 1 weights check "$tmp/d"
grep -q "both model.safetensors and model.safetensors.index.json" "$tmp/err" || fail "weights check: $(cat "$tmp/err")"
expect_exit 1 run --model "$tmp/d" --prompt-len 4 --max-new 1 --executor direct
grep -q "both model.safetensors and model.safetensors.index.json" "$tmp/err" || fail "run --model: $(cat "$tmp/err")"

# 3. non-finite values
expect_exit 0 weights init --plan "$plan" --seed 1 --out "$tmp/w.safetensors"
st_edit "$tmp/w.safetensors"
expect_exit 0 weights check --plan "$plan" "$tmp/w.safetensors" # no hashes, finite: valid
cp "$tmp/w.safetensors" "$tmp/nan.safetensors"
st_edit "$tmp/nan.safetensors" layers.0.attn_norm 3 0000c07f # F32 quiet NaN
cp "$tmp/nan.safetensors" "$tmp/nan.orig"
expect_exit 1 weights check --plan "$plan" "$tmp/nan.safetensors"
grep -q "layers.0.attn_norm: 1 value is not finite (NaN or infinity; the first at element 3)" "$tmp/err" ||
  fail "weights check of a NaN norm: $(cat "$tmp/err")"
expect_exit 1 weights check --plan "$plan" --hash "$tmp/nan.safetensors"
grep -q "no hash recorded" "$tmp/err" || fail "--hash on a NaN: $(cat "$tmp/err")"
cmp -s "$tmp/nan.safetensors" "$tmp/nan.orig" || fail "--hash rewrote a file with a NaN"
expect_exit 0 weights check --plan "$plan" --hash "$tmp/w.safetensors" # the finite file gets its hashes
grep -q "recorded [1-9]" "$tmp/err" || fail "--hash on a finite file: $(cat "$tmp/err")"

cp -r "$tmp/fresh3" "$tmp/e8"
read -r shard scale < <(shard_with "$tmp/e8" F8_E8M0) || fail "no E8M0 tensor in the checkpoint"
st_edit "$shard"
expect_exit 0 weights check "$tmp/e8" # no hashes in one shard, finite: valid
st_edit "$shard" "$scale" 1 ff
cp "$shard" "$tmp/shard.orig"
expect_exit 1 weights check "$tmp/e8"
grep -qF "$(basename "$shard"): $scale: 1 value is not finite (E8M0 scale 0xFF" "$tmp/err" ||
  fail "weights check of an E8M0 0xFF: $(cat "$tmp/err")"
expect_exit 1 weights check --hash "$tmp/e8"
grep -q "no hash recorded" "$tmp/err" || fail "--hash on 0xFF: $(cat "$tmp/err")"
cmp -s "$shard" "$tmp/shard.orig" || fail "--hash rewrote a shard with a 0xFF scale"

# 4. config.json types and duplicate keys
cfg=$tmp/fresh2/config.json
expect_exit 0 plan import "$cfg" -o "$tmp/p.yaml"
"$py" - "$cfg" "$tmp" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
d = sys.argv[2]
s = json.loads(json.dumps(c)); s["text_config"]["rope_scaling"] = "yarn"
json.dump(s, open(f"{d}/rope_str.json", "w"))
s = json.loads(json.dumps(c)); s["text_config"] = "config"
json.dump(s, open(f"{d}/tc_str.json", "w"))
text = json.dumps(c)
open(f"{d}/dup.json", "w").write(text.replace('"sliding_window": 128', '"sliding_window": 128, "sliding_window": 64', 1))
open(f"{d}/dup_top.json", "w").write(text.replace('"model_type"', '"model_type": "x", "model_type"', 1))
PY
grep -q '"sliding_window": 64' "$tmp/dup.json" || fail "the duplicate-key config was not made"
expect_exit 1 plan import "$tmp/rope_str.json"
grep -q '`rope_scaling` must be an object holding `factor`, not a string' "$tmp/err" || fail "rope_scaling: $(cat "$tmp/err")"
expect_exit 1 plan import "$tmp/tc_str.json"
grep -q '`text_config` must be an object, not a string' "$tmp/err" || fail "text_config: $(cat "$tmp/err")"
expect_exit 1 plan import "$tmp/dup.json"
grep -q '`sliding_window` is given twice in `text_config`' "$tmp/err" || fail "duplicate: $(cat "$tmp/err")"
expect_exit 1 plan import "$tmp/dup_top.json"
grep -q '`model_type` is given twice in the top level' "$tmp/err" || fail "duplicate at the top: $(cat "$tmp/err")"
echo "checkpoint_trust: rewrites replace the set, mixed sets and non-finite values are refused, config.json is typed"

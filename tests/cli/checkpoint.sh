#!/usr/bin/env bash
# checkpoint.sh: released-layout checkpoints through the cedar binary
# (docs/checkpoints.md; runtime/load/checkpoint.h, cli/cmd_plan_import.c,
# cli/cmd_weights_ckpt.c).
#
#  1. `weights init --layout released` writes config.json, >1 shards and the
#     index, plus the dequantized values as a cedar weights file;
#  2. `run --model DIR` gives exactly the tokens and logits (the --dump
#     files are byte-identical) of `run --plan P --weights W` with W the
#     dequantized values, where P is `plan import DIR/config.json`, on both
#     executors; and with --plan tests/plans/ckpt-small.yaml (checked
#     against the checkpoint) the same again; `run --model DIR --speculate
#     mtp` drafts with the released mtp.* tensors, tokens = plain greedy;
#     the NumPy oracle's own reader (tests/oracle/released.py) decodes the
#     checkpoint to the same bytes as cedar;
#  3. `plan import` round-trips: import -> `plan config` -> import gives
#     the same YAML, and `plan show --json` of both is the same;
#  4. `--model DIR --plan plans/v41-mini.yaml` is refused, naming the
#     mismatches; `weights check DIR` passes; a flipped byte is refused
#     naming the tensor; a shard without hashes passes and `--hash` records;
#  5. serve-sim and bench model take --model;
#  6. a killed writer's staging folder (.cedar-ckpt.tmp.<pid>, its pid
#     gone) is dropped by the next `weights init`; a live writer's is kept.
# Run from the repository root: bash tests/cli/checkpoint.sh build/cedar
set -euo pipefail

cedar=${1:?usage: checkpoint.sh /path/to/cedar}
plan=tests/plans/ckpt-small.yaml
py=/usr/bin/python3
[ -x "$py" ] || py=python3
[ -f "$plan" ] || { echo "FAIL: $plan is missing (run from the repository root)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_exit() {
  local want=$1 got=0
  shift
  "$cedar" "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  [ "$got" = "$want" ] || { cat "$tmp/err" >&2; fail "cedar $* exited $got, want $want"; }
}

# 1. the generator (and 6: staging folders of a dead and a live writer)
ck=$tmp/ck
sh -c 'exit 0' & dead=$!
wait "$dead"
mkdir -p "$ck/.cedar-ckpt.tmp.$dead" "$ck/.cedar-ckpt.tmp.$$"
echo partial >"$ck/.cedar-ckpt.tmp.$dead/model-00001-of-00002.safetensors"
expect_exit 0 weights init --layout released --plan "$plan" --seed 3 --out "$ck" --shard-bytes 3M \
  --dequant-out "$tmp/dq.safetensors" --json
"$py" - "$tmp/out" "$ck" <<'PYEOF' || fail "init --layout released"
import json, os, sys
j = json.load(open(sys.argv[1])); d = sys.argv[2]
assert j["layout"] == "released" and j["shards"] > 1, j
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
shards = sorted(set(idx["weight_map"].values()))
assert len(shards) == j["shards"] and all(os.path.exists(os.path.join(d, s)) for s in shards), shards
cfg = json.load(open(os.path.join(d, "config.json")))
assert cfg["model_type"] == "deepseek_v41" and cfg["text_config"]["num_hidden_layers"] == 6, cfg
assert "layers.3.ffn.experts.0.w1.weight" in idx["weight_map"] and "layers.3.ffn.experts.0.w1.scale" in idx["weight_map"]
assert "layers.1.attn.attn_sink" in idx["weight_map"] and "layers.1.ffn.gate.bias_vl" in idx["weight_map"]
PYEOF
[ ! -e "$ck/.cedar-ckpt.tmp.$dead" ] || fail "a dead writer's staging folder was left"
[ -d "$ck/.cedar-ckpt.tmp.$$" ] || fail "a live writer's staging folder was dropped"
rmdir "$ck/.cedar-ckpt.tmp.$$"

# 2. --model against --weights of the same dequantized values, bit for bit
expect_exit 0 plan import "$ck/config.json" -o "$tmp/imported.yaml"
for ex in direct starpu; do
  expect_exit 0 run --model "$ck" --prompt-len 200 --max-new 4 --executor $ex --dump "$tmp/m-$ex.st"
  expect_exit 0 run --plan "$tmp/imported.yaml" --weights "$tmp/dq.safetensors" --prompt-len 200 --max-new 4 \
    --executor $ex --dump "$tmp/w-$ex.st"
  cmp "$tmp/m-$ex.st" "$tmp/w-$ex.st" || fail "run --model and run --weights differ ($ex)"
done
cmp "$tmp/m-direct.st" "$tmp/m-starpu.st" || fail "--model: direct and starpu differ"
# the DSpark drafter's mtp.{k}.* load from the released names and draft (greedy = plain greedy)
expect_exit 0 run --model "$ck" --prompt-len 40 --max-new 6 --speculate mtp --verify-len 2
grep -q 'DSpark drafter mtp.0..2, fixed verify length.*bitwise equal to plain greedy' "$tmp/out" \
  || fail "--model --speculate mtp: $(cat "$tmp/out")"
expect_exit 0 run --model "$ck" --plan "$plan" --prompt-len 200 --max-new 4 --executor direct --json
"$py" -c 'import json,sys; assert json.load(open(sys.argv[1]))["plan"] == "ckpt-small"' "$tmp/out" \
  || fail "--model --plan ckpt-small did not run it"
expect_exit 0 run --plan "$plan" --weights "$tmp/dq.safetensors" --prompt-len 200 --max-new 4 --executor direct --json
cp "$tmp/out" "$tmp/w.json"
expect_exit 0 run --model "$ck" --plan "$plan" --prompt-len 200 --max-new 4 --executor direct --json
"$py" - "$tmp/out" "$tmp/w.json" <<'PYEOF' || fail "--model --plan vs --weights tokens"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a["tokens"], b["tokens"])
PYEOF

# 2b. the NumPy oracle's own reader (tests/oracle/released.py, from the
# format description, not from the C) gives the same tensors, byte for byte
if "$py" -c 'import numpy' 2>/dev/null; then
  "$py" tests/oracle/released.py "$ck" --plan "$tmp/imported.yaml" --out "$tmp/oracle-read.safetensors" \
    || fail "tests/oracle/released.py could not read the checkpoint"
  "$py" - "$tmp/oracle-read.safetensors" "$tmp/dq.safetensors" <<'PYEOF' || fail "the oracle's reader and cedar's differ"
import sys
sys.path.insert(0, "tests/oracle")
import st as ST
a, b = ST.SafeTensors(sys.argv[1]), ST.SafeTensors(sys.argv[2])
assert set(a.names) == set(b.names), set(a.names) ^ set(b.names)
bad = [n for n in a.names if a[n].tobytes() != b[n].tobytes()]
assert not bad, bad[:5]
PYEOF
else
  echo "note: numpy missing for $py; the oracle's reader is not compared"
fi

# 3. plan import round trip
expect_exit 0 plan config "$tmp/imported.yaml" -o "$tmp/config2.json"
expect_exit 0 plan import "$tmp/config2.json" -o "$tmp/imported2.yaml"
cmp "$tmp/imported.yaml" "$tmp/imported2.yaml" || fail "import -> config -> import changed the plan text"
expect_exit 0 plan show --json "$tmp/imported.yaml"; cp "$tmp/out" "$tmp/show1"
expect_exit 0 plan show --json "$tmp/imported2.yaml"
"$py" - "$tmp/show1" "$tmp/out" <<'PYEOF' || fail "the resolved plans differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
a.pop("path"), b.pop("path")
assert a == b
PYEOF
expect_exit 0 plan config "$plan" -o "$tmp/config3.json"
expect_exit 0 plan import "$tmp/config3.json" -o "$tmp/imported3.yaml"
cmp "$tmp/imported.yaml" "$tmp/imported3.yaml" || fail "the config written from the plan imports differently"
# flash's config: the released layer lists (Appendix V, config.json)
expect_exit 0 plan config plans/v41-flash.yaml
"$py" - "$tmp/out" <<'PYEOF' || fail "flash config"
import json, sys
t = json.load(open(sys.argv[1]))["text_config"]
assert t["kv_source_layer_ids"] == [2, 8, 14, 20], t
assert t["index_source_layer_ids"] == [2, 8, 14, 20, 24, 28, 32, 36], t
assert t["compress_ratios"] == [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0], t
assert t["candidate_source_layer_id"] == 20 and t["engram_num_embeddings"] == [384006168, 384016682], t
PYEOF

# 4. mismatches, checks, damage, hashes
expect_exit 1 run --model "$ck" --plan plans/v41-mini.yaml --prompt-len 20 --max-new 1 --executor direct
grep -q 'model.n_layers: plan 40, checkpoint 6' "$tmp/err" || fail "n_layers mismatch not named"
# SPEC's V4 study options against the vendor's checkpoint: each key named
expect_exit 1 run --model "$ck" --plan tests/plans/ckpt-small-v4.yaml --prompt-len 20 --max-new 1 --executor direct
grep -q 'model.indexer.k_norm: plan false, checkpoint true' "$tmp/err" || fail "k_norm mismatch not named"
grep -q 'model.mhc.pairing: plan v4, checkpoint v41' "$tmp/err" || fail "mHC pairing mismatch not named"
# the checkpoint's own tokenizer.json gives the Engram token map, and must fit
# its config (the npm V3 tokenizer has 99045 keys, this checkpoint 512)
tj=$("$cedar" tokenize --help | sed -n 's/.*npm cache this build found, \(.*tokenizer.json\)).*/\1/p')
if [ -f "$tj" ]; then
  cp -r "$ck" "$tmp/cktok" && cp "$tj" "$tmp/cktok/tokenizer.json"
  expect_exit 1 run --model "$tmp/cktok" --tokens 1,2,3 --max-new 1 --executor direct
  grep -q "has 99045 keys but the checkpoint's engram_compressed_vocab_size is 512" "$tmp/err" ||
    fail "a checkpoint tokenizer unlike its config was not refused"
  rm -rf "$tmp/cktok"
else
  echo "checkpoint.sh: no npm tokenizer.json (make install-deps): the checkpoint-tokenizer check skipped"
fi
expect_exit 0 weights check "$ck"
grep -q 'ok for plan imported' "$tmp/out" || fail "weights check DIR"
cp -r "$ck" "$tmp/bad"
"$py" - "$tmp/bad" <<'PYEOF'
import json, os, struct, sys
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
f = os.path.join(d, idx["weight_map"]["layers.2.attn.wo_b.weight"])
b = bytearray(open(f, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
off = h["layers.2.attn.wo_b.weight"]["data_offsets"][0]
b[8 + n + off + 5] ^= 0x40
open(f, "wb").write(b)
PYEOF
expect_exit 1 run --model "$tmp/bad" --prompt-len 20 --max-new 1 --executor direct
grep -q "layers.2.attn.wo_b.weight.*content hash" "$tmp/err" || fail "the flipped byte is not named"
expect_exit 1 weights check "$tmp/bad"
rm -rf "$tmp/bad"
# a cedar weights file without hashes: check passes, --hash records them
"$py" - "$tmp/dq.safetensors" "$tmp/nohash.safetensors" <<'PYEOF'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"] = {k: v for k, v in h["__metadata__"].items() if not k.startswith("cedar.hash.")}
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (-len(t) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(t)) + t + b[8 + n:])
PYEOF
expect_exit 0 weights check --plan "$tmp/imported.yaml" "$tmp/nohash.safetensors"
expect_exit 0 weights check --plan "$tmp/imported.yaml" --hash "$tmp/nohash.safetensors"
grep -q 'recorded [1-9][0-9]* content hashes' "$tmp/err" || fail "--hash recorded nothing"
expect_exit 2 weights init --layout bogus --plan "$plan" --seed 1 --out "$tmp/x"
expect_exit 1 weights init --layout released --plan tests/plans/ckpt-small-v4.yaml --seed 1 --out "$tmp/x"
grep -q 'head.hc' "$tmp/err" || fail "a plan with merge: learned should be refused naming head.hc"

# 5. serve-sim and bench model
expect_exit 0 serve-sim gen --sessions 1 --turns 2 --first 40 --turn-len 8 --max-new 2 --seed 1
cp "$tmp/out" "$tmp/req.jsonl"
expect_exit 0 serve-sim --requests "$tmp/req.jsonl" --model "$ck" --executor direct
expect_exit 0 bench model --model "$ck" --prompt-len 64 --decode 2
grep -q 'plain read() of the same files' "$tmp/out" || fail "bench model --model prints no load figures"
echo "checkpoint.sh: ok"

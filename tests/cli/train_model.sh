#!/usr/bin/env bash
# train_model.sh: the committed trained model (models/v41-byte) loads and runs in cedar.
#
# - the directory is at most 16 MB, its config.json is train/config.json
#   (what the training program read), and its manifest names the corpus
#   (sha256, license), seed, steps, wall time and held-out bits per byte;
# - `cedar weights check` accepts it (names, dtypes, shapes, finite values);
# - `cedar run --model DIR --plan plans/v41-byte.yaml` finds no difference
#   between the shipped plan and the checkpoint's config, and generates
#   text from a raw prompt with the tokenizer's own Engram token map (the
#   234 keys the plan's compressed_vocab says).
# Exit 77 when the model directory is absent (a tree without the commit);
# python3 (standard library) reads the JSON.
#
# Run: bash tests/cli/train_model.sh build/cedar   (ctest: cli_train_model)
set -u
cedar=${1:?usage: train_model.sh CEDAR}
here=$(cd "$(dirname "$0")/../.." && pwd)
dir="$here/models/v41-byte"
[ -f "$dir/config.json" ] || { echo "skipped: $dir not present"; exit 77; }
py=$(command -v /usr/bin/python3 || command -v python3) || { echo "skipped: no python3"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
size=$(du -sb "$dir" | cut -f1)
[ "$size" -le $((16 * 1024 * 1024)) ] || fail "$dir is $size bytes, over 16 MB"
"$py" - "$dir" "$here/train/config.json" <<'PY' || fail "manifest or config"
import json, sys
d, cfg = sys.argv[1], sys.argv[2]
assert json.load(open(d + '/config.json')) == json.load(open(cfg)), 'config.json is not train/config.json'
m = json.load(open(d + '/manifest.json'))
for k in ('corpus', 'seed', 'steps', 'bytes_seen', 'train_wall_s', 'heldout_bpb_f32',
          'heldout_bpb_released_formats', 'loss_curve_train_bpb', 'heldout_curve'):
    assert k in m, 'manifest.json lacks %s' % k
c = m['corpus']
assert len(c['raw_sha256']) == 64 and 'public domain' in c['license'], c
assert m['steps'] > 0 and 0 < m['heldout_bpb_released_formats'] < 9, m['heldout_bpb_released_formats']
PY
"$cedar" weights check "$dir" || fail "cedar weights check"
out=$("$cedar" run --model "$dir" --plan "$here/plans/v41-byte.yaml" --raw --prompt "And God said" \
      --max-new 16 2>&1) || fail "cedar run --model: $out"
echo "$out" | grep -q "engram token map: the tokenizer's normalized token map" || fail "not the tokenizer's Engram map: $out"
echo "$out" | grep -q "generated 16" || fail "no 16 generated tokens: $out"
echo "train_model: ok"

#!/usr/bin/env bash
# train_resume.sh: training resumed from its own state is the same training.
#
# train/train.py with a tiny batch (2 x 32 bytes): 3 steps in one run, and
# 2 steps, then --resume for the third, must give bitwise the same weights
# (the state holds the weights, the optimizer and the data order's
# generator); a --resume without a state is refused with the path. Exit 77
# (skipped) without /usr/bin/python3, torch or Debian's `bible` (the corpus:
# `make train-deps`).
#
# Run: bash tests/cli/train_resume.sh   (ctest: cli_train_resume)
set -u
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import torch, numpy' 2>/dev/null || { echo "skipped: torch or numpy missing for $py (make train-deps)"; exit 77; }
command -v bible >/dev/null || { echo "skipped: bible (bible-kjv) is not installed (make train-deps)"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
t() { "$py" "$here/train/train.py" --batch 2 --seq 32 --eval-every 100 --eval-windows 2 "$@" > "$work/log" 2>&1; }
t --state "$work/a" --steps 3 || fail "3 steps: $(tail -3 "$work/log")"
t --state "$work/b" --steps 2 || fail "2 steps: $(tail -3 "$work/log")"
t --state "$work/b" --steps 3 --resume || fail "resume: $(tail -3 "$work/log")"
grep -q "resumed at step 2" "$work/log" || fail "the resumed run did not start at step 2: $(head -3 "$work/log")"
"$py" - "$work/a/state.pt" "$work/b/state.pt" <<'PY' || fail "3 steps and 2 + resume + 1 differ"
import sys, torch
a, b = (torch.load(p)['model'] for p in sys.argv[1:3])
d = max((a[k] - b[k]).abs().max().item() for k in a if a[k].dtype.is_floating_point and not k.startswith('drafter.'))
print('max weight difference', d)
sys.exit(0 if d == 0 else 1)
PY
if t --state "$work/none" --resume; then fail "--resume without a state was accepted"; fi
grep -q "does not exist" "$work/log" || fail "--resume without a state: $(tail -2 "$work/log")"
echo "train_resume: ok"

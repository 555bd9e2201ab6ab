#!/usr/bin/env bash
# train_oracle.sh: the torch training model equals the NumPy oracle.
#
# Runs tests/train/oracle_equal.py with Debian's python3: train/model.py and
# tests/oracle/oracle.py on the same weights (the torch model's seeded
# initial ones), a 110-byte English prompt and 4 greedy decode steps, every
# position's logits compared in float64 and float32 (the bounds and their
# reasons are in the script). Exit 77 (skipped) when /usr/bin/python3,
# numpy or torch is missing: CI may not install python3-torch
# (`make train-deps` does).
#
# Run: bash tests/cli/train_oracle.sh [build/cedar]   (ctest: cli_train_oracle)
set -u
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "skipped: numpy is missing for $py"; exit 77; }
"$py" -c 'import torch' 2>/dev/null || { echo "skipped: torch is missing for $py (make train-deps)"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" "$here/tests/train/oracle_equal.py" "$work"

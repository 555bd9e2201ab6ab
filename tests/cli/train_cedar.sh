#!/usr/bin/env bash
# train_cedar.sh: cedar, the oracle's checkpoint reader and the torch model
# read the committed trained checkpoint (models/v41-byte) the same way.
#
# Runs tests/train/cedar_equal.py: `cedar run --model models/v41-byte` on
# tests/oracle/plans/v41-byte-f32.yaml (the forms the torch model computes)
# against the torch model on the values tests/oracle/released.py reads from
# the same shards, every prefill and decode row of logits within the fp32
# bound the script derives, the greedy picks identical. Exit 77 (skipped)
# without /usr/bin/python3, numpy or torch (`make train-deps`), or without
# the model directory.
#
# Run: bash tests/cli/train_cedar.sh build/cedar   (ctest: cli_train_cedar)
set -u
cedar=${1:?usage: train_cedar.sh CEDAR}
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
"$py" -c 'import numpy' 2>/dev/null || { echo "skipped: numpy is missing for $py"; exit 77; }
"$py" -c 'import torch' 2>/dev/null || { echo "skipped: torch is missing for $py (make train-deps)"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" "$here/tests/train/cedar_equal.py" "$cedar" "$here/models/v41-byte" "$work"

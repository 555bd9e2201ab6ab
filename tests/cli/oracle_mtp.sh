#!/usr/bin/env bash
# oracle_mtp.sh: cedar's DSpark draft block (runtime/model/mtp.c) against the
# NumPy oracle's (tests/oracle/drafter.py, written from Appendix V #24).
#
# v41-mini with fp32 numerics (tests/oracle/plans/v41-mini-f32.yaml, as
# cli_oracle_run), weights from `cedar weights init --seed 7`, the CI prompt
# (705 bytes, `compare.py --print-prompt`), 3 greedy decode steps, then one
# draft block (`test_mtp --dump`: draft logits, confidence, collapsed rows,
# the window's captured target rows). drafter.py reruns the target on
# cedar's ids with its own capture, and judges
#  - the captured rows (median relative RMS per target layer within half of
#    one layer's update: the right layer, position and stream mean);
#  - the draft block on cedar's captured rows: logits, x and confidence within
#    1.5x the spread of 4 oracle reruns perturbed by K u per op (compare.py's
#    rule, K = the drafter's longest reduction), greedy drafts equal except
#    at a near tie;
# then --self-test shows it refuses a draft logit row x 1.01, a confidence
# + 1e-3 and the first target's rows taken one layer late.
# Exit 77 without /usr/bin/python3 + numpy. ~2 min on 2 cores.
# Keep the files: ORACLE_MTP_KEEP=DIR.
# Run: bash tests/cli/oracle_mtp.sh build/cedar (test_mtp next to it in build/tests/).
set -u
cedar=${1:?usage: oracle_mtp.sh /path/to/cedar}
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/tests/cli/oracle_env.sh" ORACLE_MTP_KEEP # py, tmp, fail, phase
dumper=$(dirname "$cedar")/tests/test_mtp
[ -x "$dumper" ] || { echo "FAIL: $dumper is not built"; exit 1; }
plan=$here/tests/oracle/plans/v41-mini-f32.yaml
steps=3
[ "${CEDAR_TEST_SMALL:-0}" = 1 ] && steps=1 # the smaller form (the ASan build: tests/CMakeLists.txt)
"$cedar" weights init --plan "$plan" --seed 7 --out "$tmp/w.safetensors" >"$tmp/init.log" 2>&1 ||
  { cat "$tmp/init.log" >&2; fail "cedar weights init"; }
prompt=$("$py" "$here/tests/oracle/compare.py" --print-prompt) || fail "compare.py --print-prompt"
"$dumper" --dump "$plan" "$tmp/w.safetensors" "$prompt" "$steps" "$tmp/draft.safetensors" || fail "test_mtp --dump"
"$py" "$here/tests/oracle/drafter.py" "$plan" "$tmp/w.safetensors" "$tmp/draft.safetensors" --steps "$steps" \
  --self-test || fail "drafter.py: cedar's draft block and the oracle's disagree (or the self-test accepted a fault)"
echo "oracle_mtp.sh: ok"

#!/usr/bin/env bash
# oracle_run.sh: `cedar run` against the independent NumPy oracle (tests/oracle/).
#
# Makes v41-mini weights with `cedar weights init` (seed 7), takes the CI
# prompt (705 bytes of English, token = byte; `compare.py --print-prompt`),
# runs the oracle (prefill + 16 greedy decode steps) and cedar (`--max-new 17`:
# the first token from the prefill, then 16 decode steps) with --dump, and
# compares the two with tests/oracle/compare.py: greedy tokens, prefill and
# decode logits, SWA / Main-KV / Indexer-K cache codes, to tolerances derived
# from the oracle rerun under fp32-size perturbations (tests/oracle/README.md).
# Before that it runs `compare.py --self-test`, which shows that compare.py
# accepts fp32-level differences and refuses real ones.
#
# Exit 77 (skipped) when /usr/bin/python3 or numpy is missing, or when `cedar
# run` (or its --dump) is not built yet, after the self-test. Takes 1-2 minutes
# on 2 cores plus `cedar run`.
# Keep the files: ORACLE_RUN_KEEP=DIR.
#
# Run: bash tests/cli/oracle_run.sh build/cedar   (from the repo root; ctest
# runs it as cli_oracle_run).
set -u
cedar=${1:?usage: oracle_run.sh /path/to/cedar}
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/tests/cli/oracle_env.sh" ORACLE_RUN_KEEP # py, tmp, fail, phase
plan=$here/tests/oracle/plans/v41-mini-f32.yaml  # fp32 numerics: the tight comparison (that file says why)
compare=$here/tests/oracle/compare.py
seed=7
steps=16
# The smaller form (CEDAR_TEST_SMALL=1, the ASan stage: tests/CMakeLists.txt):
# 4 decode steps, and no compare.py --self-test (pure Python, which the
# plain build's run of this test covers); every comparison still runs.
small=${CEDAR_TEST_SMALL:-0}
[ "$small" = 1 ] && steps=4


phase "weights: cedar weights init --seed $seed"
"$cedar" weights init --plan "$plan" --seed "$seed" --out "$tmp/w.safetensors" >"$tmp/init.log" 2>&1 ||
  { rc=$?; cat "$tmp/init.log" >&2; fail "cedar weights init exited $rc"; }
prompt=$("$py" "$compare" --print-prompt) || fail "compare.py --print-prompt"

phase "oracle: $(echo "$prompt" | tr ',' '\n' | wc -l) prompt tokens, $steps decode steps"
"$py" "$here/tests/oracle/oracle.py" "$plan" "$tmp/w.safetensors" --prompt "$prompt" \
  --steps "$steps" --out "$tmp/oracle.safetensors" || fail "oracle.py exited $?"

if [ "$small" != 1 ]; then
  phase "compare.py --self-test"
  "$py" "$compare" --self-test --weights "$tmp/w.safetensors" --plan "$plan" \
    --oracle-dump "$tmp/oracle.safetensors" --work "$tmp/work" || fail "compare.py --self-test"
fi

if ! "$cedar" run --help >"$tmp/run-help.txt" 2>&1; then
  echo "skipped: cedar run not built (the compare.py self-test passed)"
  exit 77
fi
if ! grep -q -- '--dump' "$tmp/run-help.txt"; then
  echo "skipped: cedar run has no --dump yet (the compare.py self-test passed)"
  exit 77
fi

phase "cedar run --max-new $((steps + 1)) --dump"
"$cedar" run --plan "$plan" --weights "$tmp/w.safetensors" --tokens "$prompt" \
  --max-new "$((steps + 1))" --dump "$tmp/cedar.safetensors" >"$tmp/run.log" 2>&1 ||
  { rc=$?; tail -n 40 "$tmp/run.log" >&2; fail "cedar run exited $rc"; }

phase "compare.py cedar oracle"
"$py" "$compare" "$tmp/cedar.safetensors" "$tmp/oracle.safetensors" --weights "$tmp/w.safetensors" \
  --plan "$plan" --work "$tmp/work"
rc=$?
phase "done"
[ "$rc" -eq 0 ] || fail "compare.py: cedar and the oracle disagree (exit $rc)"
echo "oracle_run.sh: ok"

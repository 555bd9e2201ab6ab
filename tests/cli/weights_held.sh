#!/usr/bin/env bash
# weights_held.sh: weights held in their stored formats (issue 31 s1;
# docs/weights.md "Held formats").
#
# For each shipped plan that runs in one process at test speed, and for a
# released-layout checkpoint of v41-mini (`weights init --layout released`):
#  1. `cedar run --dump` with the weights in their stored formats (the
#     default: FP8, FP4, BF16 through ops/qlinear.h) writes the same bytes as
#     the run with the same values held as F32 (--weights-format f32), on the
#     direct executor and on StarPU;
#  2. the run's resident bytes by format, with the tensors held widened to
#     F32 counted at their stored size, equal `plan cost`'s stored-format
#     figure for the plan (exactly: both count elements and scales, no
#     alignment or headers), and the f32 run holds more than the stored one;
#  3. --weights-format refuses a value it does not know, naming the flag.
# Run from the repository root: bash tests/cli/weights_held.sh build/cedar (~1 min;
# a slow test: CEDAR_TEST_SMALL=1 runs two plans and the checkpoint).
set -euo pipefail

cedar=${1:?usage: weights_held.sh /path/to/cedar}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# resident line -> "stored_equivalent plan_cost total" (awk over the words)
resident() {
  grep '^resident weights:' "$1" | head -1 | tr -d ',;()' | awk '
    { total = $3; widened = 0; wstored = 0; mapped = 0; cost = -1
      for (i = 1; i <= NF; i++) {
        if ($i == "widened") { widened = $(i - 1); wstored = $(i + 4) }
        if ($i == "file:") mapped = $(i + 1)
        if ($i == "formats:") cost = $(i + 1)
      }
      print total - widened + wstored + mapped, cost, total }'
}

check_pair() { # label, args...: stored vs f32 dumps equal on both executors, resident agrees
  local label=$1
  shift
  for ex in direct starpu; do
    "$cedar" run "$@" --executor "$ex" --prompt-len 12 --max-new 3 --dump "$tmp/s.bin" >"$tmp/s.txt" 2>"$tmp/s.err" ||
      { cat "$tmp/s.err" >&2; fail "$label $ex: run (stored) exited $?"; }
    "$cedar" run "$@" --executor "$ex" --prompt-len 12 --max-new 3 --weights-format f32 --dump "$tmp/f.bin" \
      >"$tmp/f.txt" 2>"$tmp/f.err" || { cat "$tmp/f.err" >&2; fail "$label $ex: run (f32) exited $?"; }
    cmp -s "$tmp/s.bin" "$tmp/f.bin" || fail "$label $ex: --dump with stored weights differs from --weights-format f32"
    [ -s "$tmp/s.bin" ] || fail "$label $ex: empty dump"
  done
  read -r eq cost total < <(resident "$tmp/s.txt") || fail "$label: no resident weights line"
  read -r _ _ ftotal < <(resident "$tmp/f.txt")
  [ "$eq" = "$cost" ] || fail "$label: resident bytes at stored size $eq, plan cost $cost ($(grep '^resident' "$tmp/s.txt"))"
  [ "$ftotal" -gt "$total" ] || fail "$label: f32 holds $ftotal bytes, not more than stored $total"
  echo "ok $label: dumps equal (direct, starpu); resident $total B = plan cost $cost B at stored size; f32 $ftotal B"
}

plans="plans/v41-mini.yaml plans/v41-mini-text.yaml plans/v41-mini-noced.yaml plans/dense-40.yaml
  plans/alt-no-pool.yaml plans/alt-reindex2.yaml plans/alt-two-dec-sources.yaml"
# the smaller form (CEDAR_TEST_SMALL, ASan builds: tests/CMakeLists.txt): every
# check on the default plan, the dense one and the checkpoint, not every plan
[ "${CEDAR_TEST_SMALL:-0}" = 1 ] && plans="plans/v41-mini.yaml plans/dense-40.yaml"
for plan in $plans; do
  check_pair "$plan" --plan "$plan" --seed 5
done

"$cedar" weights init --plan plans/v41-mini.yaml --seed 4 --layout released --out "$tmp/ck" >/dev/null 2>"$tmp/w.err" ||
  { cat "$tmp/w.err" >&2; fail "weights init --layout released"; }
check_pair "released checkpoint" --model "$tmp/ck"

if "$cedar" run --seed 1 --weights-format fp3 >"$tmp/o" 2>"$tmp/e"; then fail "--weights-format fp3 accepted"; fi
grep -q -- "--weights-format" "$tmp/e" || fail "the refusal does not name --weights-format: $(cat "$tmp/e")"
echo "PASS weights_held"

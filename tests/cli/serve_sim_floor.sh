#!/usr/bin/env bash
# serve_sim_floor.sh: `cedar serve-sim --floor`'s stored-bytes floor and
# routing's cap (issue 31), on plans/v41-mini.yaml:
#   1. the weights it counts in stored formats are `plan cost --per-rank`'s
#      weights_bytes exactly, and no more than the bytes held;
#   2. a batch-1 step runs n_active routed experts in each of the 40 MoE
#      layers (80: each chosen expert once), and its stored bytes are the
#      dense weights + those 80 experts + one embedding row, below the held;
#   3. the cap line is rows x (batch-1 bytes a row) / batch-B bytes,
#      recomputed from the printed figures, between 1 and B, and at batch 4
#      the experts run a step are at most 4x batch 1's (each chosen once).
# Run: bash tests/cli/serve_sim_floor.sh build/cedar   (ctest: cli_serve_sim_floor)
set -u
cedar=${1:-build/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
plan=plans/v41-mini.yaml

"$cedar" plan cost $plan --per-rank --json > "$tmp/cost.json" || fail "plan cost"
"$cedar" serve-sim --plan $plan --max-batch 1,4 --num-prompts 4 --prompt-len 6 --max-new 3 --floor \
  > "$tmp/out.txt" 2> "$tmp/err.txt" || fail "serve-sim --floor: $(cat "$tmp/err.txt")"
"$py" - "$tmp/cost.json" "$tmp/out.txt" <<'PY' || fail "--floor's figures (output in the lines above)"
import json, re, sys
cost = json.load(open(sys.argv[1]))
out = open(sys.argv[2]).read()
print(out[out.find("bytes floor"):])
m = re.search(r"weights: (\d+) bytes in the plan's stored formats \(plan cost\), (\d+) bytes as held now", out)
assert m, "no weights line"
stored, held = int(m.group(1)), int(m.group(2))
assert stored == cost["weights_bytes"], (stored, cost["weights_bytes"])
assert stored <= held, (stored, held)
rows = {}
for b, r, ex, sb, hb in re.findall(r"max batch +(\d+): ([\d.]+) rows a step, ([\d.]+) routed experts run a step; "
                                   r"stored ([\d.]+) MB a step \(floor [\d.]+ ms\), held ([\d.]+) MB", out):
    rows[int(b)] = (float(r), float(ex), float(sb), float(hb))
assert set(rows) == {1, 4}, rows
r1, ex1, sb1, hb1 = rows[1]
assert r1 == 1 and ex1 == 80.0, rows[1]          # 40 MoE layers x 2 active, each once
assert sb1 < hb1 or stored == held, rows[1]
r4, ex4, sb4, hb4 = rows[4]
assert 1 < r4 <= 4 and ex1 < ex4 <= 4 * ex1 and sb1 < sb4, rows[4]
m = re.search(r"routing's cap over max batch 1: ([\d.]+) rows x ([\d.]+) MB a row / ([\d.]+) MB = ([\d.]+)x; "
              r"decode measured ([\d.]+)x", out)
assert m, "no cap line"
cr, per_row, sbB, cap, measured = map(float, m.groups())
assert abs(cr - r4) < 0.006 and abs(per_row - sb1) < 0.006 and abs(sbB - sb4) < 0.006, m.groups()
want = r4 * sb1 / sb4                            # printed at 2 decimals: 0.01 MB on ~40 MB
assert abs(cap - want) < 0.01 * want + 0.006, (cap, want)
assert 1 < cap <= r4, cap
PY
[ $fails -eq 0 ] && echo "serve_sim_floor: all passed" || { echo "serve_sim_floor: $fails failure(s)"; exit 1; }

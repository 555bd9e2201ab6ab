#!/usr/bin/env bash
# disk_tier_plans.sh: the disk tier's blocks belong to one plan and its
# weights (issue 28 row 2; runtime/cache/kv_identity.h, runtime/engine/engine.c).
# serve-sim fills --cache-dir with tiny-40's blocks; then, on the same
# weights (seed 0), every variant that changes KV bytes loads none of them
# (no disk block, no hit on turn 0) and writes its own, while a variant that
# only changes serving sizes (batching, the host cache, the TTL) and the
# plan's name load them. Each variant run again loads its own blocks, and
# tiny-40's blocks still hit after all of them. The knobs: the SWA window
# and replay (the issue's case), a storage format, a numerics switch, an
# encoder layer's mode (L9 reindexes: L14's entries change), CED off, the
# block size. Every plan
# key is covered by tests/test_kv_identity.c; this is the same end to end.
# Run from the repository root: bash tests/cli/disk_tier_plans.sh build/cedar (~40 s)
set -euo pipefail
cedar=${1:?usage: disk_tier_plans.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tiny=$PWD/tests/oracle/plans/tiny-40.yaml
cache=$tmp/cache
cat > "$tmp/req.jsonl" <<'EOF2'
{"id": "t0", "session": "s", "turn": 0, "new_len": 300, "max_new": 2}
EOF2
# run PLAN: serve-sim on PLAN with the shared cache; prints turn 0's "disk_blocks hit"
run() {
  "$cedar" serve-sim --plan "$1" --requests "$tmp/req.jsonl" --executor direct --cache-dir "$cache" --json \
    > "$tmp/out.json" 2> "$tmp/err" || fail "serve-sim --plan $1: $(cat "$tmp/err")"
  "$py" -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(r['disk_blocks'], r['hit'])" "$tmp/out.json"
}
variant() { # NAME YAML-BODY
  printf 'extends: %s\nname: %s\n%s\n' "$tiny" "$1" "$2" > "$tmp/$1.yaml"
  echo "$tmp/$1.yaml"
}
read -r blocks hit < <(run "$tiny")
[ "$blocks" = 0 ] && [ "$hit" = 0 ] || fail "the empty cache gave tiny-40 $blocks blocks"
ls "$cache"/*.blk > /dev/null 2>&1 || fail "tiny-40 wrote no block"
read -r blocks hit < <(run "$tiny")
[ "$blocks" -ge 1 ] && [ "$hit" -ge 256 ] || fail "tiny-40 again: $blocks disk blocks, hit $hit (its own blocks must hit)"

kv_knobs=(
  "window_replay|model: {swa: {window: 8}}
serving: {replay: {encoder: 8, decoder: 8}}"
  "replay_only|serving: {replay: {decoder: 16}}"
  "main_kv_format|formats: {main_kv: {element: bf16, scale: none}}"
  "numerics|model: {numerics: {activations: f32}}"
  "ced_off|serving: {ced: false}"
  "block_tokens|serving: {cache: {prefix_block_tokens: 128}}"
  "layer_mode|layer_overrides:
  - {at: 9, mode: reindex}"
)
for k in "${kv_knobs[@]}"; do
  name=${k%%|*}
  p=$(variant "$name" "${k#*|}")
  "$cedar" plan check "$p" > /dev/null 2>&1 || fail "variant $name does not load: $("$cedar" plan check "$p" 2>&1 | head -3)"
  read -r blocks hit < <(run "$p")
  [ "$blocks" = 0 ] && [ "$hit" = 0 ] || fail "$name: loaded $blocks of tiny-40's blocks (hit $hit): another plan's KV state"
  read -r blocks hit < <(run "$p")
  [ "$blocks" -ge 1 ] || fail "$name run again: $blocks disk blocks (its own blocks must hit)"
done
p=$(variant serving_only "serving: {batch: {max_requests: 3}, cache: {host_bytes: 1000000, global_ttl_hours: 5}}")
read -r blocks hit < <(run "$p")
[ "$blocks" -ge 1 ] && [ "$hit" -ge 256 ] || fail "serving_only: $blocks disk blocks (batching and cache sizes change no KV byte)"
read -r blocks hit < <(run "$tiny")
[ "$blocks" -ge 1 ] && [ "$hit" -ge 256 ] || fail "tiny-40 after the variants: $blocks disk blocks"
echo "disk_tier_plans: ${#kv_knobs[@]} KV-changing variants miss tiny-40's blocks and hit their own; a serving-only variant shares them"

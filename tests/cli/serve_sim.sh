#!/usr/bin/env bash
# serve_sim.sh: `cedar serve-sim` and the prefix cache end to end (issue 6).
#   1. `serve-sim gen` writes the chat workload it documents.
#   2. A 3-turn conversation: turns 1-2 hit the snapshot at the previous
#      boundary (path a); with --no-swa-pool they hit whole blocks and replay
#      the encoder window (path b); with --no-cache every turn is cold; turn 0
#      is the same cold request in all three.
#   3. SPEC 6.6's worked example on v41-mini (the V4.1 structure): prompt
#      4096, then 4100 with the encoder snapshot missing: 132 encoder
#      positions, decoder replay 128 of which 124 cached, 10 new global
#      entries (3,560 bytes in the flash formats, as `plan cost` says), 5,200
#      token-layers.
#   4. The disk tier: a second process hits blocks the first one wrote; a
#      corrupted file and another model's files are misses, never used; after
#      serve-sim is killed (SIGKILL) at random moments while it writes, a
#      restart completes every request and finds no damaged block.
# Run: bash tests/cli/serve_sim.sh build/cedar   (ctest: cli_serve_sim)
set -u
cedar=${1:-build/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
tiny=tests/oracle/plans/tiny-40.yaml

# 1. the generator
"$cedar" serve-sim gen --sessions 3 --turns 10 --first 100 --turn-len 8 --max-new 2 > "$tmp/chat.jsonl" || fail "gen"
"$py" - "$tmp/chat.jsonl" <<'PY' || fail "gen: not the documented workload"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 30, len(rows)
assert [r['turn'] for r in rows[:6]] == [0, 0, 0, 1, 1, 1]
assert all(r['new_len'] == (100 if r['turn'] == 0 else 8) and r['max_new'] == 2 for r in rows)
assert len({r['session'] for r in rows}) == 3
PY

# 2. paths (a), (b) and no cache on a 3-turn conversation
cat > "$tmp/conv.jsonl" <<'EOF2'
{"id": "t0", "session": "s", "turn": 0, "new_len": 300, "max_new": 4}
{"id": "t1", "session": "s", "turn": 1, "new_len": 20, "max_new": 4}
{"id": "t2", "session": "s", "turn": 2, "new_len": 230, "max_new": 4}
EOF2
for mode in a b cold; do
  flag=; [ $mode = b ] && flag=--no-swa-pool; [ $mode = cold ] && flag=--no-cache
  "$cedar" serve-sim --plan $tiny --requests "$tmp/conv.jsonl" --executor direct --json $flag > "$tmp/$mode.json" \
    || fail "serve-sim ($mode) failed"
done
"$py" - "$tmp" <<'PY' || fail "the three paths"
import json, sys
d = sys.argv[1]
lines = {m: [json.loads(l) for l in open(f'{d}/{m}.json')] for m in ('a', 'b', 'cold')}
# the last line is the totals (issue 18 row 10): the table's closing figures as data
for m, ls in lines.items():
    t = ls[-1]['totals']
    assert t['requests'] == 3 and t['prompt_tokens'] == sum(r['prompt'] for r in ls[:-1]), (m, t)
    assert t['hit_tokens'] == sum(r['hit'] for r in ls[:-1]), (m, t)
    assert ('cache' in ls[-1]) == (m != 'cold'), (m, ls[-1])
run = {m: ls[:-1] for m, ls in lines.items()}
for m, rows in run.items():
    assert len(rows) == 3, (m, len(rows))
# turn 0 is the same cold request everywhere
assert run['a'][0]['tokens'] == run['b'][0]['tokens'] == run['cold'][0]['tokens']
assert all(r['hit'] == 0 for r in run['cold'])
W = 24  # tiny-40: replay.encoder 24, replay.decoder 24, blocks of 256
ends = [0]
for t, r in enumerate(run['a']):
    n = r['prompt']
    if t:
        c = ends[-1]
        assert r['swa_hit'] and r['hit'] == c and r['encoder_replay'] == 0, r
        assert r['encoder_positions'] == n - c and r['global_hit'] == c // 256 * 256, r
        assert r['decoder_replay'] == 24 and r['decoder_cached'] == max(0, c - (n - 24)), r
    ends.append(n + 3)          # 4 generated, the last not consumed
for t, r in enumerate(run['b'][1:], 1):
    c = ends[t] // 256 * 256
    assert not r['swa_hit'] and r['hit'] == c and r['encoder_replay'] == min(c, W), r
    assert r['encoder_positions'] == r['prompt'] - (c - min(c, W)), r
print('paths ok:', [(r['hit'], r['swa_hit'], r['token_layers']) for r in run['a']],
      [(r['hit'], r['token_layers']) for r in run['b']], [r['token_layers'] for r in run['cold']])
PY

# 3. SPEC 6.6 on the V4.1 structure
cat > "$tmp/hit.jsonl" <<'EOF2'
{"id": "cold", "session": "s", "turn": 0, "new_len": 4096, "max_new": 1}
{"id": "hit", "session": "s", "turn": 1, "new_len": 3, "max_new": 1}
EOF2
"$cedar" serve-sim --requests "$tmp/hit.jsonl" --no-swa-pool --executor direct --json > "$tmp/hit.json" || fail "4096/4100"
"$cedar" plan cost plans/v41-flash.yaml --prompt 4100 --hit 4096 --swa-miss --json > "$tmp/cost.json" || fail "plan cost"
"$py" - "$tmp" <<'PY' || fail "SPEC 6.6 counts"
import json, sys
d = sys.argv[1]
cold, hit = [json.loads(l) for l in open(f'{d}/hit.json')][:-1]
assert hit['prompt'] == 4100 and hit['hit'] == 4096 and not hit['swa_hit'], hit
assert hit['encoder_replay_start'] == 3968 and hit['encoder_replay'] == 128, hit
assert hit['encoder_positions'] == 132, hit
assert hit['decoder_replay'] == 128 and hit['decoder_cached'] == 124, hit
assert hit['new_entries'] == 10, hit
assert hit['token_layers'] == 5200, hit
cost = json.load(open(f'{d}/cost.json'))
def find(o, key):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == key: yield v
            yield from find(v, key)
    elif isinstance(o, list):
        for v in o: yield from find(v, key)
nb = [v for v in find(cost, 'new_bytes')]
assert 3560 in nb, nb   # 10 entries x 356 B in the flash formats
print('SPEC 6.6 ok: 132 encoder positions, decoder 128 (124 cached), 10 entries = 3560 B at flash, 5200 token-layers')
PY

# the same hit as a graph, compiled for the flash plan itself
"$cedar" graph show --plan plans/v41-flash.yaml --prompt-len 4100 --hit 4096 > "$tmp/g.txt" || fail "graph show --hit"
grep -q "prefix hit 4096 (encoder from 3968" "$tmp/g.txt" && grep -q " 5200 token-layers" "$tmp/g.txt" \
  || fail "graph show --hit: $(head -2 "$tmp/g.txt")"
"$cedar" graph show --prompt-len 4100 --hit 4097 > /dev/null 2> "$tmp/g.err"
[ $? = 1 ] && grep -q "ratio-2 group" "$tmp/g.err" || fail "an odd block hit without a snapshot is not refused"

# 4. the disk tier
cache="$tmp/cache"
"$cedar" serve-sim --plan $tiny --requests "$tmp/conv.jsonl" --executor direct --cache-dir "$cache" > "$tmp/d1.txt" \
  || fail "disk: first run"
ls "$cache"/*.blk > /dev/null 2>&1 || fail "disk: no block file written"
"$cedar" serve-sim --plan $tiny --requests "$tmp/conv.jsonl" --executor direct --cache-dir "$cache" --json \
  > "$tmp/d2.json" || fail "disk: second run"
"$py" - "$tmp" <<'PY' || fail "disk: a restart hits the disk tier"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + '/d2.json')][:-1]
assert rows[0]['disk_blocks'] >= 1 and rows[0]['global_hit'] >= 256, rows[0]
PY
# corrupted blocks: a miss with a warning, never used. Every file is damaged
# (byte 100 flipped): which block the next run reads first depends on the
# tokens the model generated (the keys), not on the file names' order
for f in "$cache"/*.blk; do
  printf "\\x$(printf '%02x' $(( $(od -A n -t u1 -j 100 -N 1 "$f") ^ 255 )))" | dd of="$f" bs=1 seek=100 conv=notrunc status=none
done
CEDAR_LOG=warn "$cedar" serve-sim --plan $tiny --requests "$tmp/conv.jsonl" --executor direct --cache-dir "$cache" \
  > "$tmp/d3.txt" 2> "$tmp/d3.err" || fail "disk: a corrupted file broke the run"
grep -q "checksum mismatch" "$tmp/d3.err" || fail "disk: no warning for the corrupted file"
grep -Eq " [1-9][0-9]* rejected" "$tmp/d3.txt" || fail "disk: the corrupted files were not counted as rejected"
# another model's weights (seed 1): every file is someone else's
CEDAR_LOG=error "$cedar" serve-sim --plan $tiny --seed 1 --requests "$tmp/conv.jsonl" --executor direct \
  --cache-dir "$cache" --json > "$tmp/d4.json" || fail "disk: other weights"
"$py" -c "import json,sys; r=[json.loads(l) for l in open('$tmp/d4.json')]; assert r[0]['disk_blocks']==0 and r[0]['hit']==0, r[0]" \
  || fail "disk: blocks of other weights were used"
# SIGKILL while writing, then restart
crash="$tmp/crash"
"$cedar" serve-sim gen --sessions 2 --turns 3 --first 300 --turn-len 260 --max-new 2 > "$tmp/crash.jsonl"
RANDOM=7
kills=0
for i in 1 2 3 4 5 6; do   # v41-mini: a run takes seconds, blocks are written after each request
  "$cedar" serve-sim --requests "$tmp/crash.jsonl" --executor direct --cache-dir "$crash" > /dev/null 2>&1 &
  pid=$!
  sleep "$((RANDOM % 3)).$((RANDOM % 10))"
  kill -9 $pid 2> /dev/null && kills=$((kills + 1))
  wait $pid 2> /dev/null
done
CEDAR_LOG=warn "$cedar" serve-sim --requests "$tmp/crash.jsonl" --executor direct --cache-dir "$crash" \
  > "$tmp/c.txt" 2> "$tmp/c.err" || fail "crash: the restart did not complete every request"
grep -q " 0 rejected" "$tmp/c.txt" || fail "crash: a damaged block file was found after SIGKILLs: $(grep rejected "$tmp/c.txt")"
echo "crash: $kills SIGKILLs at random moments, then a restart completed: $(grep 'disk tier' "$tmp/c.txt")"

[ $fails = 0 ] && echo "serve_sim.sh: ok" || { echo "serve_sim.sh: $fails failure(s)"; exit 1; }

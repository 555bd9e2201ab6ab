#!/usr/bin/env bash
# serve_sim_session_names.sh: a serve-sim session is its whole name (issue 28
# row 4; cli/cmd_serve_sim.c). Names of 200 bytes and of 64 bytes that
# differ only after byte 63 were cut to 63 bytes before: turn 1 of a long
# name got a cold 2-token prompt, and two such sessions shared one history.
#  1. a 200-byte session: turn 1's prompt is turn 0's prompt, its 4
#     4 generated tokens and its own 20 new, and it
#     hits the cache;
#  2. two 64-byte names that differ in byte 64 are two sessions: each one's
#     turn 1 extends its own history, not the other's.
# Run from the repository root: bash tests/cli/serve_sim_session_names.sh build/cedar (~5 s)
set -euo pipefail
cedar=${1:?usage: serve_sim_session_names.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tiny=tests/oracle/plans/tiny-40.yaml
long=$(printf 'L%.0s' $(seq 200))
a=$(printf 'A%.0s' $(seq 63))x
b=$(printf 'A%.0s' $(seq 63))y
cat > "$tmp/req.jsonl" <<EOF2
{"id": "l0", "session": "$long", "turn": 0, "new_len": 300, "max_new": 4}
{"id": "a0", "session": "$a", "turn": 0, "new_len": 40, "max_new": 4}
{"id": "b0", "session": "$b", "turn": 0, "new_len": 70, "max_new": 4}
{"id": "l1", "session": "$long", "turn": 1, "new_len": 20, "max_new": 4}
{"id": "a1", "session": "$a", "turn": 1, "new_len": 5, "max_new": 4}
{"id": "b1", "session": "$b", "turn": 1, "new_len": 6, "max_new": 4}
EOF2
"$cedar" serve-sim --plan $tiny --requests "$tmp/req.jsonl" --executor direct --json > "$tmp/out.json" ||
  fail "serve-sim exited non-zero"
"$py" - "$tmp/out.json" "$long" "$a" "$b" <<'PY' || fail "sessions (above)"
import json, sys
rows = {r["id"]: r for r in map(json.loads, open(sys.argv[1])) if "id" in r}
long, a, b = sys.argv[2:]
for i, name in (("l0", long), ("l1", long), ("a1", a), ("b1", b)):
    if rows[i]["session"] != name:
        sys.exit(f"{i}: session {rows[i]['session']!r} is not the request's ({len(name)} bytes)")
want = {"l1": 300 + 4 + 20, "a1": 40 + 4 + 5, "b1": 70 + 4 + 6}
for i, n in want.items():
    if rows[i]["prompt"] != n:
        sys.exit(f"{i}: prompt {rows[i]['prompt']}, want {n} (the session's history was lost or shared)")
if rows["l1"]["hit"] <= 0:
    sys.exit(f"l1: no cache hit ({rows['l1']['hit']})")
print("serve_sim_session_names: 200-byte and 64-byte session names keep their own histories")
PY

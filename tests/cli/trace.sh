#!/usr/bin/env bash
# trace.sh: `cedar run --trace FILE --dot FILE` on the StarPU executor
# (cli/cmd_run.c, viz/trace.c, runtime/exec_starpu.c).
#
#  1. a CED prefill of several chunks on two workers, then decode steps,
#     writes a trace and a DOT file;
#  2. the trace is Chrome Trace Event JSON (checked with /usr/bin/python3):
#     a traceEvents array; every event has name, ph, pid, tid, and ts/dur
#     numbers where its phase needs them; process and thread names are
#     given for every track used; on each track timestamps never decrease in
#     file order and complete slices are properly nested or disjoint; every
#     flow id has one start and one end, start no later than end, each bound
#     to a slice on its own track, on two different tracks;
#  3. cedar's own content: one slice per task that ran (prefill nodes plus
#     nodes of each decode step, as `cedar run` reports them), named
#     "<node> r0", with args layer, mode, chunk, request, flops, bytes; when
#     the slices use two tracks there is a flow (the graph is connected);
#  4. the validator rejects traces broken in each of those ways (so it can
#     fail);
#  5. the DOT file is the prefill graph (its node and edge counts), and
#     Graphviz renders it when installed;
#  6. a real consumer loads it: speedscope (npm) in Debian's headless
#     chromium; the page title becomes "<file> - speedscope", and a file
#     speedscope cannot read does not. Skipped, and said so, when either is
#     missing (no Debian package reads Chrome traces; Perfetto is in neither
#     Debian nor npm). Point CEDAR_SPEEDSCOPE at the package directory, or
#     install it with `npm install -g speedscope@1.25.0`.
# Exit 77 when StarPU cannot start here.
# Run from the repository root: bash tests/cli/trace.sh build/cedar (~10 s).
set -euo pipefail

cedar=${1:?usage: trace.sh /path/to/cedar}
plan=tests/oracle/plans/tiny-40.yaml
[ -f "$plan" ] || { echo "FAIL: $plan is missing (run from the repository root)"; exit 1; }
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- 1. run --------------------------------------------------------------------
toks=$("$py" -c 'print(",".join(str((i * 37 + 11) % 97) for i in range(100)))')
steps=3
if ! "$cedar" run --plan "$plan" --tokens "$toks" --max-new $((steps + 1)) --chunk 20 --workers 2 --sched lws \
    --trace "$tmp/t.json" --dot "$tmp/t.dot" > "$tmp/out" 2> "$tmp/err"; then
  if grep -q "starpu_init failed\|StarPU started" "$tmp/err"; then
    echo "SKIP: StarPU does not start here: $(cat "$tmp/err")"
    exit 77
  fi
  cat "$tmp/err" >&2
  fail "cedar run --trace exited non-zero"
fi
grep -q "executor starpu (lws, 2 CPU workers)" "$tmp/out" || fail "the report does not name the executor: $(head -1 "$tmp/out")"
read -r pn pe dn < <(sed -n 's/^graphs: prefill \([0-9]*\) nodes, \([0-9]*\) edges; decode step \([0-9]*\) nodes$/\1 \2 \3/p' "$tmp/out")
[ -n "${dn:-}" ] || fail "no 'graphs:' line in the report"

# ---- 2-4. the validator ----------------------------------------------------------
cat > "$tmp/check.py" <<'EOF'
"""Validate a Chrome Trace Event JSON file; with --cedar N, also cedar's content.
Exit 0 when valid, 1 with the first problem on stderr."""
import json, sys
from collections import defaultdict

def problems(path, want_slices):
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return "no traceEvents array"
    evs = doc["traceEvents"]
    names, last_ts, slices, flows = {}, {}, defaultdict(list), defaultdict(list)
    num = (int, float)
    for i, e in enumerate(evs):
        if not isinstance(e, dict):
            return f"event {i} is not an object"
        for k, t in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(k), t) or isinstance(e.get(k), bool):
                return f"event {i} lacks {k} of type {t.__name__}: {e}"
        ph, track = e["ph"], (e["pid"], e["tid"])
        if ph == "M":
            if not isinstance(e.get("args"), dict):
                return f"metadata event {i} has no args"
            if e["name"] in ("process_name", "thread_name"):
                names[(e["name"], e["pid"] if e["name"] == "process_name" else track)] = e["args"].get("name")
            continue
        if ph == "C":  # a counter lane (the Engram prefetch): numeric ts and numeric args
            if not isinstance(e.get("ts"), num) or not isinstance(e.get("args"), dict) or \
                    not all(isinstance(v, num) for v in e["args"].values()):
                return f"counter event {i} lacks a numeric ts or numeric args"
            continue
        if ph not in ("X", "s", "f"):
            return f"event {i}: phase {ph} is not one cedar writes"
        if not isinstance(e.get("ts"), num) or isinstance(e.get("ts"), bool):
            return f"event {i} has no numeric ts"
        if e["ts"] < last_ts.get(track, float("-inf")):
            return f"event {i}: ts {e['ts']} goes back on track {track}"
        last_ts[track] = e["ts"]
        if ph == "X":
            if not isinstance(e.get("dur"), num) or e["dur"] < 0:
                return f"slice {i} has no non-negative numeric dur"
            slices[track].append((e["ts"], e["ts"] + e["dur"], i, e))
        else:
            if "id" not in e:
                return f"flow event {i} has no id"
            flows[e["id"]].append(e)
    for track, ss in slices.items():
        stack = []
        for t0, t1, i, _ in ss:
            while stack and stack[-1][1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1][1]:
                return f"slice {i} on track {track} overlaps slice {stack[-1][2]} without nesting"
            stack.append((t0, t1, i))
        if ("thread_name", track) not in names:
            return f"track {track} has no thread_name"
        if ("process_name", track[0]) not in names:
            return f"process {track[0]} has no process_name"
    def bound(e):
        return any(t0 <= e["ts"] <= t1 for t0, t1, _, _ in slices[(e["pid"], e["tid"])])
    for fid, es in flows.items():
        kinds = sorted(x["ph"] for x in es)
        if kinds != ["f", "s"]:
            return f"flow {fid} has phases {kinds}, not one s and one f"
        s, f = (es[0], es[1]) if es[0]["ph"] == "s" else (es[1], es[0])
        if s["ts"] > f["ts"]:
            return f"flow {fid} ends before it starts"
        if not bound(s) or not bound(f):
            return f"flow {fid} is not bound to a slice on its track"
        if (s["pid"], s["tid"]) == (f["pid"], f["tid"]):
            return f"flow {fid} stays on one track"
    if want_slices is None:
        return None
    xs = [e for ss in slices.values() for _, _, _, e in ss]
    if len(xs) != want_slices:
        return f"{len(xs)} slices, expected {want_slices} (one per task)"
    for e in xs:
        a = e.get("args", {})
        for k in ("layer", "mode", "chunk", "request", "flops", "bytes"):
            if k not in a:
                return f"slice {e['name']} lacks arg {k}"
        if not e["name"].endswith(" r0"):
            return f"slice {e['name']} is not named after its request"
    used = [t for t, ss in slices.items() if ss]
    if len(used) >= 2 and not flows:
        return f"slices on {len(used)} tracks but no flow between them"
    print(f"trace: {len(xs)} slices on {len(used)} tracks, {len(flows)} cross-worker edges")
    return None

want = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--cedar" else None
p = problems(sys.argv[1], want)
if p:
    print(p, file=sys.stderr)
    sys.exit(1)
EOF
"$py" "$tmp/check.py" "$tmp/t.json" --cedar $((pn + steps * dn)) || fail "the trace is not valid (above)"

# The validator must reject each kind of broken trace.
"$py" - "$tmp" <<'EOF'
import json, sys
d = sys.argv[1]
base = {"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "p"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "a"}},
    {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "b"}},
    {"name": "x", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 10},
    {"name": "dep", "ph": "s", "pid": 1, "tid": 0, "ts": 0, "id": 1},
    {"name": "y", "ph": "X", "pid": 1, "tid": 1, "ts": 12, "dur": 5},
    {"name": "dep", "ph": "f", "bp": "e", "pid": 1, "tid": 1, "ts": 12, "id": 1}]}
bad = {
  "overlap": lambda e: e.append({"name": "z", "ph": "X", "pid": 1, "tid": 1, "ts": 14, "dur": 9}),
  "backwards": lambda e: e.append({"name": "z", "ph": "X", "pid": 1, "tid": 0, "ts": -2, "dur": 1}),
  "no_ts": lambda e: e[3].pop("ts"),
  "no_tid": lambda e: e[5].pop("tid"),
  "unpaired": lambda e: e.pop(6),
  "no_thread_name": lambda e: e.pop(2),
  "string_dur": lambda e: e[3].update(dur="10"),
}
json.dump(base, open(f"{d}/good.json", "w"))
for k, f in bad.items():
    b = json.loads(json.dumps(base))
    f(b["traceEvents"])
    json.dump(b, open(f"{d}/bad_{k}.json", "w"))
EOF
"$py" "$tmp/check.py" "$tmp/good.json" > /dev/null || fail "the validator rejects a valid trace"
for f in "$tmp"/bad_*.json; do
  if "$py" "$tmp/check.py" "$f" 2> /dev/null; then fail "the validator accepts $(basename "$f")"; fi
done

# ---- 5. DOT -----------------------------------------------------------------------
head -1 "$tmp/t.dot" | grep -q '^digraph' || fail "--dot did not write a digraph"
dn_nodes=$(grep -c '^  n[0-9]* \[label=' "$tmp/t.dot")
dn_edges=$(grep -c '^  n[0-9]* -> n[0-9]*;' "$tmp/t.dot")
[ "$dn_nodes" = "$pn" ] && [ "$dn_edges" = "$pe" ] ||
  fail "--dot has $dn_nodes nodes and $dn_edges edges, the prefill graph $pn and $pe"
if command -v dot > /dev/null; then
  dot -Tsvg "$tmp/t.dot" -o "$tmp/t.svg" || fail "Graphviz cannot render the --dot file"
fi

# ---- 6. a real consumer -------------------------------------------------------------
chromium=$(command -v chromium || command -v chromium-browser || true)
ss=${CEDAR_SPEEDSCOPE:-}
if [ -z "$ss" ] && command -v npm > /dev/null; then ss="$(npm root -g 2> /dev/null)/speedscope"; fi
index="$ss/dist/release/index.html"
# load FILE: print the page title speedscope ends with.
load() {
  printf 'window.alert = function (m) { document.title = "ALERT: " + m; };\nspeedscope.loadFileFromBase64(%s, "%s");\n' \
    "\"$(basename "$1")\"" "$(base64 -w0 "$1")" > "$tmp/loader.js"
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --allow-file-access-from-files \
    --user-data-dir="$tmp/chromium" --virtual-time-budget=10000 --dump-dom \
    "file://$index#localProfilePath=$tmp/loader.js" 2> /dev/null | sed -n 's:.*<title>\([^<]*\)</title>.*:\1:p'
}
if [ -z "$chromium" ] || [ ! -f "$index" ]; then
  echo "trace: consumer check skipped: ${chromium:-no chromium (apt-get install chromium)}," \
    "${ss:+speedscope at $ss: }$([ -f "$index" ] && echo found || echo 'no speedscope (npm install -g speedscope@1.25.0)')"
else
  title=$(load "$tmp/t.json")
  [ "$title" = "t.json - speedscope" ] || fail "speedscope did not load the trace (page title '$title')"
  echo 'this is not a profile' > "$tmp/junk.json"
  title=$(load "$tmp/junk.json")
  [ "$title" != "junk.json - speedscope" ] || fail "speedscope 'loads' a junk file: the consumer check cannot fail"
  echo "trace: speedscope in headless chromium loaded it"
fi
echo "trace.sh: all checks passed"

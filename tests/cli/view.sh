#!/usr/bin/env bash
# view.sh: `cedar view` without a browser (cli/cmd_view.c, viz/view_*.c):
#
#  1. `cedar run --trace --dot` on two StarPU workers; every task in the
#     trace carries pos, n and rank, and a prefill task's [pos, pos + n)
#     is its graph node's label in the DOT;
#  2. `cedar view TRACE --graph DOT --plan P -o page.html` writes one page
#     that needs nothing else: no http(s) URL, no external script, style or
#     image; its data block (JSON) holds every slice of the trace with its
#     lane, layer, chunk, positions and bytes, the lanes named as the
#     trace's threads, the flows, the graph and the plan's layer table;
#  3. the critical path is right: a chain of the DOT's edges whose weight
#     (each node's duration in the first prefill) is the largest of any
#     path, recomputed here in Python, and its slices are the ones marked;
#  4. two ranks: lanes grouped by rank, a transfer's flow between them;
#  5. bad input is refused with a clear message and exit 1 (junk, no
#     traceEvents, an event without ts, overlapping slices, an unpaired
#     flow, a missing file, a DOT that is not cedar's, a cyclic graph, a
#     plan that does not load), and usage errors exit 2.
# The page in a browser: tests/cli/view_browser.sh. Exit 77 when StarPU
# cannot start here. Run from the repository root:
#   bash tests/cli/view.sh build/cedar   (~10 s)
set -euo pipefail

cedar=${1:?usage: view.sh /path/to/cedar}
plan=tests/oracle/plans/tiny-40.yaml
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# ---- 1. a trace -------------------------------------------------------------
toks=$("$py" -c 'print(",".join(str((i * 37 + 11) % 97) for i in range(100)))')
if ! "$cedar" run --plan "$plan" --tokens "$toks" --max-new 4 --chunk 20 --workers 2 --sched lws \
    --trace "$tmp/t.json" --dot "$tmp/t.dot" > "$tmp/out" 2> "$tmp/err"; then
  if grep -q "starpu_init failed\|StarPU started" "$tmp/err"; then
    echo "SKIP: StarPU does not start here: $(cat "$tmp/err")"
    exit 77
  fi
  cat "$tmp/err" >&2
  fail "cedar run --trace exited non-zero"
fi

# ---- 2. the page ----------------------------------------------------------------
"$cedar" view "$tmp/t.json" --graph "$tmp/t.dot" --plan "$plan" -o "$tmp/page.html" > "$tmp/vout" ||
  fail "cedar view exited non-zero: $(cat "$tmp/vout")"
grep -q "tasks on 2 lanes" "$tmp/vout" || fail "cedar view's summary: $(cat "$tmp/vout")"
"$cedar" view "$tmp/t.json" -o "$tmp/bare.html" > /dev/null || fail "cedar view without --graph/--plan failed"

"$py" - "$tmp/t.json" "$tmp/t.dot" "$tmp/page.html" "$tmp/bare.html" <<'EOF' || fail "the page's content (above)"
import json, re, sys
from collections import defaultdict
trace_path, dot_path, page_path, bare_path = sys.argv[1:5]
trace = json.load(open(trace_path))["traceEvents"]
page = open(page_path).read()

def bad(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)

# 1. every task carries pos, n, rank; prefill tasks match the DOT labels
xs = [e for e in trace if e["ph"] == "X"]
for e in xs:
    for k in ("pos", "n", "rank", "layer", "chunk", "bytes"):
        if k not in e["args"]:
            bad(f"trace slice {e['name']} lacks args.{k}")
labels = {}
edges = []
for line in open(dot_path):
    m = re.match(r'\s*n(\d+) \[label="([^"\\]*)\\n\[(-?\d+), (-?\d+)\)"', line)
    if m:
        labels[int(m[1])] = (m[2], int(m[3]), int(m[4]))
    m = re.match(r"\s*n(\d+) -> n(\d+);", line)
    if m:
        edges.append((int(m[1]), int(m[2])))
pre = [e for e in xs if e["args"]["phase"].startswith("prefill")]
if len(pre) != len(labels):
    bad(f"{len(pre)} prefill slices, {len(labels)} DOT nodes")
for e in pre:
    name, a, b = labels[e["args"]["node"]]
    if e["name"] != name + " r0" or (e["args"]["pos"], e["args"]["pos"] + e["args"]["n"]) != (a, b):
        bad(f"slice {e['name']} [{e['args']['pos']}, +{e['args']['n']}) is not DOT node {name} [{a}, {b})")

# 2. self-contained, and the data block
for pat in (r"https?://", r"<script[^>]*\ssrc=", r"<link\b", r"<img\b", r"@import", r"url\("):
    if re.search(pat, page, re.I):
        bad(f"the page refers outside itself: /{pat}/")
m = re.search(r'<script id="cedar-data" type="application/json">(.*?)</script>', page, re.S)
if not m:
    bad("no data block")
d = json.loads(m[1])
ev, sym = d["ev"], d["sym"]
if ev["n"] != len(xs) or any(len(ev[k]) != len(xs) for k in ("ts", "dur", "lane", "layer", "pos", "len", "bytes", "name")):
    bad(f"page has {ev['n']} events, trace {len(xs)} slices")
threads = {e["tid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
# a lane per named thread (a worker that ran nothing keeps its empty lane), in tid order
if [l["name"] for l in d["lanes"]] != [threads[t] for t in sorted(threads)]:
    bad(f"lanes {[l['name'] for l in d['lanes']]}, trace threads {[threads[t] for t in sorted(threads)]}")
t0 = min(e["ts"] for e in xs)
want = sorted((e["name"], round(e["ts"] - t0, 3), e["args"]["layer"], e["args"]["chunk"], e["args"]["pos"],
               e["args"]["n"], e["args"]["bytes"], e["args"]["mode"], threads[e["tid"]]) for e in xs)
got = sorted((ev["name"][i], round(ev["ts"][i], 3), ev["layer"][i], ev["chunk"][i], ev["pos"][i], ev["len"][i],
              ev["bytes"][i], sym[ev["mode"][i]], d["lanes"][ev["lane"][i]]["name"]) for i in range(ev["n"]))
if want != got:
    diff = next((a, b) for a, b in zip(want, got) if a != b)
    bad(f"page events differ from the trace: {diff}")
nflows = sum(1 for e in trace if e["ph"] == "s")
if len(d["flows"]) != 2 * nflows:
    bad(f"{len(d['flows']) // 2} flows in the page, {nflows} in the trace")
for k in range(0, len(d["flows"]), 2):
    a, b = d["flows"][k], d["flows"][k + 1]
    if ev["lane"][a] == ev["lane"][b] or ev["ts"][a] > ev["ts"][b]:
        bad(f"flow {k // 2} is not between two lanes, forward in time")
p = d["plan"]
if len(p["layers"]) != 40 or not {l["mode"] for l in p["layers"]} <= {"full", "reindex", "reuse", "swa_only"}:
    bad("the plan's layer table")
if not any(b["kind"] == "main-kv" for b in p["buses"]):
    bad("no main-kv bus in the plan's buses")

# 3. the critical path, recomputed
g = d["graph"]
n = len(labels)
if len(g["name"]) != n or len(g["edges"]) != 2 * len(edges):
    bad("graph size")
dur = {}
for e in sorted(pre, key=lambda e: e["ts"]):
    dur.setdefault(e["args"]["node"], e["dur"])
w = [dur.get(k, 0.0) for k in range(n)]
preds = defaultdict(list)
for a, b in edges:
    preds[b].append(a)
best = [0.0] * n
for k in range(n):  # DOT edges go forward in node order (the compiler's program order)
    best[k] = w[k] + max((best[j] for j in preds[k]), default=0.0)
path = g["path"]
if not g["measured"] or not path:
    bad("the critical path is not weighed by measured times")
if any((path[i], path[i + 1]) not in set(edges) for i in range(len(path) - 1)):
    bad("the critical path is not a chain of edges")
pw = sum(w[k] for k in path)
# each weight is printed to 0.001 us: n rounding steps of 0.0005 at most
if abs(pw - max(best)) > 1e-3 * n or abs(g["crit_w"] - max(best)) > 1e-3 * n:
    bad(f"critical path weight {pw} (page says {g['crit_w']}), longest path {max(best)}")
marked = sorted(ev["node"][i] for i in range(ev["n"]) if ev["crit"][i])
if marked != sorted(path):
    bad(f"marked slices {marked} are not the path's nodes {sorted(path)}")

bare = open(bare_path).read()
m = re.search(r'<script id="cedar-data" type="application/json">(.*?)</script>', bare, re.S)
db = json.loads(m[1])
if "graph" in db or "plan" in db or db["ev"]["n"] != len(xs):
    bad("the page without --graph/--plan")
print(f"view: {ev['n']} tasks, {len(d['lanes'])} lanes, {len(d['flows']) // 2} flows, "
      f"critical path {len(path)} nodes {pw:.1f} us")
EOF

# ---- 4. bad input ----------------------------------------------------------------
expect_err() { # expect_err CODE PATTERN cedar-args...
  local code=$1 pat=$2
  shift 2
  set +e
  "$cedar" view "$@" -o "$tmp/x.html" > "$tmp/o" 2> "$tmp/e"
  local rc=$?
  set -e
  [ $rc = "$code" ] || fail "cedar view $* exited $rc, expected $code: $(cat "$tmp/e")"
  grep -q -- "$pat" "$tmp/e" || fail "cedar view $*: message '$(cat "$tmp/e")' lacks '$pat'"
}
printf '{"traceEvents": [\n  {"name": "x", "ph": "X", ' > "$tmp/junk.json"
expect_err 1 "junk.json:2:.*not valid JSON" "$tmp/junk.json"
echo '{"events": []}' > "$tmp/noev.json"
expect_err 1 'no "traceEvents" array' "$tmp/noev.json"
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 1, "dur": 2}, {"name": "b", "ph": "X", "pid": 1, "tid": 0, "dur": 2}]}' > "$tmp/nots.json"
expect_err 1 'event 1 (ph "X") has no numeric "ts"' "$tmp/nots.json"
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 10}, {"name": "b", "ph": "X", "pid": 1, "tid": 0, "ts": 5, "dur": 10}]}' > "$tmp/overlap.json"
expect_err 1 'overlap without nesting' "$tmp/overlap.json"
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 10}, {"name": "dep", "ph": "s", "pid": 1, "tid": 0, "ts": 1, "id": 7}]}' > "$tmp/flow.json"
expect_err 1 'flow id 7 has 1 ends' "$tmp/flow.json"
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": -1}]}' > "$tmp/neg.json"
expect_err 1 'no non-negative numeric "dur"' "$tmp/neg.json"
# issue 28 row 16: timestamps of +-1e308 made the page's times inf (a blank page, exit 0)
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 1e308, "dur": 1}, {"name": "b", "ph": "X", "pid": 1, "tid": 0, "ts": -1e308, "dur": 1}]}' > "$tmp/far.json"
expect_err 1 'event 0 (ph "X") has "ts" 1e+308, beyond' "$tmp/far.json"
echo '{"traceEvents": [{"name": "a", "ph": "X", "pid": 1, "tid": 0, "ts": 0, "dur": 1e308}]}' > "$tmp/long.json"
expect_err 1 'no non-negative numeric "dur" of at most' "$tmp/long.json"
echo '{"traceEvents": [{"name": "a", "ph": "B", "pid": 1, "tid": 0, "ts": 0}, {"name": "a", "ph": "E", "pid": 1, "tid": 0, "ts": -1e308}]}' > "$tmp/farE.json"
expect_err 1 'event 1 (ph "E") has "ts" -1e+308, beyond' "$tmp/farE.json"
echo '{"traceEvents": [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "p"}}]}' > "$tmp/empty.json"
expect_err 1 'no slices' "$tmp/empty.json"
expect_err 1 'cannot open' "$tmp/missing.json"
printf 'digraph g {\n  a -- b\n}\n' > "$tmp/bad.dot"
expect_err 1 "bad.dot:2: not a line of the DOT" "$tmp/t.json" --graph "$tmp/bad.dot"
printf 'digraph "g" {\n  n0 [label="a\\n[0, 1)"];\n  n1 [label="b\\n[0, 1)"];\n  n0 -> n1;\n  n1 -> n0;\n}\n' > "$tmp/cycle.dot"
expect_err 1 "has a cycle" "$tmp/t.json" --graph "$tmp/cycle.dot"
printf 'name: x\nmodel: {n_layers: -3}\n' > "$tmp/bad.yaml"
expect_err 1 "the plan did not load" "$tmp/t.json" --plan "$tmp/bad.yaml"
set +e
"$cedar" view "$tmp/t.json" > /dev/null 2> "$tmp/e"; rc=$?
set -e
[ $rc = 2 ] && grep -q -- "-o OUT.html" "$tmp/e" || fail "cedar view without -o: exit $rc, $(cat "$tmp/e")"
# A valid trace from elsewhere: B/E pairs, nesting, a flow bound by "next slice", an instant event.
cat > "$tmp/other.json" <<'EOF'
[{"name": "outer", "ph": "B", "pid": 3, "tid": 9, "ts": 0},
 {"name": "inner", "ph": "X", "pid": 3, "tid": 9, "ts": 2, "dur": 3, "args": {"layer": 4}},
 {"name": "outer", "ph": "E", "pid": 3, "tid": 9, "ts": 10},
 {"name": "i", "ph": "i", "pid": 3, "tid": 9, "ts": 11, "s": "t"},
 {"name": "f", "ph": "s", "pid": 3, "tid": 9, "ts": 3, "id": "0x1"},
 {"name": "f", "ph": "f", "pid": 3, "tid": 4, "ts": 12, "id": "0x1"},
 {"name": "late", "ph": "X", "pid": 3, "tid": 4, "ts": 13, "dur": 1}]
EOF
"$cedar" view "$tmp/other.json" -o "$tmp/other.html" > "$tmp/o" || fail "a B/E trace with nesting is refused"
grep -q "3 tasks on 2 lanes, 1 cross-lane edges" "$tmp/o" || fail "the B/E trace: $(cat "$tmp/o")"
# Two ranks: lanes group by args.rank (rank 0's first, whatever the pids), and a
# transfer task's flow joins the ranks.
cat > "$tmp/ranks.json" <<'EOF'
{"traceEvents": [
 {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "decode CPU 0"}},
 {"name": "thread_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "prefill CPU 0"}},
 {"name": "L0.attn c0 r0", "ph": "X", "pid": 2, "tid": 0, "ts": 0, "dur": 5, "args": {"layer": 0, "mode": "full", "op": "attn", "rank": 0, "pos": 0, "n": 8}},
 {"name": "transfer c0 r0", "ph": "X", "pid": 2, "tid": 0, "ts": 6, "dur": 2, "args": {"op": "transfer", "mode": "-", "rank": 0}},
 {"name": "xfer", "ph": "s", "pid": 2, "tid": 0, "ts": 6, "id": 1},
 {"name": "L0.attn d r0", "ph": "X", "pid": 1, "tid": 0, "ts": 9, "dur": 3, "args": {"layer": 0, "mode": "full", "op": "attn", "rank": 1}},
 {"name": "xfer", "ph": "f", "bp": "e", "pid": 1, "tid": 0, "ts": 9, "id": 1}]}
EOF
"$cedar" view "$tmp/ranks.json" -o "$tmp/ranks.html" > /dev/null || fail "a two-rank trace is refused"
"$py" - "$tmp/ranks.html" <<'EOF' || fail "the two-rank page (above)"
import json, re, sys
d = json.loads(re.search(r'<script id="cedar-data" type="application/json">(.*?)</script>', open(sys.argv[1]).read(), re.S)[1])
lanes = [(l["rank"], l["name"]) for l in d["lanes"]]
if lanes != [(0, "prefill CPU 0"), (1, "decode CPU 0")]:
    sys.exit(f"lanes {lanes}: not grouped by rank")
ev, sym = d["ev"], d["sym"]
a, b = d["flows"]
if sym[ev["op"][a]] != "transfer" or ev["lane"][b] != 1:
    sys.exit("the transfer's flow does not run from the transfer to rank 1")
EOF
echo "view.sh: all checks passed"

#!/usr/bin/env bash
# view_browser.sh: the page `cedar view` writes, in headless Chromium driven
# by playwright-core (tests/cli/view_check.js has the checks): a trace of
# two StarPU workers with its graph and plan loads with no console error,
# shows the trace's lanes, the colours of the modes that ran (read back from
# the canvas), a hover box with a task's layer, chunk, positions, bytes and
# time, the critical path; then a synthetic 100k-task trace on 4 workers
# loads and shows every task. Its load time (navigation to first draw) is
# printed, not asserted: docs/PERF.md records it.
#
# Needs Debian's chromium and npm's playwright-core (`make install-deps`
# installs both); exit 77, saying which is missing, where either is not
# installed, or where StarPU cannot start. CEDAR_PLAYWRIGHT overrides where
# playwright-core is; CEDAR_VIEW_SHOTS=DIR keeps the screenshots.
# Run from the repository root: bash tests/cli/view_browser.sh build/cedar (~30 s)
set -euo pipefail

cedar=${1:?usage: view_browser.sh /path/to/cedar}
plan=tests/oracle/plans/tiny-40.yaml
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
chromium=$(command -v chromium || command -v chromium-browser || true)
node=$(command -v node || command -v nodejs || true)
pw=${CEDAR_PLAYWRIGHT:-}
if [ -z "$pw" ] && command -v npm > /dev/null; then pw="$(npm root -g 2> /dev/null)/playwright-core"; fi
[ -n "$chromium" ] || { echo "SKIP: no chromium (apt-get install chromium; make install-deps)"; exit 77; }
[ -n "$node" ] || { echo "SKIP: no node (apt-get install nodejs npm; make install-deps)"; exit 77; }
[ -n "$pw" ] && [ -f "$pw/package.json" ] ||
  { echo "SKIP: no playwright-core (npm install -g playwright-core@1.65.1; make install-deps)"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
shots=${CEDAR_VIEW_SHOTS:-$tmp}
mkdir -p "$shots"

# ---- a real trace -------------------------------------------------------------
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
"$cedar" view "$tmp/t.json" --graph "$tmp/t.dot" --plan "$plan" -o "$tmp/page.html" > /dev/null ||
  fail "cedar view exited non-zero"
# What the page must show, from the trace and the page's own data block.
"$py" - "$tmp/t.json" "$tmp/page.html" > "$tmp/expect.json" <<'PY'
import json, re, sys
tr = json.load(open(sys.argv[1]))["traceEvents"]
xs = [e for e in tr if e["ph"] == "X"]
names = {e["tid"]: e["args"]["name"] for e in tr if e["ph"] == "M" and e["name"] == "thread_name"}
modes = {"full", "reindex", "reuse", "swa_only"}
keys = sorted({e["args"]["mode"] if e["args"]["mode"] in modes else e["args"]["op"] for e in xs})
page = open(sys.argv[2]).read()
d = json.loads(re.search(r'<script id="cedar-data" type="application/json">(.*?)</script>', page, re.S)[1])
print(json.dumps({"lanes": [names[t] for t in sorted(names)], "events": len(xs), "keys": keys,
                  "hover": True, "graph_crit": d["graph"]["n_crit"]}))
PY
grep -q '"full"' "$tmp/expect.json" && grep -q '"reuse"' "$tmp/expect.json" ||
  fail "the trace lacks full or reuse tasks: $(cat "$tmp/expect.json")"
"$node" tests/cli/view_check.js "$pw" "$chromium" "$tmp/page.html" "$tmp/expect.json" "$shots/view.png" > "$tmp/r1" ||
  fail "the page in chromium (above)"
echo "view_browser: small trace: $(cat "$tmp/r1")"

# ---- 100k tasks -----------------------------------------------------------------
"$py" - "$tmp/big.json" <<'PY'
import json, sys
modes = ["swa_only", "full", "reuse", "reuse", "reindex", "reuse"]
ev = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "synthetic 100k"}}]
for w in range(4):
    ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": w, "args": {"name": f"CPU {w}"}})
n, t, flows = 100000, [0.0] * 4, 0
for i in range(n):
    w, layer = i % 4, (i // 4) % 40
    op = "attn" if i % 2 == 0 else "moe"
    mode = modes[layer % len(modes)] if op == "attn" else "moe"
    d = 5.0 + (i * 7919) % 40
    ev.append({"name": f"L{layer}.{op} c{i // 160} r0", "ph": "X", "cat": op, "pid": 1, "tid": w, "ts": t[w], "dur": d,
               "args": {"layer": layer, "mode": mode, "chunk": i // 160, "request": 0, "flops": 1e6, "bytes": 4096 + i,
                        "op": op, "phase": "prefill_ced", "node": i, "pos": (i // 160) * 64, "n": 64, "rank": 0}})
    t[w] += d + 1.0
    if i % 100 == 1:  # a flow from the previous task (another worker) to this one
        prev = ev[-2]
        ev.append({"name": "dep", "ph": "s", "cat": "dep", "pid": 1, "tid": prev["tid"], "ts": prev["ts"], "id": flows})
        ev.append({"name": "dep", "ph": "f", "bp": "e", "cat": "dep", "pid": 1, "tid": w, "ts": ev[-2]["ts"], "id": flows})
        flows += 1
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
PY
"$cedar" view "$tmp/big.json" -o "$tmp/big.html" > "$tmp/bigout" || fail "cedar view of 100k tasks: $(cat "$tmp/bigout")"
grep -q "100000 tasks on 4 lanes" "$tmp/bigout" || fail "cedar view of 100k tasks: $(cat "$tmp/bigout")"
echo '{"lanes": ["CPU 0", "CPU 1", "CPU 2", "CPU 3"], "events": 100000, "keys": ["full", "reindex", "reuse", "swa_only", "moe"], "hover": true, "graph_crit": null}' > "$tmp/bigexpect.json"
"$node" tests/cli/view_check.js "$pw" "$chromium" "$tmp/big.html" "$tmp/bigexpect.json" "$shots/view-100k.png" > "$tmp/r2" ||
  fail "the 100k-task page in chromium (above)"
echo "view_browser: 100k tasks ($(du -h "$tmp/big.html" | cut -f1) page): $(cat "$tmp/r2")"
echo "view_browser.sh: all checks passed"

#!/usr/bin/env bash
# trace.sh: `cedar run --trace FILE --dot FILE` on the StarPU executor
# (cli/cmd_run.c, viz/trace.c, runtime/exec/exec_starpu.c).
#
#  1. a CED prefill of several chunks on two workers, then decode steps,
#     writes a trace and a DOT file;
#  2. the trace is Chrome Trace Event JSON (tests/cli/trace_check.py):
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

# ---- 2-4. the validator (tests/cli/trace_check.py, shared with the MPI traces) ----
"$py" tests/cli/trace_check.py --selftest > /dev/null || fail "trace_check.py accepts broken traces"
"$py" tests/cli/trace_check.py "$tmp/t.json" --tasks $((pn + steps * dn)) || fail "the trace is not valid (above)"

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

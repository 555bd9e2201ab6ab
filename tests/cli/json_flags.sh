#!/usr/bin/env bash
# json_flags.sh: `--json` where the README says every command takes it (issue
# 28 row 13; cli/cmd_plan_import.c, cli/cmd_view.c, cli/cmd_report.c,
# cli/cmd_tokenize.c). Each prints one JSON object (parsed here) with the
# fields its --help names, and still writes what it writes:
#  - plan import --json: without -o the plan's YAML as "yaml" (equal to the
#    plain output), with -o the file and "out"; layers as the plan has;
#  - plan config --json: the config as an object (equal to the plain
#    output), or with -o the file and "out";
#  - view --json: the page written, its task, lane and edge counts;
#  - report --json (with gnuplot): report.json's object plus "out" and the
#    files written;
#  - detokenize --json: {"ids", "text"}, the text equal to the plain one;
#    tokenize TEXT --json with the option after the text; `--` ends options.
# Run from the repository root: bash tests/cli/json_flags.sh build/cedar (~10 s)
set -euo pipefail
cedar=${1:?usage: json_flags.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { "$cedar" "$@" > "$tmp/out" 2> "$tmp/err" || fail "cedar $* exited $?: $(cat "$tmp/err")"; }
check() { "$py" - "$tmp" "$@" || fail "$1 (above)"; }
plan=tests/plans/ckpt-small.yaml
tiny=tests/oracle/plans/tiny-40.yaml

# plan config and plan import
ok plan config "$plan"
cp "$tmp/out" "$tmp/config.json"
ok plan config "$plan" --json
cp "$tmp/out" "$tmp/config_json.json"
ok plan config "$plan" -o "$tmp/c2.json" --json
cp "$tmp/out" "$tmp/config_o.json"
check "plan config --json" <<'PY'
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/config_json.json"))
assert j["config"] == json.load(open(f"{d}/config.json")) and j["out"] is None and j["plan"] == "ckpt-small", j.keys()
o = json.load(open(f"{d}/config_o.json"))
assert o["out"].endswith("c2.json") and "config" not in o, o
assert json.load(open(f"{d}/c2.json")) == j["config"]
PY
ok plan import "$tmp/config.json"
cp "$tmp/out" "$tmp/plan.yaml"
ok plan import "$tmp/config.json" --json
cp "$tmp/out" "$tmp/import.json"
ok plan import "$tmp/config.json" --json -o "$tmp/p2.yaml"
cp "$tmp/out" "$tmp/import_o.json"
check "plan import --json" <<'PY'
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/import.json"))
assert j["yaml"] == open(f"{d}/plan.yaml").read() and j["out"] is None and j["name"] == "imported", j.keys()
assert j["layers"] == 6 and j["config"].endswith("config.json"), j
o = json.load(open(f"{d}/import_o.json"))
assert o["out"].endswith("p2.yaml") and "yaml" not in o and open(f"{d}/p2.yaml").read() == j["yaml"], o
PY

# view
ok run --plan "$tiny" --tokens 5,6,7,8,9,10,11,12 --max-new 2 --executor starpu --workers 1 --trace "$tmp/t.json"
ok view "$tmp/t.json" --plan "$tiny" -o "$tmp/v.html" --json
cp "$tmp/out" "$tmp/view.json"
[ -s "$tmp/v.html" ] || fail "view --json wrote no page"
check "view --json" <<'PY'
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/view.json"))
n = sum(1 for e in json.load(open(f"{d}/t.json"))["traceEvents"] if e.get("ph") == "X")
assert j["out"].endswith("v.html") and j["tasks"] >= 1 and j["lanes"] >= 1 and j["graph"] is None, j
assert j["tasks"] <= n, (j["tasks"], n)
PY

# report
if command -v gnuplot > /dev/null; then
  ok report "$tiny" --out "$tmp/r" --no-measure --tokens 1024,4096 --json
  cp "$tmp/out" "$tmp/report_out.json"
  check "report --json" <<'PY'
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/report_out.json"))
r = json.load(open(f"{d}/r/report.json"))
assert j["out"].endswith("/r") and j["n_measured"] == 0, j.keys()
assert set(j["files"]) == {"index.html", "report.json", "memory.png", "prefix_hit.png"}, j["files"]
assert {k: v for k, v in j.items() if k not in ("out", "files", "n_measured")} == r
PY
else
  echo "json_flags: no gnuplot: report --json not checked"
fi

# tokenize and detokenize
if "$cedar" tokenize hi > "$tmp/plain_ids" 2> "$tmp/err"; then
  ok tokenize hi --json
  cp "$tmp/out" "$tmp/tok.json"
  ids=$(cat "$tmp/plain_ids")
  # shellcheck disable=SC2086
  ok detokenize $ids
  cp "$tmp/out" "$tmp/plain_text"
  # shellcheck disable=SC2086
  ok detokenize $ids --json
  cp "$tmp/out" "$tmp/detok.json"
  ok tokenize --json -- -hi
  cp "$tmp/out" "$tmp/dash.json"
  check "tokenize/detokenize --json" <<'PY'
import json, sys
d = sys.argv[1]
ids = [int(x) for x in open(f"{d}/plain_ids").read().split()]
assert json.load(open(f"{d}/tok.json"))["ids"] == ids
j = json.load(open(f"{d}/detok.json"))
assert j["ids"] == ids and j["text"] == open(f"{d}/plain_text").read() == "hi", j
assert len(json.load(open(f"{d}/dash.json"))["ids"]) >= 1
PY
else
  echo "json_flags: no tokenizer data ($(head -1 "$tmp/err")): tokenize/detokenize not checked"
fi
echo "json_flags: plan import, plan config, view, report, tokenize and detokenize print JSON with --json"

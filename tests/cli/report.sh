#!/usr/bin/env bash
# report.sh: `cedar report PLAN... --out DIR` (cli/cmd_report.c, cli/study.c).
#
#  1. on the shipped plans without runs: DIR holds index.html, report.json,
#     memory.png and prefix_hit.png (PNG files), and no time plots; every
#     memory figure (by state class, at each N) equals what `cedar plan
#     cost --tokens N --json` says for that plan (global = Main-KV +
#     Indexer-K, SWA, tails), and every prefix-hit case equals `cedar plan
#     cost --prompt n [--hit c --swa-hit|--swa-miss] --json`; the page embeds each
#     plot and names each plan;
#  2. with runs: a small plan is measured (prefill and decode time, drift
#     from --exact-replay, the run's state equal to plan cost's, the encoder
#     entries bitwise equal under exact replay as SPEC's CED requires), the
#     flash plan is not run (its weights exceed --max-weights) and the
#     report says why; time.png and drift.png are written;
#  3. usage errors exit 2, a plan that does not load exits 1.
# Nothing depends on the model's numbers: figures are compared with `plan
# cost`, runs are checked for structure. Exit 77 without gnuplot.
# Run from the repository root: bash tests/cli/report.sh build/cedar (~20 s)
set -euo pipefail
cedar=${1:?usage: report.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
command -v gnuplot > /dev/null || { echo "SKIP: no gnuplot (apt-get install gnuplot-nox; make install-deps)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

plans="plans/v41-mini.yaml plans/dense-40.yaml plans/alt-reindex2.yaml plans/alt-two-dec-sources.yaml plans/v41-flash.yaml"
# shellcheck disable=SC2086
"$cedar" report $plans --out "$tmp/r" --no-measure --tokens 1024,65536,1000000 --prompt 4096 > "$tmp/out" ||
  fail "cedar report exited non-zero: $(cat "$tmp/out")"
grep -q "5 plans, 0 measured" "$tmp/out" || fail "summary: $(cat "$tmp/out")"
for f in index.html report.json memory.png prefix_hit.png; do [ -s "$tmp/r/$f" ] || fail "no $f"; done
for f in memory.png prefix_hit.png; do
  head -c 8 "$tmp/r/$f" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "$f is not a PNG"
done
[ ! -e "$tmp/r/time.png" ] || fail "time.png without measuring"
for p in $plans; do
  for n in 1024 65536 1000000; do "$cedar" plan cost "$p" --tokens "$n" --prompt 4096 --json > "$tmp/cost_$(basename "$p")_$n.json"; done
  "$cedar" plan cost "$p" --prompt 4096 --hit 2048 --swa-hit --json > "$tmp/hit_$(basename "$p").json"
  "$cedar" plan cost "$p" --prompt 4096 --hit 2048 --swa-miss --json > "$tmp/miss_$(basename "$p").json"
done
"$py" - "$tmp" <<'PY' || fail "report.json against plan cost (above)"
import json, os, sys
d = sys.argv[1]
rep = json.load(open(f"{d}/r/report.json"))
page = open(f"{d}/r/index.html").read()
for img in ("memory.png", "prefix_hit.png"):
    if f'src="{img}"' not in page:
        sys.exit(f"index.html does not embed {img}")
if len(rep["plans"]) != 5:
    sys.exit("not 5 plans")
for p in rep["plans"]:
    b = os.path.basename(p["path"])
    if p["name"] not in page:
        sys.exit(f"index.html does not name {p['name']}")
    if [m["tokens"] for m in p["memory"]] != [1024, 65536, 1000000]:
        sys.exit(f"{b}: memory at {[m['tokens'] for m in p['memory']]}")
    for m in p["memory"]:
        c = json.load(open(f"{d}/cost_{b}_{m['tokens']}.json"))
        want = {"global": c["global"]["bytes"], "swa": c["swa"]["payload_bytes"] + c["swa"]["scale_bytes"],
                "tails": c["tails"]["bytes"], "baseline": c["global"]["baseline_bytes"]}
        got = {"global": m["main_kv"] + m["indexer_k"], "swa": m["swa"], "tails": m["tails"], "baseline": m["baseline"]}
        if want != got:
            sys.exit(f"{b} at N={m['tokens']}: report {got}, plan cost {want}")
        main = sum(s["entries"] * s["main_bytes"] for s in c["global"]["sources"])
        if m["main_kv"] != main or m["total"] != sum(got[k] for k in ("global", "swa", "tails")):
            sys.exit(f"{b} at N={m['tokens']}: Main-KV {m['main_kv']} (plan cost {main}) or total")
    cold = json.load(open(f"{d}/cost_{b}_1024.json"))["cold_prefill"]
    hit = json.load(open(f"{d}/hit_{b}.json"))["prefix_hit"]
    miss = json.load(open(f"{d}/miss_{b}.json"))["prefix_hit"]
    cases = p["prefix_hit"]
    for got, want, name in ((cases[0], cold, "cold"), (cases[1], hit, "hit"), (cases[2], miss, "miss")):
        if (got["token_layers"], got["new_bytes"]) != (want["token_layers"], want["new_bytes"]):
            sys.exit(f"{b} {name}: report {got}, plan cost {want}")
    if p["measured"].get("not_run") != "--no-measure":
        sys.exit(f"{b}: measured without runs: {p['measured']}")
print("report: memory and prefix-hit figures equal plan cost for", len(rep["plans"]), "plans")
PY

# ---- 2. runs ----------------------------------------------------------------------
"$cedar" report tests/oracle/plans/tiny-40.yaml plans/v41-flash.yaml --out "$tmp/m" --tokens 1024 --prompt 256 \
  --measure-prompt 64 --decode 3 > "$tmp/out" 2> "$tmp/err" || fail "measured report: $(cat "$tmp/err")"
grep -q "2 plans, 1 measured" "$tmp/out" || fail "measured summary: $(cat "$tmp/out")"
for f in time.png drift.png; do [ -s "$tmp/m/$f" ] || fail "no $f"; done
"$py" - "$tmp/m/report.json" "$tmp/m/index.html" <<'PY' || fail "the measured report (above)"
import json, sys
rep = json.load(open(sys.argv[1]))
tiny, flash = rep["plans"]
m = tiny["measured"]
for k in ("prefill_s", "decode_itl_s", "drift_rel_rms", "drift_max_abs", "command"):
    if k not in m:
        sys.exit(f"tiny: no {k}: {m}")
if not (m["prefill_s"] > 0 and m["decode_itl_s"] > 0 and m["drift_rel_rms"] >= 0):
    sys.exit(f"tiny: times {m}")
if not m["state_agrees_with_plan_cost"] or not m["encoder_entries_equal"]:
    sys.exit(f"tiny: state or encoder entries: {m}")
if "--exact-replay" not in m["command"] or "--executor direct" not in m["command"]:
    sys.exit(f"tiny: command {m['command']}")
if "--max-weights" not in flash["measured"].get("not_run", ""):
    sys.exit(f"flash: {flash['measured']}")
page = open(sys.argv[2]).read()
if 'src="time.png"' not in page or 'src="drift.png"' not in page or "--max-weights" not in page:
    sys.exit("index.html lacks the time and drift plots or the reason flash was not run")
print("report: tiny measured, flash skipped with its reason")
PY

# ---- 3. errors -------------------------------------------------------------------------
set +e
"$cedar" report plans/v41-mini.yaml > /dev/null 2> "$tmp/e"; rc=$?
[ $rc = 2 ] && grep -q -- "--out DIR" "$tmp/e" || fail "no --out: exit $rc: $(cat "$tmp/e")"
"$cedar" report --out "$tmp/x" > /dev/null 2> "$tmp/e"; rc=$?
[ $rc = 2 ] || fail "no plan: exit $rc"
"$cedar" report plans/v41-mini.yaml --out "$tmp/x" --tokens 12,abc > /dev/null 2> "$tmp/e"; rc=$?
[ $rc = 2 ] && grep -q -- "--tokens" "$tmp/e" || fail "bad --tokens: exit $rc"
printf 'name: x\nmodel: {n_layers: -3}\n' > "$tmp/bad.yaml"
"$cedar" report "$tmp/bad.yaml" --out "$tmp/x" --no-measure > /dev/null 2> "$tmp/e"; rc=$?
[ $rc = 1 ] && grep -q "bad.yaml:2" "$tmp/e" || fail "bad plan: exit $rc: $(cat "$tmp/e")"
set -e
echo "report.sh: all checks passed"

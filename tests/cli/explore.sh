#!/usr/bin/env bash
# explore.sh: `cedar explore BASE --vary KEY=V1,V2 ...` (cli/cmd_explore.c).
#
#  1. a 2 x 3 x 2 sweep of the shipped mini plan (the SWA window, the
#     reindex period, the decoder replay with one value the loader refuses):
#     12 variants; the refused ones carry the loader's file:line:col error
#     naming the key; every valid variant file is an ordinary plan whose
#     `cedar plan cost --json` gives the figures explore reports (memory by
#     class, prefill token-layers, decode key-dots); the reindex schedule
#     puts reindex layers exactly every P decoder layers after the decoder
#     source; the window changes SWA bytes; the Pareto front equals the one
#     recomputed here (non-dominated in memory, token-layers, key-dots);
#  2. schedule.decoder_source=30 costs as plans/alt-two-dec-sources.yaml;
#  3. --measure time,drift on a small plan: every variant measured, the
#     front recomputed with drift as a third objective, pareto.png written;
#  4. usage errors exit 2 (no =, unknown key family, a value that is not a
#     plain scalar, no --vary, too many variants), a missing base exits 1.
# Exit 77 without gnuplot (the --out plots). Run from the repository root:
#   bash tests/cli/explore.sh build/cedar (~20 s)
set -euo pipefail
cedar=${1:?usage: explore.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || { echo "SKIP: /usr/bin/python3 is missing"; exit 77; }
command -v gnuplot > /dev/null || { echo "SKIP: no gnuplot (apt-get install gnuplot-nox; make install-deps)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cedar" explore plans/v41-mini.yaml --vary model.swa.window=64,128 --vary schedule.reindex_period=2,4,0 \
  --vary serving.replay.decoder=64,999999999999 --tokens 65536 --prompt 4096 --json --out "$tmp/e" > "$tmp/e.json" ||
  fail "cedar explore --json exited non-zero"
[ -s "$tmp/e/pareto.png" ] && [ -s "$tmp/e/explore.json" ] || fail "no pareto.png or explore.json in --out"
for f in "$tmp"/e/variants/v*.yaml; do
  "$cedar" plan cost "$f" --tokens 65536 --prompt 4096 --json > "${f%.yaml}.cost.json" 2> /dev/null || true
done
"$py" - "$tmp/e.json" "$tmp/e/variants" <<'PY' || fail "the sweep (above)"
import json, sys
d = json.load(open(sys.argv[1]))
vs = d["variants"]
if len(vs) != 12 or d["keys"] != ["model.swa.window", "schedule.reindex_period", "serving.replay.decoder"]:
    sys.exit(f"{len(vs)} variants, keys {d['keys']}")
valid = [v for v in vs if v["valid"]]
bad = [v for v in vs if not v["valid"]]
if len(valid) != 6 or any(v["values"]["serving.replay.decoder"] != "999999999999" for v in bad):
    sys.exit("the refused variants are not exactly those with the huge replay")
for v in bad:
    if f"v{v['id']}.yaml:" not in v["error"] or "serving.replay.decoder" not in v["error"]:
        sys.exit(f"v{v['id']}: error {v['error']!r} lacks file:line:col or the key")
for v in valid:
    c = json.load(open(f"{sys.argv[2]}/v{v['id']}.cost.json"))
    m, w = v["memory"], v["work"]
    want = (c["global"]["bytes"], c["swa"]["payload_bytes"] + c["swa"]["scale_bytes"], c["tails"]["bytes"],
            c["cold_prefill"]["token_layers"], c["indexer"]["key_dots"])
    got = (m["main_kv"] + m["indexer_k"], m["swa"], m["tails"], w["token_layers"], w["decode_key_dots"])
    if want != got or m["total"] != sum(got[:3]):
        sys.exit(f"v{v['id']}: explore {got}, plan cost {want}")
    P = int(v["values"]["schedule.reindex_period"])
    reindex = sorted(x["layer"] for x in c["indexer"]["layers"] if x["mode"] == "reindex")
    expect = [l for l in range(21, 40) if P and (l - 20) % P == 0]
    if reindex != expect:
        sys.exit(f"v{v['id']} period {P}: reindex layers {reindex}, expected {expect}")
by = {(v["values"]["model.swa.window"], v["values"]["schedule.reindex_period"]): v for v in valid}
if not by[("64", "4")]["memory"]["swa"] < by[("128", "4")]["memory"]["swa"]:
    sys.exit("a smaller window does not shrink SWA")
def dom(a, b):
    x = (a["memory"]["total"], a["work"]["token_layers"], a["work"]["decode_key_dots"])
    y = (b["memory"]["total"], b["work"]["token_layers"], b["work"]["decode_key_dots"])
    return all(p <= q for p, q in zip(x, y)) and x != y
front = sorted(v["id"] for v in valid if not any(dom(u, v) for u in valid))
if front != sorted(d["pareto"]) or not front or any(v["pareto"] != (v["id"] in front) for v in vs):
    sys.exit(f"front {d['pareto']}, recomputed {front}")
print(f"explore: 12 variants, 6 refused with the loader's error, front {front}")
PY

# ---- 2. a second decoder source ---------------------------------------------------------
"$cedar" explore plans/v41-mini.yaml --vary schedule.decoder_source=none,30 --json > "$tmp/s.json" ||
  fail "decoder_source sweep"
"$cedar" plan cost plans/alt-two-dec-sources.yaml --tokens 65536 --prompt 4096 --json > "$tmp/alt.json"
"$cedar" plan cost plans/v41-mini.yaml --tokens 65536 --prompt 4096 --json > "$tmp/mini.json"
"$py" - "$tmp/s.json" "$tmp/alt.json" "$tmp/mini.json" <<'PY' || fail "decoder_source (above)"
import json, sys
d, alt, mini = (json.load(open(p)) for p in sys.argv[1:4])
none, at30 = d["variants"]
for v, c in ((none, mini), (at30, alt)):
    if not v["valid"] or v["work"]["decode_key_dots"] != c["indexer"]["key_dots"] or \
            v["memory"]["main_kv"] + v["memory"]["indexer_k"] != c["global"]["bytes"]:
        sys.exit(f"v{v['id']}: {v}")
if not at30["memory"]["main_kv"] > none["memory"]["main_kv"]:
    sys.exit("a second decoder source does not add global KV")
print("explore: decoder_source=30 costs as alt-two-dec-sources")
PY

# ---- 3. measured --------------------------------------------------------------------------
"$cedar" explore tests/oracle/plans/tiny-40.yaml --vary serving.replay.decoder=8,24 --vary schedule.reindex_period=2,0 \
  --measure time,drift --measure-prompt 64 --decode 3 --json --out "$tmp/m" > "$tmp/m.json" 2> "$tmp/m.err" ||
  fail "measured explore: $(cat "$tmp/m.err")"
[ -s "$tmp/m/pareto.png" ] || fail "no pareto.png"
"$py" - "$tmp/m.json" <<'PY' || fail "the measured sweep (above)"
import json, sys
d = json.load(open(sys.argv[1]))
vs = d["variants"]
if d["objectives"][-1] != "drift" or len(vs) != 4:
    sys.exit(f"objectives {d['objectives']}, {len(vs)} variants")
for v in vs:
    m = v.get("measured", {})
    if not v["valid"] or not (m.get("prefill_s", 0) > 0 and m.get("decode_itl_s", 0) > 0 and m.get("drift_rel_rms", -1) >= 0):
        sys.exit(f"v{v['id']}: {v}")
    if not m["state_agrees_with_plan_cost"]:
        sys.exit(f"v{v['id']}: the run's state differs from plan cost")
key = lambda v: (v["memory"]["total"], v["work"]["token_layers"], v["work"]["decode_key_dots"], v["measured"]["drift_rel_rms"])
dom = lambda a, b: all(p <= q for p, q in zip(key(a), key(b))) and key(a) != key(b)
front = sorted(v["id"] for v in vs if not any(dom(u, v) for u in vs))
if front != sorted(d["pareto"]):
    sys.exit(f"front {d['pareto']}, recomputed {front}")
print(f"explore: 4 variants measured, front with drift {front}")
PY
"$cedar" explore tests/oracle/plans/tiny-40.yaml --vary serving.replay.decoder=8,24 > "$tmp/t.out" || fail "table output"
grep -q "^Pareto front" "$tmp/t.out" && grep -q "^v2 " "$tmp/t.out" || fail "table: $(cat "$tmp/t.out")"

# ---- 4. errors ---------------------------------------------------------------------------------
expect2() {
  set +e
  "$cedar" explore "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  set -e
  [ $rc = 2 ] || fail "cedar explore $* exited $rc, expected 2: $(cat "$tmp/err")"
}
expect2 plans/v41-mini.yaml --vary model.swa.window
expect2 plans/v41-mini.yaml --vary name.x=1,2
expect2 plans/v41-mini.yaml --vary 'model.swa.window=1,{a: 2}'
expect2 plans/v41-mini.yaml
expect2 plans/v41-mini.yaml --vary schedule.nonsense=1
expect2 plans/v41-mini.yaml --vary model.a.b=1,2,3,4,5,6,7,8 --vary model.c.d=1,2,3,4,5,6,7,8 --vary model.e.f=1,2,3,4,5,6,7,8,9
set +e
"$cedar" explore "$tmp/missing.yaml" --vary model.swa.window=1 > /dev/null 2> "$tmp/err"; rc=$?
set -e
[ $rc = 1 ] && grep -q "missing.yaml" "$tmp/err" || fail "missing base: exit $rc: $(cat "$tmp/err")"
echo "explore.sh: all checks passed"

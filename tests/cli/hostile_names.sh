#!/usr/bin/env bash
# hostile_names.sh: names that are data, never script (issue 28 rows 1, 8;
# base/quote.h, cli/cmd_report.c, cli/cmd_explore.c).
#
#  1. report: a plan named `x'; system 'touch PWNED'; print '` and one named
#     `Bob's schedule` (with another holding a newline and a backslash):
#     report exits 0, writes PNG plots, runs no command (no PWNED file
#     anywhere), and the scripts carry each name as one quoted literal;
#     measured (tiny plans), the bar labels of time.png and drift.png too;
#  2. explore: a base file named `b'; system 'touch PWNED'; print '.yaml`
#     runs nothing; a base named `trial: window sweep` gives valid variants
#     named `trial: window sweep-vN`; a base name holding newlines and
#     `serving:\n  ced: false` stays the name: the variants keep CED on;
#  3. explore exits 1, naming the refusal, when every variant is invalid
#     (with and without --out and --json; no earlier pareto.png is left in
#     --out), and 0 when one is valid;
#  4. `plan import --name` with a newline and `layer_overrides: [...]`:
#     the name stays the name, the plan equals the plainly named import;
#  5. `bench engram --plan` on a path holding `: ` and a quote: its variant
#     plans extend it (the path a quoted scalar) and run.
# Exit 77 without gnuplot. Run from the repository root:
#   bash tests/cli/hostile_names.sh build/cedar (~15 s)
set -euo pipefail
cedar=${1:?usage: hostile_names.sh /path/to/cedar}
command -v gnuplot > /dev/null || { echo "SKIP: no gnuplot (apt-get install gnuplot-nox; make install-deps)"; exit 77; }
cedar=$(realpath "$cedar")
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
no_pwned() { [ -z "$(find "$tmp" "$root" -maxdepth 3 -name 'PWNED*' -print -quit)" ] || fail "$1 ran a command from a name"; }
is_png() { head -c 8 "$1" | od -An -tx1 | grep -q "89 50 4e 47 0d 0a 1a 0a" || fail "$1 is not a PNG"; }
mini=$root/plans/v41-mini.yaml

# 1. report
printf 'extends: %s\nname: "x'"'"'; system '"'"'touch PWNED'"'"'; print '"'"'"\n' "$mini" > "$tmp/evil.yaml"
printf 'extends: %s\nname: "Bob'"'"'s schedule"\n' "$mini" > "$tmp/bob.yaml"
printf 'extends: %s\nname: "two\\nlines \\\\ and \\"quotes\\""\n' "$mini" > "$tmp/nl.yaml"
for p in evil bob nl; do "$cedar" plan check "$tmp/$p.yaml" > /dev/null 2>&1 || fail "plan check refused $p.yaml"; done
(cd "$tmp" && "$cedar" report evil.yaml bob.yaml nl.yaml --out r --no-measure --tokens 1024,4096 > out 2>&1) ||
  fail "report exited non-zero: $(cat "$tmp/out"; cat "$tmp"/r/*.log 2> /dev/null)"
no_pwned report
for f in memory.png prefix_hit.png; do is_png "$tmp/r/$f"; done
grep -qF "title 'x''; system ''touch PWNED''; print '''" "$tmp/r/memory.gp" || fail "memory.gp lacks the quoted evil name"
grep -qF "title 'Bob''s schedule'" "$tmp/r/memory.gp" || fail "memory.gp lacks 'Bob''s schedule'"
grep -qF "title 'Bob''s schedule'" "$tmp/r/prefix_hit.gp" || fail "prefix_hit.gp lacks 'Bob''s schedule'"
grep -qF "title 'two lines \\ and \"quotes\"'" "$tmp/r/memory.gp" || fail "memory.gp: the newline name is not one line"
grep -q "Bob&#39;s schedule\|Bob's schedule" "$tmp/r/index.html" || fail "index.html does not name Bob's schedule"
# measured (tiny plans, a 16-token prompt): the bar labels of time.gp and drift.gp carry the names too
tiny=$root/tests/oracle/plans/tiny-40.yaml
sed "s|$mini|$tiny|" "$tmp/evil.yaml" > "$tmp/evil_t.yaml"
sed "s|$mini|$tiny|" "$tmp/bob.yaml" > "$tmp/bob_t.yaml"
(cd "$tmp" && "$cedar" report evil_t.yaml bob_t.yaml --out rm --measure-prompt 16 --decode 2 --tokens 1024 > out 2>&1) ||
  fail "measured report exited non-zero: $(cat "$tmp/out")"
no_pwned "measured report"
grep -q "2 measured" "$tmp/out" || fail "measured report: $(cat "$tmp/out")"
for f in time.png drift.png; do is_png "$tmp/rm/$f"; done
grep -qF "set xtics ('x''; system ''touch PWNED''; print ''' 0, 'Bob''s schedule' 1)" "$tmp/rm/time.gp" ||
  fail "time.gp's bar labels: $(grep xtics "$tmp/rm/time.gp")"

# 2. explore
evil_base="b'; system 'touch PWNED'; print '.yaml"
printf 'extends: %s\nname: "trial: window sweep"\n' "$mini" > "$tmp/$evil_base"
(cd "$tmp" && "$cedar" explore "$evil_base" --vary model.swa.window=64,128 --out x1 > out 2>&1) ||
  fail "explore of $evil_base exited non-zero: $(cat "$tmp/out")"
no_pwned explore
is_png "$tmp/x1/pareto.png"
for v in 1 2; do
  "$cedar" plan show --json "$tmp/x1/variants/v$v.yaml" > "$tmp/show.json" 2> /dev/null || fail "variant v$v does not load"
  grep -q '"name":[[:space:]]*"trial: window sweep-v'$v'"' "$tmp/show.json" || fail "v$v's name: $(grep '"name"' "$tmp/show.json")"
done
printf 'extends: %s\nname: "two\\nserving:\\n  ced: false"\n' "$mini" > "$tmp/inject.yaml"
"$cedar" plan show --json "$tmp/inject.yaml" > "$tmp/show.json" 2> /dev/null || fail "inject.yaml does not load"
grep -q '"ced":[[:space:]]*true' "$tmp/show.json" || fail "inject.yaml itself has CED off"
"$cedar" explore "$tmp/inject.yaml" --vary model.swa.window=64,128 --out "$tmp/x2" > /dev/null 2>&1 || fail "explore inject.yaml"
for v in 1 2; do
  "$cedar" plan show --json "$tmp/x2/variants/v$v.yaml" 2> /dev/null > "$tmp/show.json" || fail "inject v$v does not load"
  grep -q '"ced":[[:space:]]*true' "$tmp/show.json" || fail "the name's newlines injected keys: v$v has CED off"
done

# 3. every variant invalid: exit 1 with the refusal named
mkdir -p "$tmp/x3"
echo stale > "$tmp/x3/pareto.png"
for args in "" "--json" "--out $tmp/x3" "--json --out $tmp/x4"; do
  rc=0
  # shellcheck disable=SC2086
  "$cedar" explore "$mini" --vary serving.replay.decoder=999999999999,99999999999 $args > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" = 1 ] || fail "explore $args with every variant invalid exited $rc"
  grep -q "every one of the 2 variants was refused.*serving.replay.decoder" "$tmp/err" || fail "explore $args: $(cat "$tmp/err")"
done
[ ! -e "$tmp/x3/pareto.png" ] || fail "an earlier run's pareto.png outlived a sweep with no valid variant"
"$cedar" explore "$mini" --vary serving.replay.decoder=64,999999999999 > /dev/null 2>&1 || fail "one valid variant must exit 0"
# 4. plan import --name: the name is the plan's name, not YAML of its own
"$cedar" plan config "$root/tests/plans/ckpt-small.yaml" -o "$tmp/config.json" > /dev/null || fail "plan config"
evil_name=$'evil\nlayer_overrides: [{at: 3, mode: full, candidates: build}]'
"$cedar" plan import "$tmp/config.json" --name "$evil_name" -o "$tmp/imp_evil.yaml" 2> "$tmp/err" ||
  fail "plan import --name with a newline: $(cat "$tmp/err")"
"$cedar" plan import "$tmp/config.json" -o "$tmp/imp.yaml" > /dev/null || fail "plan import"
"$cedar" plan show --json "$tmp/imp_evil.yaml" > "$tmp/a.json" 2> /dev/null || fail "the imported plan does not load"
"$cedar" plan show --json "$tmp/imp.yaml" > "$tmp/b.json" 2> /dev/null || fail "the plain import does not load"
/usr/bin/python3 - "$tmp" "$evil_name" <<'PY' || fail "plan import --name (above)"
import json, sys
d = sys.argv[1]
a, b = json.load(open(f"{d}/a.json")), json.load(open(f"{d}/b.json"))
assert a["name"] == sys.argv[2], a["name"]
a.pop("name"), b.pop("name"), a.pop("path"), b.pop("path")
assert a == b, "the name's newline changed the plan"
PY
# 5. bench engram writes its variant plans with the --plan path quoted
mkdir -p "$tmp/dir: it's"
printf 'extends: "%s"\nname: bench-base\n' "$root/tests/oracle/plans/tiny-40.yaml" > "$tmp/dir: it's/p: x.yaml"
"$cedar" bench engram --plan "$tmp/dir: it's/p: x.yaml" --steps 2 --prompt-len 8 > "$tmp/b.txt" 2>&1 ||
  fail "bench engram on a path with ': ' and a quote: $(tail -3 "$tmp/b.txt")"
grep -q "bitwise equal" "$tmp/b.txt" || fail "bench engram: $(tail -3 "$tmp/b.txt")"
echo "hostile_names: report and explore keep hostile names as data; plan import --name and bench engram too; all-invalid explore exits 1"

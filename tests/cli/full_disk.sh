#!/usr/bin/env bash
# full_disk.sh: no command exits 0 after a failed write, and none leaves a
# truncated file or a `*.tmp.*` temporary behind (issue 28 rows 5 and 12;
# base/file.h's writer).
#  1. `ulimit -f` (EFBIG; SIGXFSZ is ignored, so no silent death by signal):
#     weights init (both layouts), run --trace, view -o, plan config -o,
#     graph dot -o: exit 1 naming the file size limit, no output, no
#     temporary.
#  2. a full disk (a 1 MiB tmpfs, filled, in a private mount namespace via
#     `unshare -rm`; skipped where user namespaces are off): the same writers
#     and `report` / `explore --out` (gnuplot's image checked): exit 1 naming
#     the full disk, nothing partial left.
#  3. standard output on /dev/full: exit 1, not 0.
# Usage: bash tests/cli/full_disk.sh path/to/cedar   (from the repo root)
set -uo pipefail
cedar=$(realpath "${1:?usage: full_disk.sh /path/to/cedar}")
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
tiny=$root/tests/oracle/plans/tiny.yaml
ckplan=$root/tests/plans/ckpt-small.yaml
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cedar" run --plan "$tiny" --tokens 1,2,3 --max-new 2 --trace "$tmp/t.json" > /dev/null 2>&1 || fail "making a trace"

# must_fail DIR WANT LABEL CMD...: exit 1 (not 0, not a signal), WANT in the
# message, and DIR holding no temporary and nothing named in OUTS.
must_fail() {
  local dir=$1 want=$2 label=$3 rc=0
  shift 3
  timeout 120 "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  [ "$rc" -eq 1 ] || { cat "$tmp/err" >&2; fail "$label: exit $rc, want 1"; }
  grep -qi -- "$want" "$tmp/err" || { cat "$tmp/err" >&2; fail "$label: no '$want' in the message"; }
  local left
  left=$(find "$dir" -name '*.tmp.*' | head -3)
  [ -z "$left" ] || fail "$label: temporaries left behind: $left"
}

# The writers, each given an output directory $1 and the expected message $2.
writers() {
  local d=$1 want=$2
  must_fail "$d" "$want" "weights init" "$cedar" weights init --plan "$tiny" --seed 1 --out "$d/w.st"
  [ ! -e "$d/w.st" ] || fail "weights init: $d/w.st left behind"
  must_fail "$d" "$want" "weights init --layout released" \
    "$cedar" weights init --layout released --plan "$ckplan" --seed 1 --out "$d/ck" --shard-bytes 3M
  [ ! -e "$d/ck/config.json" ] && [ ! -e "$d/ck/model.safetensors.index.json" ] ||
    fail "weights init --layout released: an index or config.json claims a checkpoint that was not written"
  must_fail "$d" "$want" "run --trace" "$cedar" run --plan "$tiny" --tokens 1,2,3 --max-new 2 --trace "$d/t.json"
  [ ! -e "$d/t.json" ] || fail "run --trace: a partial trace left behind"
  must_fail "$d" "$want" "view -o" "$cedar" view "$tmp/t.json" -o "$d/v.html"
  [ ! -e "$d/v.html" ] || fail "view -o: a partial page left behind"
  must_fail "$d" "$want" "plan config -o" "$cedar" plan config "$ckplan" -o "$d/config.json"
  [ ! -e "$d/config.json" ] || fail "plan config -o: a partial file left behind"
  must_fail "$d" "$want" "graph dot -o" "$cedar" graph dot --plan "$tiny" --prompt-len 8 -o "$d/g.dot"
  [ ! -e "$d/g.dot" ] || fail "graph dot -o: a partial file left behind"
}

# 1. the file size limit: one 512-byte block, less than any of the outputs
mkdir "$tmp/lim"
(ulimit -f 1 && writers "$tmp/lim" "file too large") || exit 1

# 2. a full disk
if unshare -rm true 2> /dev/null && command -v mount > /dev/null; then
  export cedar tiny ckplan tmp root
  export -f must_fail writers fail
  unshare -rm bash -c '
    set -uo pipefail
    mnt=$tmp/mnt && mkdir "$mnt" && mount -t tmpfs -o size=1m tmpfs "$mnt" || exit 3
    head -c 2M /dev/zero > "$mnt/filler" 2> /dev/null
    [ "$(df --output=avail "$mnt" | tail -1)" -eq 0 ] || fail "the tmpfs is not full"
    writers "$mnt" "no space left on the device"
    if command -v gnuplot > /dev/null; then
      must_fail "$mnt" "no space left\|wrote no" "report" \
        "$cedar" report "$tiny" --out "$mnt/r" --no-measure --tokens 1024 --prompt 256
      [ ! -s "$mnt/r/index.html" ] || fail "report: an index.html on a full disk"
      find "$mnt/r" -type f -empty | grep -q . && fail "report: empty files left: $(find "$mnt/r" -type f -empty)"
      must_fail "$mnt" "no space left\|wrote no" "explore --out" \
        "$cedar" explore "$root/plans/v41-mini.yaml" --vary model.swa.window=64,128 --out "$mnt/x"
      find "$mnt/x" -type f -empty | grep -q . && fail "explore: empty files left: $(find "$mnt/x" -type f -empty)"
      # room for the data files and scripts (a few KiB), none for the images:
      # gnuplot may exit 0 with its image cut short; report must not
      rm -f "$mnt/filler" && rm -rf "$mnt/r" "$mnt/x"
      head -c $((1024 - 24))K /dev/zero > "$mnt/filler" 2> /dev/null
      must_fail "$mnt" "no space left\|wrote no\|gnuplot" "report (the images do not fit)" \
        "$cedar" report "$tiny" --out "$mnt/r" --no-measure --tokens 1024 --prompt 256
      [ ! -e "$mnt/r/index.html" ] || fail "report: an index.html when its images did not fit"
      find "$mnt/r" -name "*.png" -empty | grep -q . && fail "report: empty images left"
    else
      echo "full_disk: no gnuplot; report and explore on a full disk skipped"
    fi
    exit 0
  ' || fail "the full-disk cases (above)"
else
  echo "full_disk: no user namespaces (unshare -rm); the full-disk cases are skipped, ulimit -f covered"
fi

# 3. standard output on /dev/full
rc=0
"$cedar" plan show "$tiny" > /dev/full 2> "$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "writing standard output failed" "$tmp/err" ||
  { cat "$tmp/err" >&2; fail "plan show > /dev/full: exit $rc, want 1"; }
rc=0
"$cedar" tokenize --help > /dev/full 2> "$tmp/err" || rc=$?
[ "$rc" -eq 1 ] || fail "tokenize --help > /dev/full: exit $rc, want 1"
echo "full_disk: ok"

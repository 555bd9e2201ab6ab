#!/usr/bin/env bash
# tokenizer_js.sh: cedar's tokenizer against the JS implementation it must
# equal byte for byte (@lenml/tokenizers under node, issue 13 section 3), on
# the corpus tests/tokenizer/corpus (English, code, numbers, whitespace runs,
# emoji, special tokens in text, invalid UTF-8) and the Chinese seed article
# (../shared/seed), plus a generated file of every corpus line joined with
# runs of spaces and newlines. Then the round trip: detokenize(tokenize(F))
# == F (with U+FFFD for the invalid bytes, as both sides read them), and the
# --json and plain forms agree. Skips (77) without node or the npm cache; CI
# has both (make install-deps).
# Run from the repository root: bash tests/cli/tokenizer_js.sh build/cedar
set -euo pipefail

cedar=${1:?usage: tokenizer_js.sh /path/to/cedar}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if ! "$cedar" tokenize x > /dev/null 2> "$tmp/err"; then
  grep -q "no tokenizer" "$tmp/err" && { echo "SKIP: this build found no npm tokenizer (make install-deps)"; exit 77; }
  fail "cedar tokenize x: $(cat "$tmp/err")"
fi
tj=$("$cedar" tokenize --help | sed -n 's/.*npm cache this build found, \(.*tokenizer.json\)).*/\1/p')
[ -f "$tj" ] || fail "tokenize --help does not name the tokenizer.json it uses"
command -v node > /dev/null || { echo "SKIP: node is not installed (make install-deps)"; exit 77; }
export NODE_PATH="${tj%%/node_modules/*}/node_modules"
[ -d "$NODE_PATH/@lenml/tokenizers" ] || { echo "SKIP: no @lenml/tokenizers in $NODE_PATH"; exit 77; }

files=(tests/tokenizer/corpus/*)
for f in ../shared/seed/*.txt; do [ -f "$f" ] && files+=("$f"); done
[ ${#files[@]} -ge 7 ] || fail "corpus incomplete: ${files[*]}"
# every line of the corpus joined by growing runs of spaces and newlines
"$py" - "$tmp/joined.txt" tests/tokenizer/corpus/*.txt <<'PY'
import sys
lines = [l for f in sys.argv[2:] for l in open(f, encoding="utf-8").read().split("\n")]
out = "".join(l + " " * (i % 9) + "\n" * (i % 4) for i, l in enumerate(lines))
open(sys.argv[1], "w", encoding="utf-8").write(out)
PY
files+=("$tmp/joined.txt")

node tests/tokenizer/js_encode.cjs "${files[@]}" > "$tmp/js.jsonl" || fail "node js_encode.cjs failed"
i=0
for f in "${files[@]}"; do
  i=$((i + 1))
  "$cedar" tokenize --json --file "$f" > "$tmp/c.json" || fail "cedar tokenize --file $f exited $?"
  sed -n "${i}p" "$tmp/js.jsonl" > "$tmp/j.json"
  "$py" - "$tmp/c.json" "$tmp/j.json" "$f" <<'PY' || fail "ids differ from the JS implementation on $f"
import json, sys
c = json.load(open(sys.argv[1]))["ids"]; j = json.load(open(sys.argv[2]))
if c != j:
    k = next((k for k in range(min(len(c), len(j))) if c[k] != j[k]), min(len(c), len(j)))
    sys.exit(f"{sys.argv[3]}: {len(c)} ids vs JS {len(j)}; first difference at {k}: {c[k:k+5]} vs {j[k:k+5]}")
print(f"ok {sys.argv[3]}: {len(c)} ids equal the JS implementation's")
PY
  # plain form = json form; round trip = the text as UTF-8 with U+FFFD repairs
  "$cedar" tokenize --file "$f" > "$tmp/c.txt"
  "$py" -c "import json,sys; a=json.load(open(sys.argv[1]))['ids']; b=open(sys.argv[2]).read().split(); sys.exit(a!=list(map(int,b)))" \
    "$tmp/c.json" "$tmp/c.txt" || fail "tokenize plain and --json disagree on $f"
  "$cedar" detokenize --file "$tmp/c.json" > "$tmp/back.txt" || fail "detokenize exited $?"
  "$py" -c "import sys; a=open(sys.argv[1],'rb').read().decode('utf-8','replace').encode(); b=open(sys.argv[2],'rb').read(); sys.exit(a!=b)" \
    "$f" "$tmp/back.txt" || fail "detokenize(tokenize($f)) is not the text"
done

# usage errors and a bad id
set +e
"$cedar" tokenize > /dev/null 2>&1
rc=$?
[ $rc -eq 2 ] || fail "tokenize without text must exit 2 (got $rc)"
"$cedar" detokenize 99999999 > /dev/null 2> "$tmp/err"
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "not a token" "$tmp/err" || fail "detokenize of an unknown id must exit 1 and say so"
echo "tokenizer_js: ${#files[@]} files byte-exact against the JS implementation"

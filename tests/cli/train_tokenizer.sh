#!/usr/bin/env bash
# train_tokenizer.sh: cedar's tokenizer reads the byte model's tokenizer files.
#
# train/tokenizer.py writes tokenizer.json (a BPE with no merges over the
# byte-level alphabet, specials 256-262) and tokenizer_config.json; then:
# - every byte of valid UTF-8 text (English, accents, CJK, emoji, control
#   bytes, newlines) is its own id, and `cedar detokenize` gives the bytes back;
# - a lone byte >= 0x80 (not UTF-8) is repaired to U+FFFD first (cedar's
#   documented rule, docs/tokenizer.md), so it encodes as EF BF BD;
# - `<eos>` written in the text is the one id 257; the config names no BOS
#   and no chat template (the model is trained on raw bytes), so the chat
#   form is refused; with them (tokenizer_config(chat=True)) it is BOS, the
#   system text, <|User|>, the message, <|Assistant|>;
# - the files committed in models/v41-byte equal what the generator writes.
# Needs /usr/bin/python3 (standard library only); exit 77 without it.
#
# Run: bash tests/cli/train_tokenizer.sh build/cedar   (ctest: cli_train_tokenizer)
set -u
cedar=${1:?usage: train_tokenizer.sh CEDAR}
py=/usr/bin/python3
[ -x "$py" ] || { echo "skipped: $py not found"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$py" "$here/train/tokenizer.py" "$work" || fail "tokenizer.py did not write the files"
tok="$work/tokenizer.json"
# every byte value that is valid UTF-8 on its own or inside a sequence
printf 'In the beginning God created the heaven and the earth.\n\tcaf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 \x01\x7f~\r\n' > "$work/text.bin"
"$cedar" tokenize --tokenizer "$tok" --file "$work/text.bin" > "$work/ids" || fail "cedar tokenize refused the byte tokenizer"
want=$(od -An -v -tu1 "$work/text.bin" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
got=$(tr -s ' \n' ' ' < "$work/ids" | sed 's/^ //; s/ $//')
[ "$got" = "$want" ] || fail "ids are not the bytes: got '$got', want '$want'"
"$cedar" detokenize --tokenizer "$tok" --file "$work/ids" > "$work/back.bin" || fail "detokenize"
cmp -s "$work/text.bin" "$work/back.bin" || fail "detokenize(tokenize(x)) != x"
printf 'a\xffb' > "$work/bad.bin"
got=$("$cedar" tokenize --tokenizer "$tok" --file "$work/bad.bin" | tr -s ' \n' ' ' | sed 's/ $//')
[ "$got" = "97 239 191 189 98" ] || fail "invalid UTF-8: got '$got', want the U+FFFD repair '97 239 191 189 98'"
got=$("$cedar" tokenize --tokenizer "$tok" "amen<eos>" | tr -s ' \n' ' ' | sed 's/ $//')
[ "$got" = "97 109 101 110 257" ] || fail "<eos> in text: got '$got'"
# no BOS and no chat template (the model's form is raw bytes): the chat form is refused, naming --raw
if "$cedar" tokenize --tokenizer "$tok" --chat Hi > "$work/chat.out" 2>&1; then fail "the chat form was accepted: $(cat "$work/chat.out")"; fi
grep -q "give --raw" "$work/chat.out" || fail "the chat refusal does not name --raw: $(cat "$work/chat.out")"
mkdir -p "$work/chat"
cp "$tok" "$work/chat/"
"$py" -c "import json, sys; sys.path.insert(0, '$here/train'); import tokenizer as T; \
json.dump(T.tokenizer_config(chat=True), open('$work/chat/tokenizer_config.json', 'w'))" || fail "chat config"
got=$("$cedar" tokenize --tokenizer "$work/chat/tokenizer.json" --chat --system "S" Hi | tr -s ' \n' ' ' | sed 's/ $//')
[ "$got" = "256 83 261 72 105 262" ] || fail "chat form: got '$got'"
got=$("$cedar" detokenize --tokenizer "$tok" 257 258)
[ "$got" = "<eos><pad>" ] || fail "specials decode: got '$got'"
for f in tokenizer.json tokenizer_config.json; do
  if [ -f "$here/models/v41-byte/$f" ]; then
    cmp -s "$work/$f" "$here/models/v41-byte/$f" || fail "models/v41-byte/$f differs from train/tokenizer.py's"
  fi
done
echo "train_tokenizer: ok"

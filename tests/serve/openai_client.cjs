// openai_client.cjs: the official `openai` npm client (4.x, from the npm
// cache `make install-deps` fills) against a running `cedar serve`
// (tests/cli/serve_openai.sh). Usage: node openai_client.cjs PORT RUNS.json
// RUNS.json: `cedar run` results ({prompt, chat, max_new, tokens, text, end,
// seed?, temperature?}); every check compares with them. Exits 1 on the
// first failure, printing it.
'use strict';
const { OpenAI } = require('openai');
const fs = require('fs');

const [port, runsPath] = process.argv.slice(2);
const runs = JSON.parse(fs.readFileSync(runsPath, 'utf8'));
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'test-key', maxRetries: 0, timeout: 60000 });

function check(cond, what) {
  if (!cond) {
    console.error('FAIL: ' + what);
    process.exit(1);
  }
}

function params(r, model) {
  const p = { model, max_tokens: r.max_new, temperature: r.temperature ?? 0, seed: r.seed ?? 0 };
  if (r.chat) p.messages = [{ role: 'user', content: r.prompt }];
  else p.prompt = r.prompt;
  return p;
}

async function one(r, model, stream) {
  const p = params(r, model);
  const api = r.chat ? client.chat.completions : client.completions;
  if (!stream) {
    const res = await api.create(p);
    const c = res.choices[0];
    return { text: r.chat ? c.message.content : c.text, finish: c.finish_reason, usage: res.usage };
  }
  const s = await api.create({ ...p, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += (r.chat ? c.delta.content : c.text) ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage };
}

async function main() {
  const models = await client.models.list();
  const model = models.data[0].id;
  check(model, 'models.list gives a model id');
  let n = 0;
  for (const r of runs) {
    if (r.end === 'error') continue; // an id the tokenizer has no token for: not a reply to compare
    for (const stream of [false, true]) {
      const got = await one(r, model, stream);
      const what = `${r.chat ? 'chat' : 'completion'} ${JSON.stringify(r.prompt)}${stream ? ' streamed' : ''}`;
      check(got.text === r.text, `${what}: text ${JSON.stringify(got.text)}, cedar run's ${JSON.stringify(r.text)}`);
      check(got.finish === (r.end === 'max-new' ? 'length' : 'stop'), `${what}: finish_reason ${got.finish} for ${r.end}`);
      check(got.usage && got.usage.completion_tokens === r.tokens.length,
            `${what}: usage ${JSON.stringify(got.usage)}, ${r.tokens.length} tokens generated`);
      n++;
    }
  }
  // stop: the first run's text cut before a piece of it
  const r = runs.find((x) => !x.chat && x.end === 'max-new' && x.text.length > 4);
  const stop = r.text.slice(2, 4);
  for (const stream of [false, true]) {
    const p = { ...params(r, model), stop: [stop] };
    let text = '', finish = null;
    if (stream) {
      for await (const c of await client.completions.create({ ...p, stream: true }))
        for (const ch of c.choices) { text += ch.text; finish = ch.finish_reason || finish; }
    } else {
      const res = await client.completions.create(p);
      text = res.choices[0].text;
      finish = res.choices[0].finish_reason;
    }
    check(finish === 'stop' && r.text.startsWith(text + stop), `stop ${JSON.stringify(stop)}: ${JSON.stringify(text)} ${finish}`);
    n++;
  }
  // a refused parameter comes back as the client's BadRequestError naming it
  try {
    await client.completions.create({ model, prompt: 'x', logprobs: 2 });
    check(false, 'logprobs was not refused');
  } catch (e) {
    check(e.status === 400 && /logprobs/.test(e.message), `logprobs refusal: ${e.status} ${e.message}`);
  }
  console.log(`openai client: ${n} replies equal cedar run's (whole and streamed, completions and chat, seed, ` +
              `max_tokens, stop); refusal read as BadRequestError`);
}

main().catch((e) => {
  console.error('FAIL: ' + (e.stack || e));
  process.exit(1);
});

// End-to-end test of `dsv4 serve` on the demo model (models/dsv4-demo), driven by the official OpenAI Node SDK and by
// raw HTTP requests (what curl sends). Run: cd tests/e2e && npm ci && node --test
// The binary is build/dsv4 (override with DSV4_BIN=path). Fails loudly if the demo model or the binary is missing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const bin = process.env.DSV4_BIN ? path.resolve(process.env.DSV4_BIN) : path.join(root, 'build', 'dsv4');
const modelDir = path.join(root, 'models', 'dsv4-demo');
const CTX = 2048;
const QUEUE = 4;

let server;
let serverLog = '';
let base;
let client;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function health() {
  const r = await fetch(`${base}/health`);
  return { status: r.status, body: await r.json() };
}

async function waitIdle(ms = 10000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    const h = await health();
    if (h.status === 200 && !h.body.busy && h.body.waiting === 0) return;
    await sleep(50);
  }
  assert.fail('server did not become idle');
}

async function postRaw(route, body, contentType = 'application/json') {
  const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'content-type': contentType }, body });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, text, json };
}

function assertErrorShape(json, param) {
  assert.ok(json && json.error, `error object expected, got ${JSON.stringify(json)}`);
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in json.error, `error.${k} missing`);
  assert.equal(typeof json.error.message, 'string');
  if (param !== undefined) assert.equal(json.error.param, param);
}

const user = (content) => [{ role: 'user', content }];
const noThink = { thinking: { type: 'disabled' } };

before(async () => {
  assert.ok(existsSync(path.join(modelDir, 'config.json')), `demo model missing: ${modelDir} (task F builds it)`);
  assert.ok(existsSync(bin), `dsv4 binary missing: ${bin} (build it, or set DSV4_BIN)`);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(bin, ['serve', '-m', modelDir, '--port', String(port), '--ctx', String(CTX), '--queue', String(QUEUE),
    '--threads', '2', '--keepalive', '0.5'], { stdio: ['ignore', 'ignore', 'pipe'] });
  server.stderr.on('data', (d) => { serverLog += d; });
  const t0 = Date.now();
  for (;;) {
    if (server.exitCode !== null) assert.fail(`dsv4 serve exited (${server.exitCode}): ${serverLog}`);
    try {
      if ((await health()).status === 200) break;
    } catch {}
    if (Date.now() - t0 > 60000) assert.fail(`dsv4 serve did not come up: ${serverLog}`);
    await sleep(100);
  }
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (!server || server.exitCode !== null) return;
  const exited = new Promise((r) => server.once('exit', (code, signal) => r({ code, signal })));
  server.kill('SIGTERM');
  let timer;
  const timeout = new Promise((r) => { timer = setTimeout(() => r('timeout'), 10000); });
  const res = await Promise.race([exited, timeout]);
  clearTimeout(timer);  // a pending timer would keep this test process alive for 10 s
  if (res === 'timeout') server.kill('SIGKILL');
  assert.notEqual(res, 'timeout', 'dsv4 serve did not stop on SIGTERM');
  assert.equal(res.code, 0, `dsv4 serve exit: ${JSON.stringify(res)}\n${serverLog}`);
});

test('models list reports the folder name', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'dsv4-demo');
});

test('non-streaming chat completion with usage', async () => {
  const long = 'Tell me about the Congress. '.repeat(60);
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user(long), max_tokens: 8, temperature: 0, ...noThink,
  });
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0);
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.prompt_cache_hit_tokens + r.usage.prompt_cache_miss_tokens, r.usage.prompt_tokens);
  // Same request again: greedy output is identical and the prompt's whole 128-token blocks (before its last token)
  // come from the prefix cache.
  const again = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user(long), max_tokens: 8, temperature: 0, ...noThink,
  });
  assert.equal(again.choices[0].message.content, c.message.content);
  assert.ok(r.usage.prompt_tokens > 256);
  assert.equal(again.usage.prompt_tokens_details.cached_tokens, Math.floor((r.usage.prompt_tokens - 1) / 128) * 128);
});

test('thinking mode returns reasoning_content', async () => {
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Why?'), max_tokens: 6, temperature: 0, thinking: { type: 'enabled' },
  });
  assert.equal(typeof r.choices[0].message.reasoning_content, 'string');
});

test('streaming chat: SDK accumulator and raw chunks with usage', async () => {
  const stream = client.chat.completions.stream({
    model: 'dsv4-demo', messages: user('Write about the United States.'), max_tokens: 10, temperature: 0, ...noThink,
  });
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].message.role, 'assistant');
  assert.ok(final.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(final.choices[0].finish_reason));

  const chunks = [];
  const s2 = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Write about the United States.'), max_tokens: 10, temperature: 0, ...noThink,
    stream: true, stream_options: { include_usage: true },
  });
  for await (const ch of s2) chunks.push(ch);
  assert.ok(chunks.length >= 3);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, final.usage?.completion_tokens ?? last.usage.completion_tokens);
  const text = chunks.flatMap((c) => c.choices).map((c) => c.delta.content ?? '').join('');
  assert.equal(text, final.choices[0].message.content);
  const finishes = chunks.flatMap((c) => c.choices).filter((c) => c.finish_reason);
  assert.equal(finishes.length, 1);
  for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
});

test('text completion, seeded sampling reproducible', async () => {
  const r = await client.completions.create({ model: 'dsv4-demo', prompt: 'The president', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  const ask = (seed) => client.completions.create({
    model: 'dsv4-demo', prompt: 'The president', max_tokens: 8, temperature: 1.0, seed,
  }).then((x) => x.choices[0].text);
  assert.equal(await ask(7), await ask(7));
});

test('tool-call round trip through the prompt is accepted', async () => {
  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', tools, max_tokens: 6, temperature: 0, ...noThink,
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"sky": "clear", "temperature": 21}' },
    ],
  });
  assert.equal(r.choices[0].message.role, 'assistant');
  // The tool block makes the prompt much longer than the bare question.
  assert.ok(r.usage.prompt_tokens > 100, `prompt_tokens ${r.usage.prompt_tokens}`);
});

test('stop strings cut the output before the stop text', async () => {
  const full = (await client.completions.create({ model: 'dsv4-demo', prompt: 'The president', max_tokens: 12, temperature: 0 })).choices[0].text;
  const words = full.trim().split(/\s+/);
  assert.ok(words.length >= 3, full);
  const stop = ' ' + words[2];
  const cut = full.indexOf(stop);
  const r = await client.completions.create({ model: 'dsv4-demo', prompt: 'The president', max_tokens: 12, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('max_tokens bounds the output', async () => {
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Talk.'), max_completion_tokens: 3, temperature: 0, ...noThink,
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
});

test('an aborted stream frees the server', async () => {
  await waitIdle();
  const ac = new AbortController();
  const s = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Write a very long essay.'), max_tokens: 1500, temperature: 1, ...noThink,
    stream: true,
  }, { signal: ac.signal });
  let n = 0;
  const t0 = Date.now();
  try {
    for await (const _ of s) if (++n === 3) ac.abort();  // the SDK ends the iteration quietly on abort
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  assert.equal(n, 3);
  // 1500 tokens would keep the server busy for many seconds: it is idle at once because the request was cancelled.
  await waitIdle(5000);
  assert.ok(Date.now() - t0 < 5000);
  const r = await client.chat.completions.create({ model: 'dsv4-demo', messages: user('Hi'), max_tokens: 2, ...noThink });
  assert.equal(r.choices.length, 1);
});

test('20 concurrent requests: all answered or cleanly refused with 503', async () => {
  await waitIdle();
  const reqs = Array.from({ length: 20 }, (_, i) => client.chat.completions.create({
    model: 'dsv4-demo', messages: user(`Request ${i}`), max_tokens: 4, temperature: 0, ...noThink,
  }));
  const res = await Promise.allSettled(reqs);
  let ok = 0;
  for (const r of res) {
    if (r.status === 'fulfilled') {
      ok++;
      assert.equal(r.value.choices.length, 1);
    } else {
      assert.equal(r.reason?.status, 503, String(r.reason));
      assert.equal(r.reason.error?.code ?? r.reason.code, 'queue_full');
    }
  }
  assert.ok(ok >= 1 + QUEUE, `only ${ok} answered`);
  await waitIdle();
});

test('HTTP-level errors: OpenAI error objects with the right status, server keeps serving', async () => {
  const cases = [
    ['/v1/chat/completions', '{"messages": [', 400, null],
    ['/v1/chat/completions', '{"model": "x"}', 400, 'messages'],
    ['/v1/chat/completions', '{"messages": []}', 400, 'messages'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', 400, 'temperature'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}', 400, 'max_tokens'],
    ['/v1/chat/completions', `{"messages": [{"role": "user", "content": "x"}], "max_tokens": ${CTX}}`, 400, 'max_tokens'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}], "n": 17}', 400, 'n'],
    ['/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 99}', 400, 'top_logprobs'],
    ['/v1/completions', '{"prompt": 5}', 400, 'prompt'],
    ['/v1/completions', `{"prompt": "${'word '.repeat(CTX + 10)}"}`, 400, 'prompt'],
  ];
  for (const [route, body, status, param] of cases) {
    const r = await postRaw(route, body);
    assert.equal(r.status, status, `${body.slice(0, 80)} -> ${r.text}`);
    assertErrorShape(r.json, param);
  }
  const ctx = await postRaw('/v1/chat/completions', `{"messages": [{"role": "user", "content": "x"}], "max_tokens": ${CTX}}`);
  assert.equal(ctx.json.error.code, 'context_length_exceeded');
  const nf = await fetch(`${base}/v1/nope`);
  assert.equal(nf.status, 404);
  assertErrorShape(await nf.json());
  await assert.rejects(
    client.chat.completions.create({ model: 'dsv4-demo', messages: user('x'), n: 0 }),
    (e) => e.status === 400 && e instanceof OpenAI.BadRequestError,
  );
  // Unknown fields are ignored.
  const ok = await postRaw('/v1/chat/completions', JSON.stringify({
    messages: user('x'), max_tokens: 2, frobnicate: { a: 1 }, user: 'u', ...noThink,
  }));
  assert.equal(ok.status, 200, ok.text);
  assert.equal((await health()).status, 200);
});

test('n > 1 through the SDK: one choice per index, greedy choices equal; /metrics counts them', async () => {
  await waitIdle();
  const before = await (await fetch(`${base}/metrics`)).text();
  const count = (text, name) => Number(text.split('\n').find((l) => l.startsWith(`${name} `)).split(' ')[1]);
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Name a colour.'), max_tokens: 5, temperature: 0, n: 3, ...noThink,
  });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.choices[1].message.content, r.choices[0].message.content);
  assert.equal(r.choices[2].message.content, r.choices[0].message.content);
  const completion = r.usage.completion_tokens;
  assert.ok(completion > 0 && completion % 3 === 0, `completion tokens ${completion}`);  // three equal choices
  await waitIdle();
  const after = await (await fetch(`${base}/metrics`)).text();
  for (const line of after.split('\n')) {
    if (line === '' || line.startsWith('# ')) continue;
    assert.match(line, /^dsv4_[a-z_]+(\{le="[^"]+"\})? -?[0-9.]+(e[-+]?[0-9]+)?$/, line);
  }
  assert.equal(count(after, 'dsv4_requests_finished_total') - count(before, 'dsv4_requests_finished_total'), 3);
  assert.equal(count(after, 'dsv4_generated_tokens_total') - count(before, 'dsv4_generated_tokens_total'), completion);
});

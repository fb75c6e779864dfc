// End-to-end tests of access and lifecycle: --api-key-file (every route but /health answers 401 without the key,
// with both official SDKs), /admin/park -> 503 model_parked -> /admin/unpark -> the same greedy output, and
// --auto-unpark (a request to a parked model loads it again).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, request, user, noThink } from './helpers.mjs';

const KEY = 'sk-dsv4-e2e-0123456789';
let srv;
let auto;
before(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dsv4-key-'));
  const file = path.join(dir, 'key');
  writeFileSync(file, `${KEY}\n`);
  srv = await startServer(['--api-key-file', file]);
  auto = await startServer(['--auto-unpark']);
});
after(async () => {
  if (srv) await srv.stop();
  if (auto) await auto.stop();
});

const routes = [
  ['GET', '/v1/models'], ['POST', '/v1/chat/completions'], ['POST', '/v1/completions'], ['POST', '/v1/messages'],
  ['POST', '/v1/messages/count_tokens'], ['POST', '/admin/park'], ['POST', '/admin/unpark'], ['GET', '/v1/unknown'],
];

test('401 on every route without the right key; /health stays open', async () => {
  for (const [method, route] of routes) {
    for (const headers of [{}, { authorization: 'Bearer wrong' }, { 'x-api-key': KEY.slice(0, -1) }, { authorization: KEY }]) {
      const r = await request(srv.base, route, { method, headers, body: method === 'POST' ? { prompt: 'x', max_tokens: 1 } : undefined });
      assert.equal(r.status, 401, `${method} ${route} ${JSON.stringify(headers)} -> ${r.status} ${r.text}`);
      if (route.startsWith('/v1/messages')) assert.equal(r.json.error.type, 'authentication_error');
      else assert.equal(r.json.error.code, 'invalid_api_key');
    }
  }
  assert.equal((await request(srv.base, '/health', { method: 'GET' })).status, 200);
});

test('the SDKs: wrong key -> AuthenticationError, right key works (Bearer and x-api-key)', async () => {
  const bad = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const badA = new Anthropic({ baseURL: srv.base, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(badA.messages.create({ model: 'm', max_tokens: 2, messages: user('x') }), (e) => e instanceof Anthropic.AuthenticationError);
  const ok = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: KEY, maxRetries: 0 });
  const r = await ok.chat.completions.create({ model: 'dsv4-demo', messages: user('Hi'), max_tokens: 3, ...noThink });
  assert.equal(r.choices.length, 1);
  const okA = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0 });
  const m = await okA.messages.create({ model: 'm', max_tokens: 3, messages: user('Hi') });
  assert.equal(m.type, 'message');
});

test('park -> 503 model_parked with Retry-After -> unpark -> the same greedy output', async () => {
  const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: KEY, maxRetries: 0 });
  const auth = { authorization: `Bearer ${KEY}` };
  const ask = () => client.chat.completions.create({ model: 'dsv4-demo', messages: user('The state of the Union'), max_tokens: 24, temperature: 0, ...noThink });
  const before = (await ask()).choices[0].message.content;
  const park = await request(srv.base, '/admin/park', { headers: auth });
  assert.equal(park.status, 200, park.text);
  assert.equal((await srv.health()).body.model_state, 'parked');
  await assert.rejects(ask(), (e) => e.status === 503 && e.code === 'model_parked' && Number(e.headers.get('retry-after')) > 0);
  const a = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0 });
  await assert.rejects(a.messages.create({ model: 'm', max_tokens: 2, messages: user('x') }), (e) => e.status === 503);
  const stream = await request(srv.base, '/v1/chat/completions', { headers: auth, body: { messages: user('x'), stream: true } });
  assert.equal(stream.status, 503);
  const unpark = await request(srv.base, '/admin/unpark', { headers: auth });
  assert.equal(unpark.status, 200, unpark.text);
  assert.equal((await srv.health()).body.model_state, 'loaded');
  assert.equal((await ask()).choices[0].message.content, before);
});

test('--auto-unpark: a request to the parked model loads it and answers the same', async () => {
  const client = new OpenAI({ baseURL: `${auto.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const ask = () => client.completions.create({ model: 'dsv4-demo', prompt: 'The Congress', max_tokens: 16, temperature: 0 });
  const before = (await ask()).choices[0].text;
  assert.equal((await request(auto.base, '/admin/park')).status, 200);
  assert.equal((await auto.health()).body.model_state, 'parked');
  assert.equal((await ask()).choices[0].text, before);
  assert.equal((await auto.health()).body.model_state, 'loaded');
});

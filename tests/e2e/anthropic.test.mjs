// End-to-end tests of the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) on the demo model with
// the official `@anthropic-ai/sdk` Node client: text, system prompts, stop sequences, thinking blocks with
// budget_tokens, tool_use / tool_result round trips (forced with tool_choice), streaming through the SDK's event
// accumulator and as raw events, and errors in Anthropic's shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, request } from './helpers.mjs';

let srv;
let client;
before(async () => {
  srv = await startServer();
  client = new Anthropic({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => srv && srv.stop());

const msgs = (text) => [{ role: 'user', content: text }];
const weather = {
  name: 'get_weather', description: 'Weather of a city',
  input_schema: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] }, days: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['city'] },
};

test('messages.create: text block, usage, end_turn / max_tokens; count_tokens matches', async () => {
  const m = await client.messages.create({ model: 'dsv4-demo', max_tokens: 12, temperature: 0, system: 'Be brief.', messages: msgs('The Congress') });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.ok(m.id.startsWith('msg_'));
  assert.equal(m.content[0].type, 'text');
  assert.ok(m.content[0].text.length > 0);
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
  const count = await client.messages.countTokens({ model: 'dsv4-demo', system: 'Be brief.', messages: msgs('The Congress') });
  assert.equal(count.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test('stop_sequences end the text and are reported', async () => {
  const full = await client.messages.create({ model: 'dsv4-demo', max_tokens: 16, temperature: 0, messages: msgs('The president') });
  const words = full.content[0].text.trim().split(/\s+/);
  assert.ok(words.length >= 3, full.content[0].text);
  const stop = ' ' + words[2];
  const m = await client.messages.create({ model: 'dsv4-demo', max_tokens: 16, temperature: 0, stop_sequences: [stop], messages: msgs('The president') });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, full.content[0].text.slice(0, full.content[0].text.indexOf(stop)));
});

test('thinking with budget_tokens: a thinking block within the budget, then text; streamed via the SDK', async () => {
  const params = { model: 'dsv4-demo', max_tokens: 40, temperature: 0, thinking: { type: 'enabled', budget_tokens: 6 }, messages: msgs('Why?') };
  const m = await client.messages.create(params);
  assert.equal(m.content[0].type, 'thinking');
  assert.equal(typeof m.content[0].signature, 'string');
  assert.ok(m.content[0].thinking.length > 0);
  assert.ok(m.content.some((b) => b.type === 'text'));
  const stream = client.messages.stream(params);
  const events = [];
  stream.on('streamEvent', (e) => events.push(e.type));
  const final = await stream.finalMessage();
  assert.deepEqual(final.content.map((b) => b.type), m.content.map((b) => b.type));
  assert.equal(final.content[0].thinking, m.content[0].thinking);
  assert.equal(final.stop_reason, m.stop_reason);
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.equal(events.at(-2), 'message_delta');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_stop'));
});

test('raw event sequence: event lines match data types, blocks open and close in order', async () => {
  const r = await fetch(`${srv.base}/v1/messages`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'x', max_tokens: 20, stream: true, thinking: { type: 'enabled', budget_tokens: 4 }, messages: msgs('Hi') }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const text = await r.text();
  const events = text.split('\n\n').filter((e) => e.startsWith('event: ')).map((e) => {
    const [ev, data] = e.split('\n');
    return { event: ev.slice(7), data: JSON.parse(data.slice(6)) };
  });
  for (const e of events) assert.equal(e.event, e.data.type);
  let open = -1;
  for (const { event, data } of events) {
    if (event === 'content_block_start') { assert.equal(open, -1); open = data.index; }
    if (event === 'content_block_delta') assert.equal(data.index, open);
    if (event === 'content_block_stop') { assert.equal(data.index, open); open = -1; }
  }
  assert.equal(events[0].event, 'message_start');
  assert.deepEqual(events[0].data.message.content, []);
  assert.equal(events.at(-1).event, 'message_stop');
  assert.ok(events.at(-2).data.usage.output_tokens > 0);
});

test('tool_choice any: a tool_use block with valid input; the result goes back as tool_result', async () => {
  const validate = new Ajv({ strict: false }).compile(weather.input_schema);
  const params = {
    model: 'dsv4-demo', max_tokens: 800, temperature: 0, tools: [weather],
    tool_choice: { type: 'any', disable_parallel_tool_use: true }, messages: msgs('Weather in Paris?'),
  };
  const m = await client.messages.create(params);
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, 'get_weather');
  assert.match(use.id, /^toolu_[A-Za-z0-9]+$/);  // Anthropic's id form (the OpenAI routes' ids start call_)
  assert.ok(validate(use.input), JSON.stringify(use.input));
  const streamed = await client.messages.stream(params).finalMessage();
  const streamedUse = streamed.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(streamedUse.input, use.input);
  assert.match(streamedUse.id, /^toolu_[A-Za-z0-9]+$/);
  // Round trip.
  const follow = await client.messages.create({
    model: 'dsv4-demo', max_tokens: 10, temperature: 0, tools: [weather],
    messages: [...msgs('Weather in Paris?'), { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 22 C' }] }],
  });
  assert.equal(follow.content[0].type, 'text');
  // tool_choice tool: that tool.
  const named = await client.messages.create({ ...params, tool_choice: { type: 'tool', name: 'get_weather' } });
  assert.equal(named.content.find((b) => b.type === 'tool_use').name, 'get_weather');
});

test('errors come back in Anthropic shape and as SDK errors', async () => {
  await assert.rejects(
    client.messages.create({ model: 'dsv4-demo', max_tokens: 5, thinking: { type: 'enabled', budget_tokens: 0 }, messages: msgs('x') }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error',
  );
  for (const body of [
    { messages: msgs('x') },
    { max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] },
    { max_tokens: 5, tools: [{ name: 'f', input_schema: { type: 'object', properties: { a: { type: 'string', pattern: 'x' } } } }], tool_choice: { type: 'tool', name: 'g' }, messages: msgs('x') },
    { max_tokens: 5, thinking: { type: 'enabled', budget_tokens: 10, extra: true }, messages: msgs('x') },
  ]) {
    const r = await request(srv.base, '/v1/messages', { body });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
  const nf = await request(srv.base, '/v1/messages/nothing', { body: {} });
  assert.equal(nf.status, 404);
  assert.equal(nf.json.error.type, 'not_found_error');
});

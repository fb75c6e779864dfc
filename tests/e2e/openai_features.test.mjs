// End-to-end tests of issue 12's OpenAI-side features on the demo model with the official `openai` SDK:
// log-probabilities, json_object / json_schema output validated with ajv, tool_choice required / named /
// parallel_tool_calls with streamed tool calls, reasoning budgets, and the 400s of bad input.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { startServer, request, user, noThink } from './helpers.mjs';

let srv;
let client;
const ajv = new Ajv({ strict: false, allErrors: true });

before(async () => {
  srv = await startServer(['--reasoning-budget', '12']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => srv && srv.stop());

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather', description: 'Weather of a city',
      parameters: {
        type: 'object',
        properties: { city: { enum: ['Paris', 'Rome', 'Washington'] }, days: { type: 'integer', minimum: 1, maximum: 9 } },
        required: ['city'], additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_flag',
      parameters: { type: 'object', properties: { on: { type: 'boolean' } }, required: ['on'], additionalProperties: false },
    },
  },
];

test('chat logprobs: non-streamed and streamed agree, top_logprobs sorted, bytes match', async () => {
  const args = { model: 'dsv4-demo', messages: user('The Congress'), max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3, ...noThink };
  const r = await client.chat.completions.create(args);
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob);
    assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.top_logprobs[0].token, e.token);
  }
  assert.equal(lp.map((e) => e.token).join(''), r.choices[0].message.content);

  const final = await client.chat.completions.stream(args).finalChatCompletion();
  assert.deepEqual(final.choices[0].logprobs.content.map((e) => [e.token, e.logprob]), lp.map((e) => [e.token, e.logprob]));
});

test('completion logprobs (legacy shape), streamed too', async () => {
  const r = await client.completions.create({ model: 'dsv4-demo', prompt: 'The president', max_tokens: 5, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  assert.equal(lp.token_logprobs.length, 5);
  assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  assert.deepEqual(lp.text_offset.slice(0, 2), [0, lp.tokens[0].length]);
  const s = await client.completions.create({ model: 'dsv4-demo', prompt: 'The president', max_tokens: 5, temperature: 0, logprobs: 0, stream: true });
  const toks = [];
  for await (const ch of s) if (ch.choices[0]?.logprobs) toks.push(...ch.choices[0].logprobs.tokens);
  assert.deepEqual(toks, lp.tokens);
});

test('response_format json_object: a JSON object, whole and streamed, closed in time when max_tokens runs out', async () => {
  // The demo model never ends a JSON string by itself: the server closes the answer within max_tokens (finish_reason
  // "length", the JSON still parses).
  const args = { model: 'dsv4-demo', messages: user('Describe the Union as JSON.'), max_tokens: 60, temperature: 0, response_format: { type: 'json_object' }, ...noThink };
  const r = await client.chat.completions.create(args);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.completion_tokens <= 60);
  const obj = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof obj, 'object');
  assert.ok(obj !== null && !Array.isArray(obj));
  const final = await client.chat.completions.stream(args).finalChatCompletion();
  assert.equal(final.choices[0].message.content, r.choices[0].message.content);
});

test('response_format json_schema with thinking on: reasoning first, then valid JSON', async () => {
  const schema = {
    type: 'object',
    properties: {
      president: { type: 'string', maxLength: 12 },
      year: { type: 'integer', minimum: 1790, maximum: 2030 },
      topics: { type: 'array', items: { enum: ['economy', 'war', 'peace', 'trade'] }, maxItems: 3 },
      strong: { type: 'boolean' },
    },
    required: ['president', 'year', 'strong'], additionalProperties: false,
  };
  const validate = ajv.compile(schema);
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Summarise the address.'), max_tokens: 400, temperature: 0,
    thinking: { type: 'enabled', budget_tokens: 10 },
    response_format: { type: 'json_schema', json_schema: { name: 'summary', schema, strict: true } },
  });
  const m = r.choices[0].message;
  assert.equal(typeof m.reasoning_content, 'string');
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens <= 10);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), m.content);  // valid either way
  const doc = JSON.parse(m.content);
  assert.ok(validate(doc), JSON.stringify(validate.errors));
  // Streamed: the content deltas concatenate to valid JSON too (constraint after </think>, not on the reasoning).
  const chunks = [];
  const s = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('Summarise the address.'), max_tokens: 400, temperature: 0.9, seed: 5, stream: true,
    thinking: { type: 'enabled', budget_tokens: 10 },
    response_format: { type: 'json_schema', json_schema: { name: 'summary', schema } },
  });
  for await (const ch of s) chunks.push(ch);
  const content = chunks.flatMap((c) => c.choices).map((c) => c.delta.content ?? '').join('');
  assert.ok(validate(JSON.parse(content)), content);
});

test('tool_choice required: a valid call, content null, arguments validate', async () => {
  const r = await client.chat.completions.create({
    model: 'dsv4-demo', messages: user('What is the weather in Paris?'), tools, tool_choice: 'required',
    max_tokens: 800, temperature: 0, ...noThink,
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.ok(c.message.tool_calls.length >= 1);
  for (const call of c.message.tool_calls) {
    const def = tools.find((t) => t.function.name === call.function.name);
    assert.ok(def, call.function.name);
    const validate = ajv.compile(def.function.parameters);
    assert.ok(validate(JSON.parse(call.function.arguments)), call.function.arguments);
  }
});

test('named tool, parallel_tool_calls false, streamed: one call of that tool, no DSML bytes in content', async () => {
  for (const seed of [1, 2, 3]) {
    const args = {
      model: 'dsv4-demo', messages: user('Weather?'), tools, parallel_tool_calls: false, max_tokens: 800,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 1, seed, ...noThink,
    };
    const chunks = [];
    const s = await client.chat.completions.create({ ...args, stream: true });
    for await (const ch of s) chunks.push(ch);
    for (const ch of chunks)
      for (const c of ch.choices) {
        const piece = c.delta.content ?? '';
        assert.ok(!piece.includes('DSML') && !piece.includes('｜'), `markup in content: ${JSON.stringify(piece)}`);
      }
    const deltas = chunks.flatMap((c) => c.choices).flatMap((c) => c.delta.tool_calls ?? []);
    assert.equal(deltas.length, 1);
    assert.equal(deltas[0].function.name, 'get_weather');
    const args0 = JSON.parse(deltas[0].function.arguments);
    assert.ok(ajv.compile(tools[0].function.parameters)(args0), deltas[0].function.arguments);
    // The SDK accumulator sees the same call.
    const final = await client.chat.completions.stream(args).finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(final.choices[0].message.tool_calls.length, 1);
    assert.equal(final.choices[0].message.tool_calls[0].function.name, 'get_weather');
  }
});

test('reasoning budget: request budget and the server default (--reasoning-budget 12) close the reasoning', async () => {
  for (const [thinking, cap] of [[{ type: 'enabled', budget_tokens: 7 }, 7], [{ type: 'enabled' }, 12]]) {
    const r = await client.chat.completions.create({
      model: 'dsv4-demo', messages: user('Why is the sky blue?'), max_tokens: 40, temperature: 0, thinking,
    });
    const u = r.usage.completion_tokens_details.reasoning_tokens;
    assert.ok(u <= cap && u > 0, `reasoning_tokens ${u} > ${cap}`);
    assert.ok(r.choices[0].message.reasoning_content.length > 0);
    assert.ok(r.usage.completion_tokens > u, 'the answer follows the closed reasoning');
    // Streamed (the SDK's accumulator keeps only the last reasoning_content delta: join the raw deltas).
    const s = await client.chat.completions.create({
      model: 'dsv4-demo', messages: user('Why is the sky blue?'), max_tokens: 40, temperature: 0, thinking, stream: true,
      stream_options: { include_usage: true },
    });
    let reasoning = '';
    let usage;
    for await (const ch of s) {
      for (const c of ch.choices) reasoning += c.delta.reasoning_content ?? '';
      if (ch.usage) usage = ch.usage;
    }
    assert.equal(reasoning, r.choices[0].message.reasoning_content);
    assert.equal(usage.completion_tokens_details.reasoning_tokens, u);
  }
});

test('400s name the field: bad schemas, tools, budgets, unknown fields; the server keeps serving', async () => {
  const m = user('x');
  const cases = [
    [{ messages: m, response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'string', pattern: 'a+' } } } }, 'response_format.json_schema.schema.pattern'],
    [{ messages: m, response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', properties: { a: { type: 'integer', multipleOf: 3 } } } } } }, 'response_format.json_schema.schema.properties.a.multipleOf'],
    [{ messages: m, response_format: { type: 'json_schema', json_schema: { name: 'n', schema: {}, extra: 1 } } }, 'response_format.json_schema.extra'],
    [{ messages: m, response_format: { type: 'yaml' } }, 'response_format.type'],
    [{ messages: m, thinking: { type: 'enabled', budget_tokens: 0 } }, 'thinking.budget_tokens'],
    [{ messages: m, thinking: { type: 'enabled', budget_tokens: -1 } }, 'thinking.budget_tokens'],
    [{ messages: m, thinking: { type: 'enabled', mode: 'deep' } }, 'thinking.mode'],
    [{ messages: m, tools: [{ type: 'function', function: { name: 'bad name!' } }] }, 'tools[0].function.name'],
    [{ messages: m, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'array' } } }] }, 'tools[0].function.parameters.type'],
    [{ messages: m, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
    [{ messages: m, tool_choice: 'required' }, 'tool_choice'],
    [{ messages: [...m, { role: 'tool', content: 'x' }] }, 'messages[1].tool_call_id'],
    [{ messages: [...m, { role: 'assistant', content: '', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: { a: 1 } } }] }] }, 'messages[1].tool_calls[0].function.arguments'],
    [{ messages: m, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    [{ messages: m, top_logprobs: 2 }, 'top_logprobs'],
    [{ messages: m, reasoning_effort: 'ludicrous' }, 'reasoning_effort'],
  ];
  for (const [body, param] of cases) {
    const r = await request(srv.base, '/v1/chat/completions', { body });
    assert.equal(r.status, 400, `${JSON.stringify(body)} -> ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
  await assert.rejects(
    client.chat.completions.create({ model: 'dsv4-demo', messages: m, response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'string', format: 'email' } } } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.json_schema.schema.format',
  );
  const ok = await client.chat.completions.create({ model: 'dsv4-demo', messages: user('Hi'), max_tokens: 2, ...noThink });
  assert.equal(ok.choices.length, 1);
  assert.equal((await srv.health()).status, 200);
});

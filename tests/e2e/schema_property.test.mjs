// Property test of structured output: 50 JSON Schemas generated from a seed (objects, arrays, strings with escapes
// and length bounds, integers and numbers with ranges, enums, const, required / optional properties, nesting,
// additionalProperties false, anyOf, type unions, definitions + $ref), each answered by the demo model with three
// sampling seeds through the official `openai` SDK; every answer must parse and validate with ajv. The demo model knows
// nothing about JSON: whatever it prefers, constrained decoding must keep it inside the schema, and close it in time
// when max_tokens runs out (finish_reason "length", still valid).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { startServer, user, noThink } from './helpers.mjs';

const N_SCHEMAS = 50;
const SEEDS = [11, 22, 33];
const MAX_TOKENS = 160;

let srv;
let client;
before(async () => {
  srv = await startServer([], { ctx: 4096 });
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});
after(async () => srv && srv.stop());

// Deterministic generator (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const KEYS = ['name', 'id', 'year', 'title', 'tags', 'note', 'weird "key"', 'ünïcode', 'a\\b', 'value', 'kind', 'x'];

function genSchema(r, depth) {
  const pick = (n) => Math.floor(r() * n);
  const kinds = depth <= 0 ? 8 : 13;
  switch (pick(kinds)) {
    case 0: return { type: 'string', maxLength: 1 + pick(10), ...(pick(3) === 0 ? { minLength: 1 } : {}) };
    case 1: return { type: 'integer', ...(pick(2) ? { minimum: pick(100) - 50 } : {}), ...(pick(2) ? { maximum: 60 + pick(1000) } : {}) };
    case 2: return pick(2) ? { type: 'number' } : { type: 'number', minimum: 0, maximum: 10 + pick(90) };
    case 3: return { type: 'boolean' };
    case 4: return { enum: ['red', 'green', 'blue', 7, null, 'with "quote"', 'tab\there'].slice(0, 2 + pick(5)) };
    case 5: return { const: pick(2) ? 'fixed' : { v: 1 } };
    case 6: return { type: ['string', 'null'], maxLength: 4 };
    case 7: return { type: 'null' };
    case 8: case 9: case 10: {
      const n = 1 + pick(4);
      const properties = {};
      const required = [];
      const keys = [...KEYS].sort(() => r() - 0.5).slice(0, n);
      for (const k of keys) {
        properties[k] = genSchema(r, depth - 1);
        if (pick(2)) required.push(k);
      }
      return { type: 'object', properties, required, ...(pick(3) ? { additionalProperties: false } : {}) };
    }
    case 11: {
      const minItems = pick(2);
      return { type: 'array', items: genSchema(r, depth - 1), minItems, maxItems: minItems + 1 + pick(3) };
    }
    default:
      return { anyOf: [genSchema(r, depth - 1), genSchema(r, depth - 1)] };
  }
}

function schemas() {
  const r = rng(12345);
  const out = [];
  // A few fixed shapes first: a recursive tree via definitions/$ref, an empty object, a map.
  out.push({
    definitions: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 }, kids: { type: 'array', items: { $ref: '#/definitions/node' }, maxItems: 2 } }, required: ['v'], additionalProperties: false } },
    $ref: '#/definitions/node',
  });
  out.push({ type: 'object', properties: {}, additionalProperties: false });
  out.push({ type: 'object', additionalProperties: { type: 'integer', minimum: 0, maximum: 5 } });
  while (out.length < N_SCHEMAS) {
    const s = genSchema(r, 3);
    // The root is usually an object (as response formats are), sometimes anything.
    out.push(out.length % 5 === 0 ? s : { type: 'object', properties: { result: s, ok: { type: 'boolean' } }, required: ['result', 'ok'], additionalProperties: false });
  }
  return out.map((s) => JSON.parse(JSON.stringify(s)));
}

test(`${N_SCHEMAS} generated schemas x ${SEEDS.length} seeds: every answer validates with ajv`, async (t) => {
  const ajv = new Ajv({ strict: false, allErrors: true });
  let answered = 0;
  let closed = 0;
  const failures = [];
  for (const [i, schema] of schemas().entries()) {
    const validate = ajv.compile(schema);
    for (const seed of SEEDS) {
      const r = await client.chat.completions.create({
        model: 'dsv4-demo', messages: user('Write the record.'), max_tokens: MAX_TOKENS, temperature: 1.0, seed, ...noThink,
        response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
      });
      const c = r.choices[0];
      let doc;
      try {
        doc = JSON.parse(c.message.content);
      } catch (e) {
        failures.push(`schema ${i} seed ${seed}: not JSON (${c.finish_reason}): ${c.message.content}`);
        continue;
      }
      if (!validate(doc)) failures.push(`schema ${i} seed ${seed}: ${JSON.stringify(validate.errors)}\n${c.message.content}`);
      if (!['stop', 'length'].includes(c.finish_reason)) failures.push(`schema ${i} seed ${seed}: finish_reason ${c.finish_reason}`);
      if (c.finish_reason === 'length') closed++;
      answered++;
    }
  }
  assert.deepEqual(failures, [], failures.slice(0, 5).join('\n\n'));
  assert.equal(answered, N_SCHEMAS * SEEDS.length);
  t.diagnostic(`${answered} answers, ${closed} closed by the server at max_tokens ${MAX_TOKENS}`);
});

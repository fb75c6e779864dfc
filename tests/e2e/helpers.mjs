// Shared helpers of the end-to-end tests: start `dsv4 serve` on the demo model (models/dsv4-demo) on a free port,
// wait until /health answers, stop it with SIGTERM (exit code 0 expected), raw HTTP requests.
// The binary is build/dsv4 (override with DSV4_BIN=path). Fails loudly if the demo model or the binary is missing.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const bin = process.env.DSV4_BIN ? path.resolve(process.env.DSV4_BIN) : path.join(root, 'build', 'dsv4');
export const modelDir = path.join(root, 'models', 'dsv4-demo');
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
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

// Starts a server; returns {base, port, log(), health(), stop()}.
export async function startServer(extraArgs = [], { ctx = 2048, queue = 4 } = {}) {
  assert.ok(existsSync(path.join(modelDir, 'config.json')), `demo model missing: ${modelDir}`);
  assert.ok(existsSync(bin), `dsv4 binary missing: ${bin} (build it, or set DSV4_BIN)`);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  let log = '';
  const proc = spawn(bin, ['serve', '-m', modelDir, '--port', String(port), '--ctx', String(ctx), '--queue',
    String(queue), '--threads', '2', '--keepalive', '0.5', ...extraArgs], { stdio: ['ignore', 'ignore', 'pipe'] });
  proc.stderr.on('data', (d) => { log += d; });
  const health = async () => {
    const r = await fetch(`${base}/health`);
    return { status: r.status, body: await r.json() };
  };
  const t0 = Date.now();
  for (;;) {
    if (proc.exitCode !== null) assert.fail(`dsv4 serve exited (${proc.exitCode}): ${log}`);
    try {
      if ((await health()).status === 200) break;
    } catch {}
    if (Date.now() - t0 > 60000) assert.fail(`dsv4 serve did not come up: ${log}`);
    await sleep(100);
  }
  const stop = async () => {
    if (proc.exitCode !== null) return;
    const exited = new Promise((r) => proc.once('exit', (code, signal) => r({ code, signal })));
    proc.kill('SIGTERM');
    let timer;
    const timeout = new Promise((r) => { timer = setTimeout(() => r('timeout'), 10000); });
    const res = await Promise.race([exited, timeout]);
    clearTimeout(timer);  // a pending timer would keep this test process alive
    if (res === 'timeout') proc.kill('SIGKILL');
    assert.notEqual(res, 'timeout', 'dsv4 serve did not stop on SIGTERM');
    assert.equal(res.code, 0, `dsv4 serve exit: ${JSON.stringify(res)}\n${log}`);
  };
  return { base, port, health, stop, log: () => log };
}

export async function request(base, route, { method = 'POST', body, headers = {} } = {}) {
  const r = await fetch(`${base}${route}`, {
    method, headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, headers: r.headers, text, json };
}

export const user = (content) => [{ role: 'user', content }];
export const noThink = { thinking: { type: 'disabled' } };

// test_openai_client.mjs - `flexdiag serve` through the official `openai` npm client (the
// version pinned in package.json and package-lock.json, installed by README's set-up command
// (1): npm ci --prefix tests/cli/openai_client). Starts two servers on free loopback ports with
// --api-key, as test_serve.py does: micro-janus (built in) for images, and a copy of the golden
// OPT model folder (tests/golden/data/opt: tokenizer.json, so replies carry text) with
// transformers' ChatML template for completions and chat. Checks, through the client: the model
// list; images.generate (b64_json), plain and streamed, equal to `flexdiag generate`'s PNG bytes
// for the same prompt and seed; a streamed completion and a streamed chat completion whose
// pieces add up to the non-streamed reply; the client's error classes for a wrong key (401) and
// a bad field (400 naming it); then SIGTERM exits 0. Exit 77 (skip) without the package (run.sh
// skips without node 18+).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = process.env.FLEXDIAG_BIN ?? 'build/flexdiag';
const DATA = process.env.FLEXDIAG_TEST_DATA ?? path.join(HERE, '..', '..');
const KEY = 'openai-client-k3y';
const CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + " +
  "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}" +
  "{{ '<|im_start|>assistant\n' }}{% endif %}";
const failures = [];
const servers = []; // started ones: killed at the end if a failed call left them running

function check(cond, what) {
  if (!cond) {
    failures.push(what);
    console.log('FAIL:', what);
  }
}

// The client, or exit 77 where the package is not installed.
async function loadClient() {
  if (!fs.existsSync(path.join(HERE, 'node_modules', 'openai', 'package.json'))) {
    console.log(`skip: the openai package is not installed in ${HERE} (npm ci --prefix ` +
      "tests/cli/openai_client, README's set-up command (1))");
    process.exit(77);
  }
  return { OpenAI: (await import('openai')).default,
    version: (await import('openai/version')).VERSION };
}

// ---- servers and references ----

// `flexdiag serve --port 0 --api-key KEY args`: resolves once it prints "listening on".
function startServer(args) {
  const proc = spawn(BIN, ['serve', '--cpu', '--threads', '2', '--port', '0', '--api-key', KEY,
    ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  servers.push(proc);
  let out = '';
  let err = '';
  proc.stderr.on('data', (d) => { err += d; });
  return new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /^listening on (http:\/\/127\.0\.0\.1:\d+)\n/.exec(out);
      if (m) resolve({ proc, url: m[1], stderr: () => err });
    });
    proc.on('exit', (code) => reject(new Error(`serve ${args} exited ${code}: ${err}`)));
  });
}

// SIGTERM drains the server: exit 0 expected.
async function stopServer(srv, what) {
  const code = srv.proc.exitCode ?? await new Promise((resolve) => {
    srv.proc.once('exit', (c, sig) => resolve(c ?? sig));
    srv.proc.kill('SIGTERM');
  });
  check(code === 0, `${what}: serve exits 0 after SIGTERM (got ${code}): ${srv.stderr()}`);
}

// The PNGs `flexdiag generate` writes for prompt, seed and n images.
function generatePngs(tmp, prompt, seed, n) {
  const out = path.join(tmp, 'gen');
  execFileSync(BIN, ['generate', '--cpu', '--threads', '2', '--quiet', '--out', out, '--arch',
    'micro-janus', '--prompt', prompt, '--images-per-prompt', String(n), '--sample-seed',
    String(seed)], { stdio: 'pipe' });
  return Array.from({ length: n }, (_, i) => fs.readFileSync(path.join(out, '0', `${i}.png`)));
}

// The golden OPT model folder with the ChatML template in its tokenizer_config.json.
function chatFolder(tmp) {
  const dir = path.join(tmp, 'opt-chatml');
  fs.cpSync(path.join(DATA, 'golden', 'data', 'opt'), dir, { recursive: true });
  const file = path.join(dir, 'tokenizer_config.json');
  const cfg = JSON.parse(fs.readFileSync(file, 'utf8'));
  fs.writeFileSync(file, JSON.stringify({ ...cfg, chat_template: CHATML }));
  return dir;
}

// ---- the client's calls ----

async function testImages(OpenAI, srv, tmp) {
  const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'micro-janus',
    `models.list: ${JSON.stringify(models.data)}`);

  const prompt = 'a red apple on a wooden table';
  const ref = generatePngs(tmp, prompt, 7, 2);
  const body = { model: 'micro-janus', prompt, n: 2, size: '32x32', response_format: 'b64_json',
    seed: 7 };
  const r = await client.images.generate(body);
  check(r.data.length === 2, `images.generate: 2 images (got ${r.data.length})`);
  r.data.forEach((d, i) => check(Buffer.from(d.b64_json, 'base64').equals(ref[i]),
    `images.generate: image ${i}'s PNG bytes equal generate's`));

  const done = {};
  for await (const ev of await client.images.generate({ ...body, stream: true })) {
    if (ev.type === 'image_generation.completed') done[ev.index] = ev.b64_json;
  }
  check(Object.keys(done).sort().join() === '0,1', `streamed: one completed event per image: ` +
    `${Object.keys(done)}`);
  ref.forEach((png, i) => check(done[i] && Buffer.from(done[i], 'base64').equals(png),
    `streamed images.generate: image ${i}'s PNG bytes equal generate's`));
  await testErrors(OpenAI, client, srv);
}

// A wrong key and an out-of-range n surface as the client's error classes.
async function testErrors(OpenAI, client, srv) {
  const wrong = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
  const e401 = await wrong.models.list().catch((e) => e);
  check(e401 instanceof OpenAI.AuthenticationError && e401.status === 401,
    `a wrong key: AuthenticationError 401 (got ${e401})`);
  const e400 = await client.images.generate({ prompt: 'x', n: 99 }).catch((e) => e);
  check(e400 instanceof OpenAI.BadRequestError && e400.param === 'n',
    `n 99: BadRequestError naming n (got ${e400}, param ${e400.param})`);
}

// Concatenates a stream's pieces per choice: {index: {text, tokens, finish, role}}.
async function gather(stream, piece) {
  const got = {};
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      const g = got[c.index] ??= { text: '', tokens: [], finish: null, role: c.delta?.role };
      check(g.finish === null, `choice ${c.index}: no chunk after its finish_reason`);
      g.text += piece(c);
      g.tokens.push(...(c.tokens ?? []));
      g.finish = c.finish_reason;
    }
  }
  return got;
}

// The streamed reply's pieces add up to the plain reply, choice by choice.
function compare(what, choices, got, text) {
  check(Object.keys(got).length === choices.length, `${what}: ${choices.length} streamed ` +
    `choices (got ${Object.keys(got).length})`);
  check(choices.some((c) => text(c).length > 0), `${what}: some text to compare`);
  for (const c of choices) {
    const g = got[c.index] ?? {};
    check(g.text === text(c) && JSON.stringify(g.tokens) === JSON.stringify(c.tokens) &&
      g.finish === c.finish_reason, `${what} choice ${c.index}: the stream adds up to the ` +
      `reply (${JSON.stringify(g)} vs ${JSON.stringify(c)})`);
  }
}

async function testText(OpenAI, srv) {
  const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: KEY, maxRetries: 0 });
  const model = (await client.models.list()).data[0].id;
  const body = { model, max_tokens: 12, n: 2, seed: 5, temperature: 1.0 };

  const cbody = { ...body, prompt: 'Hi there' };
  const plain = await client.completions.create(cbody);
  const streamed = await gather(await client.completions.create({ ...cbody, stream: true }),
    (c) => c.text);
  compare('completions', plain.choices, streamed, (c) => c.text);

  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }];
  const chat = await client.chat.completions.create({ ...body, messages });
  const chunks = await gather(await client.chat.completions.create({ ...body, messages,
    stream: true }), (c) => c.delta.content ?? '');
  compare('chat', chat.choices, chunks, (c) => c.message.content);
  check(Object.values(chunks).every((g) => g.role === 'assistant'),
    `chat: each choice's first chunk says the role: ${JSON.stringify(chunks)}`);
}

async function main() {
  const { OpenAI, version } = await loadClient();
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'flexdiag-openai-'));
  try {
    const img = await startServer(['--arch', 'micro-janus', '--batch', '4']);
    await testImages(OpenAI, img, tmp);
    await stopServer(img, 'micro-janus');
    const txt = await startServer(['--model', chatFolder(tmp), '--max-new-tokens', '16',
      '--max-prompt-len', '224']);
    await testText(OpenAI, txt);
    await stopServer(txt, 'opt-chatml');
  } finally {
    servers.filter((p) => p.exitCode === null && p.signalCode === null)
      .forEach((p) => p.kill('SIGKILL'));
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  console.log(`openai ${version}, node ${process.version}: ` +
    `${failures.length} failure(s)`);
  process.exit(failures.length ? 1 : 0);
}

await main();

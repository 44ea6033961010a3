// Drives the dashboard of a real sidecar in Debian's headless Chromium.
// Started by tests/dashboard.rs, which runs three linked sidecars and talks
// to this script line by line:
//
//   this script → stdout: "STEP …" (progress), "NEED <what>" (the test acts),
//                         "RESULT <name>=<value>", "DONE"
//   the test    → stdin:  "OK <what> [detail]" once it has acted
//
// <what>: kill (SIGKILL the sidecar DASH_KILL; detail: epoch ms before the
// kill), claims (make runs on sidecar 0; detail: JSON), restart-killed,
// freeze / thaw (SIGSTOP / SIGCONT sidecar 0), restart-self (sidecar 0).
//
// Any failed check throws: the script prints it and exits with status 1.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { chromium } from 'playwright-core';

function env(name) {
  const v = process.env[name];
  if (v === undefined || v === '') throw new Error(`${name} is not set`);
  return v;
}

const ADMIN = env('DASH_ADMIN'); // http://127.0.0.1:PORT of the sidecar whose page we watch
const TOKEN = env('DASH_TOKEN');
const NODES = JSON.parse(env('DASH_NODES')); // node ids, in sidecar order
const KILL = Number(env('DASH_KILL')); // index of the sidecar the test SIGKILLs
const HOSTILE = Number(env('DASH_HOSTILE')); // index of the sidecar with the hostile label
const HOSTILE_LABEL = env('DASH_HOSTILE_LABEL'); // its value (key: note)
const HEARTBEAT_MS = Number(env('DASH_HEARTBEAT_MS'));
const EXPIRY_MS = Number(env('DASH_EXPIRY_MS'));
const keepaliveMs = Number(env('DASH_KEEPALIVE_MS'));
const CHROMIUM = env('CHROMIUM');
const SCREENSHOTS = env('DASH_SCREENSHOTS').split(path.delimiter).filter(Boolean);
const FAILSHOT = process.env.DASH_FAILSHOT || '';

const say = (line) => process.stdout.write(line + '\n');
const step = (what) => say('STEP ' + what);

// ---- lines from the test ---------------------------------------------------

const inbox = [];
const waiting = [];
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const w = waiting.shift();
  if (w) w(line);
  else inbox.push(line);
});

async function need(what, timeoutMs) {
  say('NEED ' + what);
  const line = inbox.length
    ? inbox.shift()
    : await new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`the test did not do "${what}" within ${timeoutMs} ms`)), timeoutMs);
      waiting.push((l) => {
        clearTimeout(t);
        resolve(l);
      });
    });
  const ok = 'OK ' + what;
  assert.ok(line === ok || line.startsWith(ok + ' '), `expected "${ok}" from the test, got ${JSON.stringify(line)}`);
  return line.slice(ok.length + 1);
}

// ---- page helpers ------------------------------------------------------------

/** The mesh rows as {node, state, badge, color, labels, link, beat}. */
function meshRows(page) {
  return page.evaluate(() => Array.from(document.querySelectorAll('#mesh tbody tr')).map((tr) => {
    const badge = tr.querySelector('td.state .badge');
    return {
      node: tr.dataset.node,
      state: tr.dataset.state,
      badge: badge ? badge.textContent : '',
      color: badge ? getComputedStyle(badge).color : '',
      labels: tr.querySelector('td.labels').textContent,
      link: tr.querySelector('td.link').textContent,
      beat: tr.querySelector('td.beat').textContent,
    };
  }));
}

/** Nothing the data carried became markup or ran. */
async function assertInert(page, where) {
  const found = await page.evaluate(() => ({
    pwned: window.__pwned,
    scripts: document.scripts.length,
    injected: document.querySelectorAll('img, svg, iframe, #injected, [onerror], [onload], [onmouseover]').length,
  }));
  assert.equal(found.pwned, undefined, `${where}: a payload ran (window.__pwned = ${found.pwned})`);
  assert.equal(found.scripts, 1, `${where}: only app.js may be a script element`);
  assert.equal(found.injected, 0, `${where}: data became elements or handlers`);
}

// ---- the fake stream: hostile strings everywhere ----------------------------

const SCRIPT = '<script>window.__pwned=1</script>';
const IMG = '<img src=x onerror="window.__pwned=2">';
const SVG = '<svg onload="window.__pwned=3"></svg>';
const QUOTE = '"><b id="injected">bold</b>';
const HOSTILE_JOB = 'report' + SCRIPT + IMG;
const HOSTILE_JOB_2 = 'second' + SVG + QUOTE;

function hostileStream(now) {
  const snapshot = {
    node: 'fake' + IMG,
    backend: 'sqlite' + SVG,
    heartbeat_ms: 200,
    expiry_ms: 1500,
    keepalive_ms: 3000,
    self: {
      node: 'self' + QUOTE, instance: 1, restarts: 0, address: '127.0.0.1:1' + IMG,
      state: 'ALIVE', link: 'UNSPECIFIED', beat: 1, beat_age_ms: 10, labels: { node_name: 'me' + SCRIPT },
    },
    peers: [{
      node: 'peer' + SCRIPT, instance: 2, restarts: 1, address: IMG,
      state: 'EXPIRED" onmouseover="window.__pwned=4', link: SVG, beat: 3, beat_age_ms: 2000,
      labels: { ['k' + IMG]: QUOTE },
    }],
    runs: [{
      job: HOSTILE_JOB, slot_ms: 0, attempt: 2, fencing: 7, state: 'RUNNING', holder: 'h' + SCRIPT + '/1',
      claimed_at_ms: now, finished_at_ms: 0, lease_until_ms: now + 60000, fenced: 1, fenced_reason: 'taken_over' + IMG,
    }],
    stats: {
      now_ms: now, claims: [{ outcome: 'WON' + IMG, backend: SVG, n: 1 }], takeovers: 1, fenced: 1,
      renewals: 0, holds_open: 0, store: { up: false, checked_ms_ago: 10, error: IMG }, beats: [],
    },
  };
  const run = {
    kind: 'won' + IMG, op: SCRIPT, reason: IMG, at_ms: now,
    run: {
      job: HOSTILE_JOB_2, slot_ms: 5, attempt: 1, fencing: 1, state: 'SUCCEEDED' + IMG, holder: IMG,
      claimed_at_ms: now, finished_at_ms: now, lease_until_ms: 0, fenced: 0, fenced_reason: '',
    },
  };
  const peer = {
    kind: 'JOINED' + SCRIPT,
    peer: {
      node: 'new' + IMG, instance: 1, restarts: 0, address: SVG, state: 'ALIVE', link: 'DIRECT' + IMG,
      beat: 1, beat_age_ms: 5, labels: { node_name: QUOTE },
    },
  };
  const frame = (event, data) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
  return [frame('snapshot', snapshot), frame('run', run), frame('peer', peer)];
}

/**
 * Serves the sidecar's own page and assets (fetched from it, so the embedded
 * files are what is tested) next to a fake /api/v1/events full of markup.
 * No CSP header here: escaping alone must keep the payloads inert.
 */
async function fakeServer() {
  const assets = {};
  for (const p of ['/', '/ui/app.js', '/ui/app.css']) {
    const r = await fetch(ADMIN + p);
    assert.equal(r.status, 200, `GET ${p}`);
    assets[p] = { type: r.headers.get('content-type'), body: await r.text() };
  }
  const open = new Set();
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://fake');
    if (url.pathname === '/api/v1/events') {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
      const frames = hostileStream(Date.now());
      frames.forEach((f, i) => setTimeout(() => res.write(f), 100 * i));
      open.add(res);
      res.on('close', () => open.delete(res));
      return;
    }
    const a = assets[url.pathname];
    if (!a) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'content-type': a.type }).end(a.body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => {
      for (const r of open) r.destroy();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

// ---- the suite -------------------------------------------------------------

async function suite(ctx) {
  const page = ctx.pages()[0] || (await ctx.newPage());
  const problems = [];
  page.on('pageerror', (e) => problems.push('page error: ' + e));
  page.on('dialog', (d) => {
    problems.push('dialog: ' + d.message());
    d.dismiss().catch(() => {});
  });

  // Without a token the stream is refused and the page asks for one.
  step('no token: the page asks for one');
  await page.goto(ADMIN + '/');
  await page.locator('#auth').waitFor({ state: 'visible', timeout: 10000 });
  assert.equal(await page.locator('#conn').textContent(), 'token required');
  assert.equal((await meshRows(page)).length, 0, 'nothing is shown without the token');

  // With the token in the fragment: live, and the token leaves the address bar.
  step('token in #token=: the stream goes live');
  await page.goto(ADMIN + '/ui#token=' + encodeURIComponent(TOKEN));
  await page.waitForFunction(() => document.getElementById('conn').textContent === 'live', null, { timeout: 10000 });
  assert.equal(await page.evaluate(() => location.hash), '', 'the token must leave the URL');
  assert.ok(await page.locator('#auth').isHidden());

  step('all three runtimes are listed ALIVE');
  await page.waitForFunction((nodes) => {
    const rows = Array.from(document.querySelectorAll('#mesh tbody tr'));
    return nodes.every((n) => rows.some((tr) => tr.dataset.node === n && tr.dataset.state === 'ALIVE'));
  }, NODES, { timeout: 20000, polling: 50 });
  let rows = await meshRows(page);
  assert.equal(rows.length, 3, 'self and two peers: ' + JSON.stringify(rows));
  for (const r of rows) {
    assert.equal(r.badge, 'ALIVE');
    assert.equal(r.color, 'rgb(26, 127, 55)', 'ALIVE is green');
    assert.match(r.beat, /^\d+(\.\d)?s ago$/);
  }
  assert.equal(rows[0].node, NODES[0], 'this runtime first');
  assert.equal(rows[0].link, 'SELF');
  // Beat ages tick locally and are refreshed by the stream.
  const beats = [];
  for (let i = 0; i < 6; i++) {
    beats.push((await meshRows(page)).find((r) => r.node === NODES[1]).beat);
    await page.waitForTimeout(250);
  }
  assert.ok(new Set(beats).size > 1, 'beat ages must tick: ' + beats.join(' '));

  step('a label with markup is shown as text');
  const hostileRow = rows.find((r) => r.node === NODES[HOSTILE]);
  assert.ok(hostileRow.labels.includes('note=' + HOSTILE_LABEL), 'label text: ' + hostileRow.labels);
  assert.ok((await page.evaluate(() => document.body.innerText)).includes(HOSTILE_LABEL), 'label visible');
  await assertInert(page, 'real page');

  // SIGKILL one sidecar: EXPIRED on the page within expiry + 1 s, no reload.
  step('SIGKILL: the runtime shows EXPIRED without a reload');
  await page.evaluate((node) => {
    window.__sameDocument = true;
    window.__expiredAt = null;
    const tbody = document.querySelector('#mesh tbody');
    const check = () => {
      if (window.__expiredAt !== null) return;
      for (const tr of tbody.rows) {
        if (tr.dataset.node === node && tr.dataset.state === 'EXPIRED') window.__expiredAt = Date.now();
      }
    };
    new MutationObserver(check).observe(tbody, { childList: true, subtree: true, attributes: true });
  }, NODES[KILL]);
  const killedAt = Number(await need('kill', 20000));
  await page.waitForFunction(() => window.__expiredAt !== null, null, { timeout: EXPIRY_MS + 10000, polling: 50 });
  const seenAt = await page.evaluate(() => window.__expiredAt);
  const latency = seenAt - killedAt;
  say(`RESULT expired_visible_ms=${latency}`);
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page must not reload');
  assert.ok(latency <= EXPIRY_MS + 1000, `EXPIRED shown ${latency} ms after the kill; want ≤ ${EXPIRY_MS + 1000}`);
  assert.ok(latency >= EXPIRY_MS - 2 * HEARTBEAT_MS, `EXPIRED shown only ${latency} ms after the kill: too early`);
  rows = await meshRows(page);
  const dead = rows.find((r) => r.node === NODES[KILL]);
  assert.equal(dead.badge, 'EXPIRED');
  assert.equal(dead.color, 'rgb(207, 34, 46)', 'EXPIRED is red');
  assert.equal(rows.filter((r) => r.state === 'ALIVE').length, 2, 'the others stay ALIVE');

  step('claimed runs appear in the runs table');
  const claims = JSON.parse(await need('claims', 30000));
  const runRow = (job, slot) => page.evaluate(([job, slot]) => {
    const tr = Array.from(document.querySelectorAll('#runs tr.run'))
      .find((t) => t.dataset.job === job && t.dataset.slot === String(slot));
    if (!tr) return null;
    return {
      attempt: tr.querySelector('td.attempt').textContent,
      state: tr.querySelector('td.state').textContent,
      holder: tr.querySelector('td.holder').title,
      claimed: tr.querySelector('td.claimed').textContent,
      finished: tr.querySelector('td.finished').textContent,
      notes: tr.querySelector('td.notes').textContent,
      takeover: tr.classList.contains('takeover'),
      fenced: tr.classList.contains('fenced'),
    };
  }, [job, slot]);
  const until = async (what, f) => {
    const end = Date.now() + 5000;
    for (;;) {
      const v = await f();
      if (v) return v;
      if (Date.now() > end) throw new Error('never happened: ' + what);
      await page.waitForTimeout(50);
    }
  };
  const running = await until('running row', async () => {
    const r = await runRow(claims.running.job, claims.running.slot_ms);
    return r && r.state === 'RUNNING' ? r : null;
  });
  assert.equal(running.attempt, '1');
  assert.equal(running.holder, NODES[0] + '/' + claims.instance);
  assert.match(running.claimed, /^\d\d:\d\d:\d\d\.\d{3}$/);
  assert.equal(running.finished, '');
  assert.ok(!running.takeover && !running.fenced);
  const taken = await until('takeover row', async () => {
    const r = await runRow(claims.takeover.job, claims.takeover.slot_ms);
    return r && r.state === 'SUCCEEDED' && r.fenced ? r : null;
  });
  assert.equal(taken.attempt, '2');
  assert.ok(taken.takeover, 'a takeover stands out');
  assert.match(taken.notes, /takeover · attempt 2/);
  assert.match(taken.notes, /fenced ×1 · taken_over/);
  assert.match(taken.finished, /^\d\d:\d\d:\d\d\.\d{3}$/);
  const failed = await until('failed row', async () => {
    const r = await runRow(claims.failed.job, claims.failed.slot_ms);
    return r && r.state === 'FAILED' ? r : null;
  });
  assert.equal(failed.attempt, '1');
  await page.waitForFunction(() => {
    const c = Array.from(document.querySelectorAll('#counters .card'));
    const won = c.find((e) => e.querySelector('.label').textContent === 'WON · sqlite');
    const store = c.find((e) => e.querySelector('.label').textContent === 'store');
    return won && Number(won.querySelector('.value').textContent) >= 4 &&
      store && store.querySelector('.value').textContent === 'up';
  }, null, { timeout: 5000 });

  // Let the beat ages tick, then keep a picture for the docs.
  await page.waitForTimeout(1200);
  for (const shot of SCREENSHOTS) {
    fs.mkdirSync(path.dirname(shot), { recursive: true });
    await page.screenshot({ path: shot, fullPage: true });
    step('screenshot ' + shot);
  }
  await assertInert(page, 'real page');

  step('the killed runtime restarts: same node, restarts 1');
  await need('restart-killed', 30000);
  await page.waitForFunction((node) => {
    const tr = Array.from(document.querySelectorAll('#mesh tbody tr')).find((t) => t.dataset.node === node);
    return tr && tr.dataset.state === 'ALIVE' && tr.querySelector('td.restarts').textContent === '1';
  }, NODES[KILL], { timeout: 15000, polling: 50 });

  step('a silent stream is noticed and reopened');
  const conn = () => page.evaluate(() => document.getElementById('conn').textContent);
  await need('freeze', 10000);
  const frozenAt = Date.now();
  await page.waitForFunction(() => document.getElementById('conn').textContent !== 'live', null,
    { timeout: 3 * keepaliveMs + 5000, polling: 100 });
  const noticed = Date.now() - frozenAt;
  say(`RESULT silent_stream_noticed_ms=${noticed}`);
  assert.ok(noticed >= 2 * keepaliveMs, `a quiet stream was dropped after only ${noticed} ms`);
  await need('thaw', 10000);
  await page.waitForFunction(() => document.getElementById('conn').textContent === 'live', null,
    { timeout: 20000, polling: 100 });
  await page.waitForFunction((nodes) => {
    const rows = Array.from(document.querySelectorAll('#mesh tbody tr'));
    return nodes.every((n) => rows.some((tr) => tr.dataset.node === n && tr.dataset.state === 'ALIVE'));
  }, NODES, { timeout: 20000, polling: 100 });

  step('its own sidecar restarts: the page reconnects to the new instance');
  const selfInstance = () => page.evaluate(() => document.querySelector('#mesh tbody tr.self td.instance').textContent);
  const before = await selfInstance();
  await need('restart-self', 30000);
  await page.waitForFunction((before) => {
    const td = document.querySelector('#mesh tbody tr.self td.instance');
    return document.getElementById('conn').textContent === 'live' && td && td.textContent !== before;
  }, before, { timeout: 20000, polling: 100 });
  assert.equal(Number(await selfInstance()), Number(before) + 1);
  assert.equal(await conn(), 'live');
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'the page must not reload');

  step('hostile job names from the stream render as text');
  const fake = await fakeServer();
  try {
    const p2 = await ctx.newPage();
    p2.on('pageerror', (e) => problems.push('page error (fake stream): ' + e));
    await p2.goto(fake.url + '/');
    await p2.waitForFunction(() => document.querySelectorAll('#runs tr.run').length === 2 &&
      document.querySelectorAll('#mesh tbody tr').length === 3, null, { timeout: 10000 });
    await p2.waitForTimeout(500); // an <img onerror> would have fired by now
    await assertInert(p2, 'fake stream');
    const shown = await p2.evaluate(() => ({
      jobs: Array.from(document.querySelectorAll('#runs .jobname')).map((e) => e.textContent),
      text: document.body.innerText,
    }));
    assert.deepEqual(shown.jobs.slice().sort(), [HOSTILE_JOB, HOSTILE_JOB_2].sort());
    for (const literal of [HOSTILE_JOB, SCRIPT, IMG, QUOTE]) {
      assert.ok(shown.text.includes(literal), 'visible as text: ' + literal);
    }
    assert.ok(await p2.locator('#runs .jobname', { hasText: 'window.__pwned=1' }).first().isVisible());
    await p2.close();
  } finally {
    await fake.close();
  }

  assert.deepEqual(problems, [], 'no page errors or dialogs');
}

const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'anarchon-chromium-'));
let ctx = null;
let code = 0;
try {
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1440, height: 900 },
    colorScheme: 'light',
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
  });
  await suite(ctx);
  say('DONE');
} catch (e) {
  code = 1;
  process.stderr.write('dashboard browser suite failed: ' + (e && e.stack ? e.stack : e) + '\n');
  if (FAILSHOT && ctx) {
    try {
      for (const [i, p] of ctx.pages().entries()) await p.screenshot({ path: `${FAILSHOT}-${i}.png`, fullPage: true });
      process.stderr.write(`failure screenshots: ${FAILSHOT}-*.png\n`);
    } catch (_) { /* best effort */ }
  }
} finally {
  if (ctx) await ctx.close().catch(() => {});
  fs.rmSync(profile, { recursive: true, force: true });
}
process.exit(code);

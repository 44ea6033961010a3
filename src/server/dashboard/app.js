// The anarchon dashboard: reads /api/v1/events (server-sent events over
// fetch(), so the bearer token can go in a header) and renders the mesh, the
// recent runs and the counters.
//
// Everything that comes from the stream is rendered with textContent or set
// as a DOM property, never parsed as HTML: job names and labels come from
// users.
'use strict';

(function () {
  const TOKEN_KEY = 'anarchon.dashboard.token';
  const MAX_LOG = 100;
  const PEER_STATES = ['ALIVE', 'UNREACHABLE', 'EXPIRED', 'LEFT'];

  // ---- state -----------------------------------------------------------

  const S = {
    cfg: { node: '', backend: '', heartbeat_ms: 1000, expiry_ms: 10000, keepalive_ms: 3000 },
    self: null,
    peers: new Map(),   // node → peer (+ rx: performance.now() when its beat age was measured)
    runs: new Map(),    // job + '\u0000' + slot → run
    stats: null,
    skew: 0,            // sidecar clock − browser clock, ms
    log: [],
    changed: new Set(), // nodes and run keys to flash at the next render
  };

  const $ = (id) => document.getElementById(id);

  /** An element with text (never HTML) and an optional class. */
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function badge(text, cls) {
    return el('span', text, 'badge ' + cls);
  }

  const str = (v) => (v === undefined || v === null ? '' : String(v));
  const num = (v) => (typeof v === 'number' && isFinite(v) ? v : Number(v) || 0);
  const known = (s, list) => (list.indexOf(s) >= 0 ? s : 'UNKNOWN');
  const serverNow = () => Date.now() + S.skew;

  // ---- formatting ------------------------------------------------------

  function ago(ms) {
    ms = Math.max(0, ms);
    if (ms < 10000) return (ms / 1000).toFixed(1) + 's ago';
    const s = Math.round(ms / 1000);
    if (s < 120) return s + 's ago';
    if (s < 7200) return Math.round(s / 60) + 'm ago';
    if (s < 172800) return Math.round(s / 3600) + 'h ago';
    return Math.round(s / 86400) + 'd ago';
  }

  const pad = (n, w) => String(n).padStart(w || 2, '0');

  function clock(ms) {
    const d = new Date(ms);
    return pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds()) +
      '.' + pad(d.getMilliseconds(), 3);
  }

  function dateTime(ms) {
    const d = new Date(ms);
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' +
      pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
  }

  function slotText(slot) {
    slot = num(slot);
    return slot === 0 ? '0 (lock)' : dateTime(slot);
  }

  function shortHolder(h) {
    h = str(h);
    const i = h.lastIndexOf('/');
    if (i <= 0) return h;
    const node = h.slice(0, i);
    return (node.length > 12 ? node.slice(0, 12) + '…' : node) + h.slice(i);
  }

  function nameOf(p) {
    const labels = p && p.labels && typeof p.labels === 'object' ? p.labels : {};
    return str(labels.node_name);
  }

  function labelText(p) {
    const labels = p && p.labels && typeof p.labels === 'object' ? p.labels : {};
    return Object.keys(labels).sort()
      .filter((k) => k !== 'node_name')
      .map((k) => k + '=' + str(labels[k]))
      .join(', ');
  }

  // ---- events from the stream -------------------------------------------

  function addLog(text, level) {
    S.log.unshift({ at: Date.now(), text: str(text), level: level || '' });
    if (S.log.length > MAX_LOG) S.log.length = MAX_LOG;
  }

  const runKey = (r) => str(r.job) + '\u0000' + num(r.slot_ms);

  function stamp(p) {
    return Object.assign({}, p, { rx: performance.now() });
  }

  function applyStats(st) {
    if (!st || typeof st !== 'object') return;
    S.stats = st;
    if (typeof st.now_ms === 'number') S.skew = st.now_ms - Date.now();
    const now = performance.now();
    for (const b of Array.isArray(st.beats) ? st.beats : []) {
      if (!Array.isArray(b)) continue;
      const node = str(b[0]);
      const p = S.self && S.self.node === node ? S.self : S.peers.get(node);
      if (!p) continue;
      p.beat = b[1];
      p.beat_age_ms = num(b[2]);
      p.rx = now;
    }
  }

  const handlers = {
    snapshot(d) {
      S.cfg = {
        node: str(d.node),
        backend: str(d.backend),
        heartbeat_ms: num(d.heartbeat_ms) || 1000,
        expiry_ms: num(d.expiry_ms) || 10000,
        keepalive_ms: num(d.keepalive_ms) || 3000,
      };
      S.self = d.self ? stamp(d.self) : null;
      S.peers = new Map();
      for (const p of Array.isArray(d.peers) ? d.peers : []) {
        if (p && p.node !== undefined) S.peers.set(str(p.node), stamp(p));
      }
      S.runs = new Map();
      for (const r of Array.isArray(d.runs) ? d.runs : []) {
        if (r && r.job !== undefined) S.runs.set(runKey(r), r);
      }
      applyStats(d.stats);
      addLog('connected to ' + S.cfg.node + ' (' + S.peers.size + ' peers, ' + S.runs.size + ' runs)');
    },

    peer(d) {
      const p = d && d.peer;
      if (!p || p.node === undefined) return;
      const node = str(p.node);
      const before = S.peers.get(node);
      S.peers.set(node, stamp(p));
      S.changed.add('peer:' + node);
      const kind = str(d.kind);
      const who = (nameOf(p) ? nameOf(p) + ' ' : '') + node.slice(0, 12) + '/' + str(p.instance);
      const level = kind === 'EXPIRED' ? 'bad' : (kind === 'UNREACHABLE' || kind === 'RESTARTED') ? 'warn' : '';
      if (kind !== 'SNAPSHOT' && !(before && kind === 'ALIVE' && before.state === 'ALIVE')) {
        addLog(kind + ' ' + who + (kind === 'RESTARTED' ? ' (restarts ' + str(p.restarts) + ')' : ''), level);
      }
    },

    run(d) {
      const r = d && d.run;
      if (!r || r.job === undefined) return;
      const key = runKey(r);
      S.runs.set(key, r);
      S.changed.add('run:' + key);
      const what = str(r.job) + ' slot ' + slotText(r.slot_ms);
      switch (str(d.kind)) {
        case 'won':
          if (num(r.attempt) > 1) addLog('TAKEOVER ' + what + ' attempt ' + num(r.attempt) + ' by ' + shortHolder(r.holder), 'warn');
          else addLog('won ' + what + ' by ' + shortHolder(r.holder));
          break;
        case 'released':
          addLog('released ' + what + ' ' + str(r.state), r.state === 'FAILED' ? 'warn' : '');
          break;
        case 'lease_ended':
          addLog('lease ended ' + what + ' (its Hold stream broke)', 'warn');
          break;
        case 'fenced':
          addLog('FENCED ' + str(d.op) + ' ' + what + ' (' + str(d.reason) + ')', 'bad');
          break;
        default:
          addLog(str(d.kind) + ' ' + what);
      }
    },

    stats(d) {
      applyStats(d);
    },
  };

  // ---- rendering ---------------------------------------------------------

  let scheduled = false;
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    setTimeout(() => {
      scheduled = false;
      render();
    }, 0);
  }

  function render() {
    renderHeader();
    renderCounters();
    renderMesh();
    renderRuns();
    renderLog();
    S.changed.clear();
  }

  function renderHeader() {
    const who = $('whoami');
    who.textContent = S.cfg.node
      ? 'node ' + S.cfg.node + (S.self && nameOf(S.self) ? ' (' + nameOf(S.self) + ')' : '') +
        ' · ' + S.cfg.backend + ' · heartbeat ' + S.cfg.heartbeat_ms + ' ms · expiry ' + S.cfg.expiry_ms + ' ms'
      : '';
  }

  function card(label, value, cls, title) {
    const c = el('div', null, 'card' + (cls ? ' ' + cls : ''));
    c.appendChild(el('div', label, 'label'));
    c.appendChild(el('div', value, 'value'));
    if (title) c.title = title;
    return c;
  }

  function renderCounters() {
    const box = $('counters');
    const st = S.stats;
    const cards = [];
    if (st) {
      for (const c of Array.isArray(st.claims) ? st.claims : []) {
        const outcome = str(c.outcome);
        cards.push(card(outcome + ' · ' + str(c.backend), num(c.n), '', 'claims answered ' + outcome + ' on ' + str(c.backend)));
      }
      cards.push(card('takeovers', num(st.takeovers), num(st.takeovers) > 0 ? 'warn' : ''));
      cards.push(card('fenced', num(st.fenced), num(st.fenced) > 0 ? 'bad' : ''));
      cards.push(card('renewals', num(st.renewals)));
      cards.push(card('holds open', num(st.holds_open)));
      const store = st.store || {};
      if (store.up === true) {
        cards.push(card('store', 'up', 'up', 'checked ' + ago(num(store.checked_ms_ago))));
      } else if (store.up === false) {
        cards.push(card('store', 'down', 'down', str(store.error)));
      } else {
        cards.push(card('store', 'checking…'));
      }
      if (st.duplicate_node_key === true) {
        cards.push(card('node key', 'DUPLICATE', 'down',
          'another live process runs with this node key (instance ' + str(st.duplicate_instance) +
          '): a shared data dir or a copied node.key; stop one of them'));
      }
      for (const r of Array.isArray(st.refused) ? st.refused : []) {
        cards.push(card('refused · ' + str(r.reason), str(r.node).slice(0, 8) + '…', 'down',
          str(r.node) + ' at ' + str(r.address) + ' claims in store ' + str(r.store_identity) +
          '; this sidecar in store ' + str(st.store_identity)));
      }
    }
    box.replaceChildren(...cards);
  }

  function peerRow(p, isSelf) {
    const tr = el('tr', null, isSelf ? 'self' : '');
    const node = str(p.node);
    tr.dataset.node = node;
    const state = isSelf ? 'ALIVE' : known(str(p.state), PEER_STATES);
    tr.dataset.state = state;
    if (S.changed.has('peer:' + node)) tr.classList.add('changed');
    tr.appendChild(el('td', node, 'node'));
    tr.appendChild(el('td', nameOf(p), 'name'));
    tr.appendChild(el('td', str(p.instance), 'num instance'));
    tr.appendChild(el('td', str(p.restarts), 'num restarts'));
    const st = el('td', null, 'state');
    st.appendChild(badge(isSelf ? 'ALIVE' : str(p.state), 'state-' + state));
    tr.appendChild(st);
    tr.appendChild(el('td', isSelf ? 'SELF' : str(p.link), 'link'));
    const beat = el('td', null, 'beat');
    beat.title = 'beat #' + str(p.beat);
    tr.appendChild(beat);
    tr.appendChild(el('td', str(p.address), 'addr'));
    tr.appendChild(el('td', labelText(p), 'labels'));
    return tr;
  }

  function renderMesh() {
    const rows = [];
    if (S.self) rows.push(peerRow(S.self, true));
    const peers = Array.from(S.peers.values()).sort((a, b) => {
      const ka = (nameOf(a) || '\uffff') + str(a.node);
      const kb = (nameOf(b) || '\uffff') + str(b.node);
      return ka < kb ? -1 : ka > kb ? 1 : 0;
    });
    for (const p of peers) rows.push(peerRow(p, false));
    $('mesh').tBodies[0].replaceChildren(...rows);
    const counts = S.self ? { ALIVE: 1 } : {};
    for (const p of S.peers.values()) counts[p.state] = (counts[p.state] || 0) + 1;
    $('mesh-summary').textContent = (S.self ? 1 + S.peers.size : 0) + ' runtimes' +
      PEER_STATES.filter((s) => counts[s]).map((s) => ' · ' + counts[s] + ' ' + s).join('');
    tickBeats();
  }

  /** Updates the "beat Ns ago" cells between events. */
  function tickBeats() {
    const now = performance.now();
    for (const tr of $('mesh').tBodies[0].rows) {
      const node = tr.dataset.node;
      const p = S.self && S.self.node === node ? S.self : S.peers.get(node);
      if (!p) continue;
      const cell = tr.querySelector('td.beat');
      if (cell) cell.textContent = ago(num(p.beat_age_ms) + (now - (p.rx || now)));
    }
  }

  function runState(r) {
    const state = str(r.state);
    if (state === 'RUNNING' && num(r.lease_until_ms) > 0 && num(r.lease_until_ms) < serverNow()) {
      return 'LAPSED';
    }
    return known(state, ['RUNNING', 'SUCCEEDED', 'FAILED']);
  }

  function runRow(r) {
    const tr = el('tr', null, 'run');
    tr.dataset.job = str(r.job);
    tr.dataset.slot = str(num(r.slot_ms));
    const attempt = num(r.attempt);
    const fenced = num(r.fenced);
    if (attempt > 1) tr.classList.add('takeover');
    if (fenced > 0) tr.classList.add('fenced');
    if (S.changed.has('run:' + runKey(r))) tr.classList.add('changed');
    const slot = el('td', slotText(r.slot_ms), 'slot');
    slot.title = 'slot_ms ' + num(r.slot_ms);
    tr.appendChild(slot);
    tr.appendChild(el('td', attempt > 0 ? attempt : '?', 'num attempt'));
    const state = runState(r);
    const st = el('td', null, 'state');
    st.appendChild(badge(state === 'LAPSED' ? 'RUNNING · lease lapsed' : str(r.state), 'run-' + state));
    tr.appendChild(st);
    const holder = el('td', shortHolder(r.holder), 'holder');
    holder.title = str(r.holder);
    tr.appendChild(holder);
    const claimed = num(r.claimed_at_ms);
    const finished = num(r.finished_at_ms);
    const c = el('td', claimed ? clock(claimed) : '', 'claimed');
    if (claimed) c.title = new Date(claimed).toISOString();
    tr.appendChild(c);
    const f = el('td', finished ? clock(finished) : '', 'finished');
    if (finished) f.title = new Date(finished).toISOString();
    tr.appendChild(f);
    tr.appendChild(el('td', num(r.fencing) || '', 'num fencing'));
    const notes = el('td', null, 'notes');
    if (attempt > 1) notes.appendChild(badge('takeover · attempt ' + attempt, 'note-takeover'));
    if (fenced > 0) {
      notes.appendChild(badge('fenced ×' + fenced + (r.fenced_reason ? ' · ' + str(r.fenced_reason) : ''), 'note-fenced'));
    }
    tr.appendChild(notes);
    return tr;
  }

  function renderRuns() {
    const table = $('runs');
    const byJob = new Map();
    for (const r of S.runs.values()) {
      const job = str(r.job);
      if (!byJob.has(job)) byJob.set(job, []);
      byJob.get(job).push(r);
    }
    const jobs = Array.from(byJob.keys()).sort();
    const bodies = [];
    let takeovers = 0;
    let fenced = 0;
    for (const job of jobs) {
      const runs = byJob.get(job).sort((a, b) => num(b.slot_ms) - num(a.slot_ms));
      const body = el('tbody', null, 'job');
      body.dataset.job = job;
      const head = el('tr');
      const th = el('th');
      th.colSpan = 8;
      th.appendChild(el('span', job, 'jobname'));
      const t = runs.filter((r) => num(r.attempt) > 1).length;
      const f = runs.filter((r) => num(r.fenced) > 0).length;
      takeovers += t;
      fenced += f;
      th.appendChild(el('span', runs.length + (runs.length === 1 ? ' run' : ' runs') +
        (t ? ' · ' + t + ' taken over' : '') + (f ? ' · ' + f + ' fenced' : ''), 'summary'));
      head.appendChild(th);
      body.appendChild(head);
      for (const r of runs) body.appendChild(runRow(r));
      bodies.push(body);
    }
    table.replaceChildren(table.tHead, ...bodies);
    $('runs-empty').hidden = bodies.length > 0;
    $('runs-summary').textContent = S.runs.size ? S.runs.size + ' runs in ' + jobs.length + ' jobs' +
      (takeovers ? ' · ' + takeovers + ' taken over' : '') + (fenced ? ' · ' + fenced + ' fenced' : '') : '';
  }

  function renderLog() {
    const items = S.log.map((e) => {
      const li = el('li', null, e.level);
      li.appendChild(el('time', clock(e.at)));
      li.appendChild(document.createTextNode(e.text));
      return li;
    });
    $('log').replaceChildren(...items);
  }

  // ---- the stream --------------------------------------------------------

  let token = '';
  let retryMs = 500;

  function setConn(kind, text) {
    const c = $('conn');
    c.className = 'conn conn-' + kind;
    c.textContent = text;
    $('main').classList.toggle('stale', kind !== 'live');
  }

  function readToken() {
    const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (m) {
      try {
        token = decodeURIComponent(m[1]);
      } catch (e) {
        token = m[1];
      }
      try {
        sessionStorage.setItem(TOKEN_KEY, token);
      } catch (e) { /* storage may be off */ }
      // Keep the token out of the address bar and the history.
      history.replaceState(null, '', location.pathname + location.search);
      return;
    }
    try {
      token = sessionStorage.getItem(TOKEN_KEY) || '';
    } catch (e) {
      token = '';
    }
  }

  function askToken(message) {
    setConn('denied', 'token required');
    $('auth-msg').textContent = message;
    $('auth').hidden = false;
    $('auth-token').focus();
  }

  function dispatch(event, data) {
    const h = Object.prototype.hasOwnProperty.call(handlers, event) ? handlers[event] : null;
    if (!h) return;
    let d;
    try {
      d = JSON.parse(data);
    } catch (e) {
      return;
    }
    h(d);
    schedule();
  }

  /** Parses one server-sent event block. */
  function block(text) {
    let event = 'message';
    const data = [];
    for (const line of text.split('\n')) {
      if (line === '' || line[0] === ':') continue;
      const i = line.indexOf(':');
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? '' : line.slice(i + 1);
      if (value[0] === ' ') value = value.slice(1);
      if (field === 'event') event = value;
      else if (field === 'data') data.push(value);
    }
    if (data.length) dispatch(event, data.join('\n'));
  }

  async function connect() {
    $('auth').hidden = true;
    setConn('connecting', 'connecting…');
    const ctrl = new AbortController();
    const headers = { Accept: 'text/event-stream' };
    if (token) headers.Authorization = 'Bearer ' + token;
    // No answer, or no byte for three keepalive periods: the connection is
    // dead even if the socket does not know it yet (a paused host, a
    // half-open connection).
    let last = Date.now();
    const watchdog = setInterval(() => {
      if (Date.now() - last > 3 * S.cfg.keepalive_ms) ctrl.abort();
    }, 1000);
    try {
      const resp = await fetch('api/v1/events', { headers, cache: 'no-store', signal: ctrl.signal });
      if (resp.status === 401) {
        askToken(token ? 'That token was refused.' : 'This sidecar needs a bearer token.');
        return;
      }
      if (!resp.ok || !resp.body) throw new Error('HTTP ' + resp.status);
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      let first = true;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        last = Date.now();
        buf += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const text = buf.slice(0, i);
          buf = buf.slice(i + 2);
          block(text);
          if (first) {
            first = false;
            retryMs = 500;
            setConn('live', 'live');
          }
        }
      }
    } catch (e) {
      // Reconnect below.
    } finally {
      clearInterval(watchdog);
      ctrl.abort();
    }
    addLog('stream lost; reconnecting', 'warn');
    schedule();
    const wait = retryMs;
    retryMs = Math.min(retryMs * 2, 10000);
    setConn('retrying', 'reconnecting in ' + (wait / 1000).toFixed(1) + 's');
    setTimeout(connect, wait);
  }

  function start() {
    $('auth').addEventListener('submit', (ev) => {
      ev.preventDefault();
      token = $('auth-token').value.trim();
      $('auth-token').value = '';
      try {
        sessionStorage.setItem(TOKEN_KEY, token);
      } catch (e) { /* storage may be off */ }
      connect();
    });
    readToken();
    // Ages tick between events; lapsed leases show up without an event.
    setInterval(() => {
      tickBeats();
    }, 250);
    setInterval(() => {
      for (const r of S.runs.values()) {
        if (r.state === 'RUNNING') {
          renderRuns();
          return;
        }
      }
    }, 1000);
    render();
    connect();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();

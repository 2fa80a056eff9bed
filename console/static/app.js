// chime operator console. Plain DOM: every value from the API is written
// with textContent; the one exception is a notification's detail_html,
// which the server sanitized (console.SanitizeDetail). Event streams are
// read with fetch, not EventSource, so the operator token travels in the
// Authorization header and never in a URL.
//
// The landing page is the fleet: every agent with a record, its state and
// counts, and the questions waiting on an operator. One stream of the
// fleet's changes (/api/fleet/events) keeps every panel current: a change
// of an agent's record updates its row, and reloads the panel of that kind
// when the agent is the one shown. Nothing polls the server.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const TOKEN_KEY = 'chime.operatorToken';
  const ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
  const MAX_DELIVERIES = 200;

  const state = {
    agent: '',
    ctl: null,            // aborts the current view's requests and streams
    notifs: new Map(),    // "agent/id" -> notification
    applied: new Map(),   // agent -> seq of the last change applied
    asOf: 0,              // changes up to this seq were there when the view opened: no toast
    toasts: new Map(),    // "agent/group" or "agent/id" -> toast element
    deliveries: [],
    seenSeq: new Set(),
    waits: null,
    refreshTimer: 0,
    reloads: new Map(),   // panel -> pending reload timer (changes come in bursts)
    fleetCursor: '',      // the fleet list's next page
    queueCursor: '',      // the waiting-on-you queue's next page
    fleetMarked: false,
    tail: null,           // the monitor tailed: {id, ctl, signal, record, deliveries: seq -> delivery}
  };

  // el builds an element; strings among children become text nodes.
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) if (c !== undefined && c !== null && c !== false) e.append(c);
    return e;
  }

  const enc = encodeURIComponent;
  const agentPath = (id) => '/api/agents/' + enc(id);
  const controlPath = (id) => '/api/control/agents/' + enc(id);
  const fmtTime = (s) => (s ? new Date(s).toLocaleString() : '');

  // idNode shows an ID short (its start, the whole in its title) with a
  // button that copies the whole: IDs are long and would wrap over lines.
  function idNode(id) {
    const short = id.length > 12 ? id.slice(0, 10) + '…' : id;
    const b = el('button', { type: 'button', class: 'copy', title: 'Copy ' + id, 'aria-label': 'Copy ID ' + id, text: 'copy' });
    b.addEventListener('click', async () => {
      try { await navigator.clipboard.writeText(id); b.textContent = 'copied'; } catch (e) { b.textContent = 'select it'; }
      setTimeout(() => { b.textContent = 'copy'; }, 1200);
    });
    return el('span', { class: 'id' }, el('code', { text: short, title: id, 'data-full': id }), b);
  }

  // confirmAction asks, in the one confirmation dialog, before a
  // destructive action; it resolves true when confirmed.
  function confirmAction(title, text, label) {
    const d = $('stop-dialog');
    $('stop-title').textContent = title;
    $('stop-text').textContent = text;
    $('stop-confirm').textContent = label;
    d.returnValue = '';
    return new Promise((resolve) => {
      d.addEventListener('close', () => resolve(d.returnValue === 'stop'), { once: true });
      d.showModal();
      $('stop-cancel').focus();
    });
  }

  // place puts a listing's items into its active and finished lists: a
  // page replaces both, a next page (append) adds to them.
  function place(items, activeID, doneID, append) {
    const active = $(activeID), done = $(doneID);
    if (!append) { active.replaceChildren(); done.replaceChildren(); }
    for (const i of items) {
      for (const list of [active, done]) list.querySelector(`[data-id="${CSS.escape(i.dataset.id)}"]`)?.remove();
      (i.dataset.active === '1' ? active : done).append(i);
    }
    const empty = (id) => $(id.replace(/-(list|done)$/, (m, k) => k === 'list' ? '-empty' : '-done-empty'));
    empty(activeID).hidden = active.children.length > 0;
    empty(doneID).hidden = done.children.length > 0;
  }
  const sleep = (ms, signal) => new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
  });

  class APIError extends Error {
    constructor(code, message, status) { super(message); this.code = code; this.status = status; }
    toString() { return (this.code ? this.code + ': ' : '') + this.message; }
  }

  // --- the operator token -------------------------------------------------
  let tokenPrompt = null;
  function authHeaders(h) {
    const t = sessionStorage.getItem(TOKEN_KEY);
    if (t) h.Authorization = 'Bearer ' + t;
    return h;
  }
  // askToken shows the token dialog once for every request that needs it.
  function askToken() {
    if (tokenPrompt) return tokenPrompt;
    const rejected = sessionStorage.getItem(TOKEN_KEY) !== null;
    sessionStorage.removeItem(TOKEN_KEY);
    $('sign-out').hidden = true;
    $('token-error').textContent = rejected ? 'That token was not accepted.' : '';
    tokenPrompt = new Promise((resolve) => {
      const form = $('token-form');
      const submit = (ev) => {
        ev.preventDefault();
        const v = $('token-input').value.trim();
        if (!v) return;
        sessionStorage.setItem(TOKEN_KEY, v);
        $('token-input').value = '';
        $('sign-out').hidden = false;
        form.removeEventListener('submit', submit);
        $('token-dialog').close();
        tokenPrompt = null;
        resolve();
      };
      form.addEventListener('submit', submit);
      $('token-dialog').showModal();
      $('token-input').focus();
    });
    return tokenPrompt;
  }

  async function api(method, path, body, signal) {
    for (;;) {
      const headers = authHeaders({ Accept: 'application/json' });
      if (body !== undefined) headers['Content-Type'] = 'application/json';
      const res = await fetch(path, {
        method, headers, signal, cache: 'no-store',
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (res.status === 401) { await askToken(); continue; }
      const data = await res.json().catch(() => ({}));
      if (!res.ok) throw new APIError(data.error?.code, data.error?.message || res.statusText, res.status);
      return data;
    }
  }

  // follow reads a Server-Sent Events stream with fetch until signal
  // aborts, reconnecting with Last-Event-ID after the last event seen.
  // A last of 0 is sent too: it replays from the start, where no
  // Last-Event-ID would start with the next change.
  async function follow(path, last, onEvent, signal) {
    let delay = 500;
    while (!signal.aborted) {
      try {
        const headers = authHeaders({ Accept: 'text/event-stream' });
        if (last !== undefined && last !== null) headers['Last-Event-ID'] = String(last);
        const res = await fetch(path, { headers, signal, cache: 'no-store' });
        if (res.status === 401) { await askToken(); continue; }
        if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
        setConn(true);
        delay = 500;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let m;
          while ((m = /\r?\n\r?\n/.exec(buf))) {
            const block = buf.slice(0, m.index);
            buf = buf.slice(m.index + m[0].length);
            let id = '', name = 'message', data = [];
            for (const line of block.split(/\r?\n/)) {
              if (line.startsWith(':')) continue;
              const i = line.indexOf(':');
              const field = i < 0 ? line : line.slice(0, i);
              const val = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
              if (field === 'id') id = val;
              else if (field === 'event') name = val;
              else if (field === 'data') data.push(val);
            }
            if (id) last = id;
            if (data.length) {
              try { onEvent(name, JSON.parse(data.join('\n'))); } catch (e) { console.error(e); }
            }
          }
        }
      } catch (e) {
        if (signal.aborted) return;
      }
      setConn(false);
      await sleep(delay, signal);
      delay = Math.min(delay * 2, 10000);
    }
  }

  function setConn(live) {
    const c = $('conn');
    c.textContent = live ? 'live' : 'reconnecting…';
    c.className = 'conn ' + (live ? 'live' : 'down');
  }

  function showResult(id, err, ok) {
    const r = $(id);
    r.textContent = err ? String(err) : ok || '';
    r.className = 'result' + (err ? ' err' : '');
  }

  // --- notifications --------------------------------------------------------
  const nkey = (n) => n.agent_id + '/' + n.id;
  let noteRender = 0;

  function upsertNotif(agentID, n, live) {
    n.agent_id = n.agent_id || agentID;
    state.notifs.set(nkey(n), n);
    if (live && !n.read) toast(n);
    scheduleNotifRender();
  }

  // applyNotifEvent applies one change of the agent's notifications. They
  // come in seq order, so one at or below the last applied (a resume from
  // a replica that lags, a replay of what a history held) is old: applying
  // it would go backwards, or clear and refill the list out of its order.
  // A change made by the page itself has no seq and always applies.
  function applyNotifEvent(agentID, ev) {
    const agent = ev.agent_id || agentID;
    if (ev.seq) {
      if (ev.seq <= (state.applied.get(agent) || 0)) return;
      state.applied.set(agent, ev.seq);
    }
    if (ev.op === 'upsert' && ev.notification) upsertNotif(agent, ev.notification, ev.seq > state.asOf);
    else if (ev.op === 'remove') {
      for (const id of ev.notification_ids || []) state.notifs.delete(agent + '/' + id);
    } else if (ev.op === 'clear') {
      for (const k of [...state.notifs.keys()]) if (k.startsWith(agent + '/')) state.notifs.delete(k);
    }
    scheduleNotifRender();
  }

  function scheduleNotifRender() {
    if (noteRender) return;
    noteRender = requestAnimationFrame(() => { noteRender = 0; renderNotifs(); });
  }

  // renderNotifs shows the history newest first. One agent's is in the
  // order it was received (the history, then new ones): an update keeps
  // its place, as in the history. All agents' are merged by time.
  function renderNotifs() {
    const list = [...state.notifs.values()].reverse();
    if (!state.agent) list.sort((a, b) => (Date.parse(b.timestamp) || 0) - (Date.parse(a.timestamp) || 0));
    let unread = 0, high = 0;
    const items = list.map((n) => {
      if (!n.read) { unread++; if (n.priority >= 20) high++; }
      return notifItem(n);
    });
    $('notif-list').replaceChildren(...items);
    $('notif-empty').hidden = list.length > 0;
    $('unread-count').textContent = unread;
    $('high-count').textContent = high;
    if (!renderNotifs.marked) { renderNotifs.marked = true; performance.mark('chime:notifications'); }
  }

  function detailNode(n) {
    if (!n.detail_html && !n.detail) return null;
    const d = el('div', { class: 'n-detail' });
    // detail_html was sanitized by the server with the console's policy;
    // without it the raw detail is shown as text, never as HTML.
    if (n.detail_html) d.innerHTML = n.detail_html;
    else d.textContent = n.detail;
    return d;
  }

  function notifItem(n) {
    const type = ['info', 'success', 'warning', 'error', 'progress'].includes(n.type) ? n.type : 'info';
    return el('li', { class: `notif t-${type}` + (n.read ? '' : ' unread'), 'data-id': n.id, 'data-agent': n.agent_id },
      el('div', { class: 'n-head' },
        el('span', { class: 'kind', text: type }),
        n.priority >= 20 ? el('span', { class: 'n-prio', text: 'high' }) : null,
        el('span', { class: 'n-title', text: n.title || '' }),
        el('span', { class: 'meta', text: (state.agent ? '' : n.agent_id + ' · ') + fmtTime(n.timestamp) + (n.group ? ' · ' + n.group : '') }),
        n.read ? null : el('button', { type: 'button', class: 'mark-read', text: 'Mark read', onclick: () => markRead(n) })),
      el('p', { class: 'text n-message', text: n.message || '' }),
      detailNode(n));
  }

  // toast shows n for its display_time; one of the same group (or the
  // same id) replaces the one shown.
  function toast(n) {
    const key = n.agent_id + '/' + (n.group ? 'g:' + n.group : 'i:' + n.id);
    state.toasts.get(key)?.remove();
    const high = n.priority >= 20;
    const type = ['info', 'success', 'warning', 'error', 'progress'].includes(n.type) ? n.type : 'info';
    const t = el('div', { class: `toast t-${type}` + (high ? ' high' : ''), role: high ? 'alert' : 'status', 'data-id': n.id },
      el('div', { class: 'body' },
        el('strong', { text: n.title || type }),
        el('p', { class: 'text', text: n.message || '' })),
      el('button', { type: 'button', 'aria-label': 'Dismiss', text: '×', onclick: () => drop() }));
    const drop = () => { t.remove(); if (state.toasts.get(key) === t) state.toasts.delete(key); };
    // high priority first, then newest
    const container = $('toasts');
    if (high) container.prepend(t); else container.append(t);
    state.toasts.set(key, t);
    const secs = Number(n.display_time) > 0 ? Number(n.display_time) : 3;
    setTimeout(drop, secs * 1000);
    while (container.children.length > 5) container.lastElementChild.remove();
  }

  async function markRead(n) {
    try {
      await api('POST', controlPath(n.agent_id) + '/notifications/mark-read', { notification_ids: [n.id] }, state.ctl?.signal);
      n.read = true;
      scheduleNotifRender();
    } catch (e) { flash(e); }
  }

  function agentsWithNotifs(unreadOnly) {
    const ids = new Set();
    for (const n of state.notifs.values()) if (!unreadOnly || !n.read) ids.add(n.agent_id);
    return state.agent ? [state.agent] : [...ids];
  }

  async function markAll() {
    try {
      for (const id of agentsWithNotifs(true)) {
        await api('POST', controlPath(id) + '/notifications/mark-read', { mark_all: true }, state.ctl?.signal);
        for (const n of state.notifs.values()) if (n.agent_id === id) n.read = true;
      }
      scheduleNotifRender();
    } catch (e) { flash(e); }
  }

  async function clearAll() {
    const who = state.agent ? `agent ${state.agent}'s` : "every agent's";
    if (!(await confirmAction('Clear the notifications?', `Clear ${who} notifications? They are removed for good.`, 'Clear'))) return;
    try {
      for (const id of agentsWithNotifs(false)) {
        await api('POST', controlPath(id) + '/notifications/clear', {}, state.ctl?.signal);
        applyNotifEvent(id, { op: 'clear', agent_id: id });
      }
    } catch (e) { flash(e); }
  }

  function flash(e) {
    $('alerts').textContent = String(e);
    toast({ agent_id: '', id: 'error', type: 'error', priority: 20, title: 'Request failed', message: String(e), display_time: 6 });
  }

  // loadNotifications fills the notification center and follows its
  // stream. One agent's starts from its history and follows after the
  // history's seq (0 too: a change between the two is not lost). All
  // agents' is the all-agents stream's own replay from 0, every agent's
  // notifications in seq order, however many agents there are; a history's
  // seq (the bucket's, whichever agent's) says which of them were there
  // before the page, so they do not toast.
  async function loadNotifications(signal) {
    let since = 0;
    if (state.agent) {
      try {
        const res = await api('GET', agentPath(state.agent) + '/notifications', undefined, signal);
        for (const n of res.notifications || []) upsertNotif(state.agent, n, false);
        since = res.seq || 0;
        state.applied.set(state.agent, since); // the history holds every change up to it
      } catch (e) {
        if (signal.aborted) return;
        if (e.status !== 404) flash(e);
      }
      state.asOf = since;
    } else {
      const agents = (await api('GET', '/api/agents', undefined, signal)).agents || [];
      const any = agents.find((a) => a.notifications) || agents[0];
      state.asOf = any ? (await api('GET', agentPath(any.agent_id) + '/notifications', undefined, signal)).seq || 0 : 0;
    }
    scheduleNotifRender();
    const path = state.agent ? agentPath(state.agent) + '/notifications/events' : '/api/notifications/events';
    follow(path, since, (name, ev) => { if (name === 'notification') applyNotifEvent(state.agent, ev); }, signal);
  }

  // --- listings -----------------------------------------------------------------
  // Listings come in pages (next_cursor). paged shows the first page on
  // load and appends the next one on the More button, shown while there
  // is a next page; render(res, append) draws a page.
  // A reload (a change told by the fleet's stream) reads as many as are
  // shown, so pages taken with More stay.
  function paged(path, button, render) {
    let cursor = '', pages = 1;
    const show = (res, append) => {
      cursor = res.next_cursor || '';
      $(button).hidden = !cursor;
      render(res, append);
    };
    $(button).addEventListener('click', async () => {
      try {
        show(await api('GET', path() + '?limit=50&cursor=' + enc(cursor), undefined, state.ctl?.signal), true);
        pages++;
      } catch (e) { console.warn(e); }
    });
    const load = async (signal, fresh) => {
      if (fresh) pages = 1;
      const asked = pages;
      const res = await api('GET', path() + '?limit=' + Math.min(50 * pages, 1000), undefined, signal);
      // A page taken with More while this read ran would be undone by it:
      // read again, as many as are shown now.
      if (pages !== asked) return load(signal);
      show(res, false);
    };
    return load;
  }

  // --- questions --------------------------------------------------------------
  // Every open question is shown: the pages are followed to the end (a
  // page of open questions may hold none and still have a next one).
  async function loadQuestions(signal) {
    const list = [];
    let cursor = '';
    for (let i = 0; i < 100; i++) {
      const res = await api('GET', agentPath(state.agent) + '/questions?limit=1000' + (cursor ? '&cursor=' + enc(cursor) : ''), undefined, signal);
      list.push(...(res.questions || []));
      cursor = res.next_cursor || '';
      if (!cursor) break;
    }
    showQuestions($('q-list'), list, () => { $('q-empty').hidden = $('q-list').children.length > 0; });
  }

  // showQuestions makes box hold list's forms: a form being filled in
  // stays as it is, answered ones go.
  function showQuestions(box, list, changed, withAgent) {
    const keep = new Set(list.map((q) => q.agent_id + '/' + q.id));
    for (const node of [...box.children]) if (!keep.has(node.dataset.agent + '/' + node.dataset.id)) node.remove();
    for (const q of list) {
      if (!box.querySelector(`[data-id="${CSS.escape(q.id)}"][data-agent="${CSS.escape(q.agent_id)}"]`)) box.append(questionForm(q, changed, withAgent));
    }
    changed();
  }

  // questionForm answers q on the page. An item with options shows only
  // them (the answer must be one); an item without, a text box.
  function questionForm(q, changed, withAgent) {
    const picks = [];
    const result = el('p', { class: 'result', role: 'status' });
    const form = el('form', { class: 'question', 'data-id': q.id, 'data-agent': q.agent_id });
    if (withAgent) {
      form.append(el('div', { class: 'q-agent' }, el('button', { type: 'button', class: 'link agent-link', text: q.agent_id, onclick: () => open(q.agent_id) })));
    }
    (q.questions || []).forEach((item, i) => {
      const opts = item.options || [];
      if (opts.length) {
        const pick = { value: '', title: item.title };
        picks.push(pick);
        const buttons = opts.map((o) => el('button', {
          type: 'button', 'aria-pressed': 'false', text: o,
          onclick: (ev) => {
            pick.value = o;
            for (const b of ev.target.parentNode.children) b.setAttribute('aria-pressed', String(b === ev.target));
          },
        }));
        form.append(el('fieldset', {}, el('legend', { text: item.title }),
          el('div', { class: 'options', role: 'group', 'aria-label': 'Options for: ' + item.title }, ...buttons)));
        return;
      }
      const inputID = `q-${q.agent_id}-${q.id}-${i}`;
      const input = el('input', { id: inputID, required: true, autocomplete: 'off' });
      picks.push(input);
      form.append(el('fieldset', {}, el('legend', { text: item.title }),
        el('label', { for: inputID, class: 'sr', text: 'Answer to: ' + item.title }), input));
    });
    form.append(el('button', { type: 'submit', text: 'Answer' }), el('span', { class: 'meta', text: ' asked ' + fmtTime(q.created_at) }), result);
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (picks.some((p) => p.value === '')) {
        result.textContent = 'Pick an option for every question.';
        result.className = 'result err';
        return;
      }
      const answers = picks.map((x) => x.value);
      const body = answers.length === 1 ? { answer: answers[0] } : { answers };
      try {
        await api('POST', controlPath(q.agent_id) + '/questions/' + enc(q.id) + '/answer', body, state.ctl?.signal);
        form.remove();
        changed();
      } catch (e) { result.textContent = String(e); result.className = 'result err'; }
    });
    return form;
  }

  // --- interventions ----------------------------------------------------------
  async function intervene(action) {
    if (action === 'stop' && !(await confirmAction('Stop its turn?',
      `Stop the turn of agent ${state.agent}? Its waits end, and it is told to stop. Its callbacks go on (that is chime agent stop).`, 'Stop turn'))) return;
    const text = $('i-text').value;
    const body = { action };
    if (text.trim() && (action === 'message' || action === 'stop')) body.text = text;
    try {
      await api('POST', controlPath(state.agent) + '/intervention', body, state.ctl?.signal);
      showResult('i-result', null, `${action} sent`);
      if (body.text) $('i-text').value = '';
      refreshSoon();
    } catch (e) { showResult('i-result', e); }
  }

  // --- timers -------------------------------------------------------------
  // Timers in the order of their last change, oldest first, a page at a time.
  // Active ones above, finished ones below.
  const loadTimers = paged(() => agentPath(state.agent) + '/timers', 't-more', (res, append) => {
    const rows = (res.timers || []).map((t) => el('tr', { 'data-id': t.id, 'data-active': t.status === 'active' ? '1' : '0' },
      el('td', {}, idNode(t.id), t.summary ? el('div', { class: 'meta', text: t.summary }) : null),
      el('td', {}, el('span', { text: t.status + (t.repeat && !t.cron ? ' (repeats)' : '') }), t.note ? el('div', { class: 'meta', text: t.note }) : null),
      el('td', { class: 'schedule' }, ...schedule(t)),
      el('td', { text: t.status === 'active' ? fmtTime(t.next_fire_at) : fmtTime(t.last_fired_at) || 'never' }),
      el('td', { text: String(t.fire_count) }),
      el('td', {}, t.status === 'active' ? el('button', { type: 'button', class: 'cancel', text: 'Cancel', onclick: () => cancelTimer(t.id, t.summary) }) : null)));
    place(rows, 't-list', 't-done', append);
  });

  // schedule is how a timer repeats: its cron and zone (and its DST and
  // catch-up policies), its interval, or once.
  function schedule(t) {
    if (t.cron) {
      return [el('code', { text: t.cron }), el('span', { class: 'tz', text: ' ' + (t.tz || 'UTC') }),
        el('div', { class: 'meta', text: `DST ${t.dst_repeated || 'first'}/${t.dst_skipped || 'shift'}, catch-up ${t.catchup || 'one'}` +
          (t.max_fires ? `, ${t.max_fires} fires at most` : '') })];
    }
    if (t.interval_ms) return [el('span', { text: 'every ' + (t.interval_ms / 1000) + ' s' })];
    return [el('span', { text: 'once' })];
  }

  async function createTimer(ev) {
    ev.preventDefault();
    const cron = $('t-cron').value.trim();
    const body = cron ? { cron } : { duration_ms: Math.round(Number($('t-after').value) * 1000) };
    if (cron && $('t-tz').value.trim()) body.tz = $('t-tz').value.trim();
    if (!cron && $('t-every').value) body.interval_ms = Math.round(Number($('t-every').value) * 1000);
    if ($('t-summary').value) body.summary = $('t-summary').value;
    try {
      const t = await api('POST', controlPath(state.agent) + '/timers', body, state.ctl?.signal);
      showResult('t-result', null, 'created ' + t.id);
      refreshSoon();
    } catch (e) { showResult('t-result', e); }
  }

  async function cancelTimer(id, summary) {
    if (!(await confirmAction('Cancel the timer?', `Cancel timer ${id}${summary ? ' (' + summary + ')' : ''}? It will not fire again.`, 'Cancel timer'))) return;
    try {
      await api('POST', controlPath(state.agent) + '/timers/' + enc(id) + '/cancel', {}, state.ctl?.signal);
      showResult('t-result', null, 'cancelled ' + id);
      refreshSoon();
    } catch (e) { showResult('t-result', e); }
  }

  // --- waits ------------------------------------------------------------------
  // remaining is Agent Zero's remaining-time format.
  function remaining(ms) {
    const s = Math.max(0, ms) / 1000;
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return `${d}d ${h}h ${m}m ${Math.floor(s % 60)}s remaining`;
    if (h) return `${h}h ${m}m ${Math.floor(s % 60)}s remaining`;
    if (m) return `${m}m ${(s % 60).toFixed(1)}s remaining`;
    return `${s.toFixed(1)}s remaining`;
  }

  const loadWaits = paged(() => agentPath(state.agent) + '/waits', 'w-more', (res, append) => {
    const items = [];
    for (const w of res.waits || []) {
      items.push(el('li', { 'data-id': w.wait_id, 'data-active': w.status === 'waiting' ? '1' : '0' },
        el('span', { class: 'kind', text: 'wait' }), idNode(w.wait_id), ' ',
        el('span', { text: `${w.mode} · ${w.status}` + (w.paused_at ? ' · paused' : '') }), ' ',
        w.status === 'waiting' ? el('span', { class: 'remaining', 'data-target': w.target_time, 'data-paused': w.paused_at || '' }) : null,
        el('div', { class: 'meta', text: 'until ' + fmtTime(w.target_time) + (w.cancel_text ? ' · ' + w.cancel_text : '') })));
    }
    for (const w of res.wait_for || []) {
      items.push(el('li', { 'data-id': w.wait_id, 'data-active': w.ended_at ? '0' : '1' },
        el('span', { class: 'kind', text: 'wait_for' }), idNode(w.wait_id), ' ',
        el('span', { text: `${w.wake}${w.resource ? ' ' + w.resource : ''} · ${w.status}` }), ' ',
        w.recheck_at && !w.ended_at ? el('span', { class: 'remaining', 'data-target': w.recheck_at, 'data-paused': '' }) : null,
        el('div', { class: 'meta', text: w.reason + (w.end_reason ? ' · ' + w.end_reason : '') })));
    }
    place(items, 'w-list', 'w-done', append);
    tickWaits();
  });

  function tickWaits() {
    const now = Date.now();
    for (const r of document.querySelectorAll('#w-list .remaining')) {
      const target = Date.parse(r.dataset.target);
      const at = r.dataset.paused ? Date.parse(r.dataset.paused) : now;
      r.textContent = remaining(target - at);
    }
  }

  // --- tasks ------------------------------------------------------------------
  const loadTasks = paged(() => agentPath(state.agent) + '/tasks', 'k-more', (res, append) => {
    const items = (res.tasks || []).map((t) => el('li', { 'data-id': t.task_id, 'data-active': !t.status || t.status === 'running' ? '1' : '0' },
      el('span', { class: 'kind', text: t.status || 'registered' }), idNode(t.task_id), ' ',
      el('span', { text: t.title || '' }),
      t.exit_code !== undefined ? el('span', { class: 'meta', text: ` exit ${t.exit_code}` }) : null,
      t.error_message ? el('div', { class: 'meta', text: t.error_message }) : null,
      el('div', {}, el('button', { type: 'button', class: 'output-open', text: 'Output', onclick: () => showOutput(t.task_id) }))));
    place(items, 'k-list', 'k-done', append);
  });

  // --- monitors ---------------------------------------------------------------
  // Their events are in the inbox list below; here, where each stands, and
  // the live tail of the one selected.
  const loadMonitors = paged(() => agentPath(state.agent) + '/monitors', 'm-more', (res, append) => {
    const items = (res.monitors || []).map((m) => el('li', { 'data-id': m.monitor_id, class: state.tail?.id === m.monitor_id ? 'selected' : null },
      el('span', { class: 'kind', text: m.status }), idNode(m.monitor_id), ' ',
      el('span', { class: 'desc', text: m.description }),
      el('div', { class: 'meta', text: `${m.source.type}: ${m.source.value}` }),
      el('div', { class: 'meta counts', text: `${m.events} events, ${m.batches} batches` +
        (m.suppressed ? `, ${m.suppressed} suppressed` : '') + (m.filtered ? `, ${m.filtered} filtered` : '') +
        (m.stop_reason ? ` · stopped: ${m.stop_reason}` + (m.exit_code !== undefined ? ` (exit ${m.exit_code})` : '') : '') }),
      el('div', { class: 'row-actions' },
        el('button', { type: 'button', class: 'tail-open', text: 'Tail', 'aria-controls': 'tail', onclick: () => openTail(m.monitor_id) }),
        m.status === 'running' ? el('button', { type: 'button', class: 'stop', text: 'Stop', onclick: () => stopMonitor(m.monitor_id, m.description) }) : null)));
    if (append) {
      for (const i of items) $('m-list').querySelector(`[data-id="${CSS.escape(i.dataset.id)}"]`)?.remove();
      $('m-list').append(...items);
    } else $('m-list').replaceChildren(...items);
    $('m-empty').hidden = $('m-list').children.length > 0;
  });

  // confirmStop asks whether to stop monitor id.
  function confirmStop(id, description) {
    return confirmAction('Stop the monitor?',
      `Stop monitor ${id}${description ? ' (' + description + ')' : ''}? Its watch ends, and the agent is told it was stopped.`, 'Stop monitor');
  }

  async function stopMonitor(id, description) {
    const result = state.tail?.id === id ? 'tail-result' : 'm-result';
    if (!(await confirmStop(id, description))) return;
    try {
      await api('POST', controlPath(state.agent) + '/monitors/' + enc(id) + '/stop', {}, state.ctl?.signal);
      showResult(result, null, 'stopped ' + id);
      refreshSoon();
    } catch (e) { showResult(result, e); }
  }

  // --- a monitor's live tail ---------------------------------------------------
  // The last MAX_TAIL lines of one monitor, newest at the bottom: first its
  // recent deliveries (the inbox read limited to the monitor's source),
  // then its monitor_event deliveries as the inbox feed brings them. Each
  // delivery is kept once, by stream sequence, so the two may overlap.
  // Lines are the source's text (trust external): written as text only.
  const MAX_TAIL = 200;

  function openTail(id) {
    closeTail();
    const ctl = new AbortController(); // ends with the tail, or with the view
    const signal = AbortSignal.any([state.ctl.signal, ctl.signal]);
    state.tail = { id, ctl, signal, record: null, deliveries: new Map() };
    $('tail').hidden = false;
    $('tail-id').textContent = id;
    $('tail-desc').textContent = '';
    $('tail-lines').replaceChildren();
    $('tail-empty').hidden = false;
    showResult('tail-result', null, '');
    renderTailRecord();
    for (const li of $('m-list').children) li.classList.toggle('selected', li.dataset.id === id);
    const url = new URL(location.href);
    url.searchParams.set('monitor', id);
    history.replaceState(null, '', url);
    loadTailRecord();
    loadTailHistory(id, signal);
    $('tail').scrollIntoView({ block: 'nearest' });
  }

  function closeTail() {
    state.tail?.ctl.abort();
    state.tail = null;
    $('tail').hidden = true;
    for (const li of $('m-list').children) li.classList.remove('selected');
    const url = new URL(location.href);
    if (url.searchParams.has('monitor')) { url.searchParams.delete('monitor'); history.replaceState(null, '', url); }
  }

  async function loadTailHistory(id, signal) {
    try {
      const page = await api('GET', `${agentPath(state.agent)}/inbox?source=${enc('monitor:' + id)}&limit=${MAX_TAIL}`, undefined, signal);
      for (const d of page.deliveries || []) tailDelivery(d, false);
      renderTail(true);
    } catch (e) { if (!signal.aborted) showResult('tail-result', e); }
  }

  async function loadTailRecord() {
    const t = state.tail;
    if (!t) return;
    try {
      t.record = await api('GET', `${agentPath(state.agent)}/monitors/${enc(t.id)}`, undefined, t.signal);
      if (state.tail === t) renderTailRecord();
    } catch (e) { if (!t.signal.aborted) showResult('tail-result', e); }
  }

  // tailDelivery keeps d when it is the tailed monitor's; live, it draws.
  function tailDelivery(d, live) {
    const t = state.tail, env = d.envelope || {};
    if (!t || env.source?.type !== 'monitor' || env.source?.id !== t.id) return;
    if (env.kind !== 'monitor_event' && env.kind !== 'monitor_stopped') return;
    if (t.deliveries.has(d.seq)) return;
    t.deliveries.set(d.seq, d);
    if (t.deliveries.size > MAX_TAIL + 1) { // every event holds a line at least
      const oldest = Math.min(...t.deliveries.keys());
      t.deliveries.delete(oldest);
    }
    if (env.kind === 'monitor_stopped' && t.record) { // until the record says more
      t.record.status = 'stopped';
      t.record.stop_reason = t.record.stop_reason || env.data?.reason;
      renderTailRecord();
    }
    if (live) renderTail(false);
  }

  // renderTail draws the last MAX_TAIL lines; it follows the bottom when
  // the view was there (or on the first fill).
  function renderTail(first) {
    const t = state.tail;
    if (!t) return;
    const box = $('tail-lines');
    const atBottom = first || box.scrollHeight - box.scrollTop - box.clientHeight < 24;
    const rows = [];
    for (const d of [...t.deliveries.values()].sort((a, b) => a.seq - b.seq)) {
      const env = d.envelope, data = env.data || {};
      const when = `batch ${data.seq ?? ''} · ${fmtTime(env.at)}`;
      if (env.kind === 'monitor_stopped') {
        rows.push(el('li', { class: 'ended', title: fmtTime(env.at), text: env.text || 'stopped' }));
        continue;
      }
      for (const line of Array.isArray(data.lines) ? data.lines : []) {
        rows.push(el('li', { class: 'line', title: when, text: String(line) }));
      }
      if (data.suppressed > 0) {
        rows.push(el('li', { class: 'suppressed', title: when,
          text: data.suppressed === 1 ? '1 event suppressed' : `${data.suppressed} events suppressed` }));
      }
      if (!t.record && data.description) $('tail-desc').textContent = data.description;
    }
    box.replaceChildren(...rows.slice(-MAX_TAIL));
    $('tail-empty').hidden = rows.length > 0;
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function renderTailRecord() {
    const m = state.tail?.record;
    $('tail-state').textContent = m ? m.status : '…';
    $('tail-reason').textContent = m?.stop_reason ? `stopped: ${m.stop_reason}` + (m.exit_code !== undefined ? ` (exit ${m.exit_code})` : '') : '';
    if (m) $('tail-desc').textContent = m.description || '';
    for (const k of ['events', 'batches', 'filtered', 'suppressed']) $('tail-' + k).textContent = String(m?.[k] || 0);
    $('tail-stop').hidden = !m || m.status !== 'running';
  }

  async function showOutput(taskID) {
    const pre = $('k-output');
    pre.hidden = false;
    pre.textContent = 'loading…';
    try {
      const parts = [];
      let offset = 0;
      for (let i = 0; i < 64; i++) { // at most 64 reads of the largest chunk
        const r = await api('GET', `${agentPath(state.agent)}/tasks/${enc(taskID)}/output?offset=${offset}`, undefined, state.ctl?.signal);
        const bytes = Uint8Array.from(atob(r.data || ''), (c) => c.charCodeAt(0));
        parts.push(bytes);
        offset = r.offset + bytes.length;
        if (r.eof || bytes.length === 0) break;
      }
      const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
      parts.reduce((at, p) => { all.set(p, at); return at + p.length; }, 0);
      pre.textContent = new TextDecoder().decode(all) || '(no output)';
    } catch (e) { pre.textContent = String(e); }
  }

  // --- inbox ------------------------------------------------------------------
  function deliveryItem(d) {
    const env = d.envelope || {};
    return el('li', { 'data-seq': d.seq, 'data-kind': env.kind },
      el('span', { class: 'kind', text: env.kind }),
      el('span', { class: 'meta', text: `${fmtTime(env.at)} · ${env.trust} · ${env.source?.type || ''} ${env.source?.id || ''}` }),
      env.text ? el('p', { class: 'text', text: env.text }) : null);
  }

  function addDeliveries(list, live) {
    for (const d of list) {
      if (state.seenSeq.has(d.seq)) continue;
      state.seenSeq.add(d.seq);
      state.deliveries.push(d);
    }
    state.deliveries.sort((a, b) => b.seq - a.seq);
    state.deliveries.length = Math.min(state.deliveries.length, MAX_DELIVERIES);
    $('d-list').replaceChildren(...state.deliveries.map(deliveryItem));
    $('d-empty').hidden = state.deliveries.length > 0;
    if (live) refreshSoon(); // a delivery follows a change: a fire, an ending, an answer
  }

  async function loadInbox(signal) {
    const page = await api('GET', agentPath(state.agent) + '/inbox?limit=50', undefined, signal);
    addDeliveries(page.deliveries || [], false);
    follow(agentPath(state.agent) + '/inbox/events', page.last_seq, (name, d) => {
      if (name !== 'delivery') return;
      addDeliveries([d], true);
      tailDelivery(d, true);
    }, signal);
  }

  // --- the agent's panels ---------------------------------------------------
  async function refreshAgent(fresh) {
    const signal = state.ctl.signal;
    await Promise.all([loadQuestions, loadTimers, loadWaits, loadTasks, loadMonitors, loadTailRecord].map(async (load) => {
      try { await load(signal, fresh); } catch (e) { if (!signal.aborted) console.warn(e); }
    }));
  }

  function refreshSoon() {
    clearTimeout(state.refreshTimer);
    state.refreshTimer = setTimeout(() => { if (state.agent) refreshAgent(); }, 150);
  }

  // reloadSoon reloads one panel once a burst of changes has passed.
  function reloadSoon(name, load, delay = 150) {
    if (state.reloads.has(name)) return;
    const ctl = state.ctl;
    state.reloads.set(name, setTimeout(async () => {
      state.reloads.delete(name);
      if (state.ctl !== ctl) return; // the view changed meanwhile
      try { await load(ctl.signal); } catch (e) { if (!ctl.signal.aborted) console.warn(e); }
    }, delay));
  }

  // --- the fleet -----------------------------------------------------------
  // Every agent with a record, by ID, a page at a time, filtered on the
  // server by state and search; rows update in place from the stream.
  const PAGE = 100;

  function fleetFilter() {
    return { state: $('fleet-state').value, q: $('fleet-search').value.trim() };
  }

  function fleetQuery(limit, cursor) {
    const f = fleetFilter(), p = new URLSearchParams({ limit: String(limit) });
    if (f.state) p.set('state', f.state);
    if (f.q) p.set('q', f.q);
    if (cursor) p.set('cursor', cursor);
    return '/api/fleet?' + p;
  }

  function matches(a) {
    const f = fleetFilter();
    return (!f.state || a.state === f.state) && (!f.q || a.agent_id.toLowerCase().includes(f.q.toLowerCase()));
  }

  function fleetRow(a) {
    const num = (n, cls) => el('td', { class: 'num' + (n ? ' some' : '') + (cls ? ' ' + cls : ''), text: String(n) });
    return el('tr', { 'data-id': a.agent_id, 'data-state': a.state, 'data-version': String(a.version) },
      el('td', {}, el('button', { type: 'button', class: 'link agent-link', text: a.agent_id, onclick: () => open(a.agent_id) })),
      el('td', {}, el('span', { class: 'state s-' + a.state, text: a.state })),
      num(a.timers, 'c-timers'), num(a.waits, 'c-waits'), num(a.tasks, 'c-tasks'), num(a.monitors, 'c-monitors'),
      num(a.questions, 'c-questions'), num(a.unread, 'c-unread'));
  }

  function fleetTotals(page) {
    $('fleet-total').textContent = String(page.total);
    for (const st of ['active', 'waiting', 'paused', 'stopped']) $('fleet-n-' + st).textContent = String(page.states?.[st] || 0);
  }

  // loadFleet reads the list again, as many rows as are shown (a page at
  // least), or the next page (more).
  let fleetPages = 0; // pages taken with More, so a reload in flight knows it is stale
  async function loadFleet(signal, more) {
    const shown = $('fleet-list').children.length, asked = fleetPages;
    const limit = more ? PAGE : Math.min(Math.max(PAGE, shown), 500);
    let page;
    try {
      page = await api('GET', fleetQuery(limit, more ? state.fleetCursor : ''), undefined, signal);
    } catch (e) {
      if (!signal.aborted) showResult('fleet-result', e);
      return;
    }
    if (!more && fleetPages !== asked) return loadFleet(signal); // a More came first: read again
    if (more) fleetPages++;
    showResult('fleet-result', null, '');
    state.fleetCursor = page.next_cursor || '';
    const rows = page.agents.map(fleetRow);
    if (more) $('fleet-list').append(...rows); else $('fleet-list').replaceChildren(...rows);
    $('fleet-more').hidden = !state.fleetCursor;
    $('fleet-empty').hidden = $('fleet-list').children.length > 0;
    fleetTotals(page);
    if (!state.fleetMarked) { state.fleetMarked = true; performance.mark('chime:fleet'); }
  }

  async function loadFleetTotals(signal) {
    fleetTotals(await api('GET', '/api/fleet?limit=1', undefined, signal));
  }

  // applyFleetChange folds one change into the row shown; an agent not
  // shown that now matches is placed by reading the list again.
  function applyFleetChange(c) {
    const a = c.agent, row = $('fleet-list').querySelector(`tr[data-id="${CSS.escape(a.agent_id)}"]`);
    if (row && Number(row.dataset.version) >= a.version) return;
    if (row && (c.gone || !matches(a))) row.remove();
    else if (row) {
      const fresh = fleetRow(a);
      fresh.dataset.updatedAt = String(Date.now()); // the live update's latency, for the tests
      row.replaceWith(fresh);
    } else if (!c.gone && matches(a)) {
      // Read the list again only when the agent falls among the rows
      // shown: one beyond them shows when its page is taken.
      const last = $('fleet-list').lastElementChild?.dataset.id;
      if (!state.fleetCursor || !last || a.agent_id < last) reloadSoon('fleet', (signal) => loadFleet(signal), 300);
    }
    reloadSoon('fleet-totals', loadFleetTotals, 300);
  }

  // loadPicker offers the fleet's first agents to the agent picker (every
  // agent with a record, those with only timers too); typing more narrows
  // it on the server.
  async function loadPicker(q) {
    try {
      const p = new URLSearchParams({ limit: '500' });
      if (q) p.set('q', q);
      const page = await api('GET', '/api/fleet?' + p);
      $('agent-list').replaceChildren(...page.agents.map((a) => el('option', { value: a.agent_id, label: a.state })));
    } catch (e) { /* the list only helps typing */ }
  }

  // --- waiting on you ----------------------------------------------------------
  // The open questions of every agent, oldest first, answered in place.
  async function loadQueue(signal, more) {
    const shown = $('queue-list').children.length;
    const limit = more ? 50 : Math.min(Math.max(50, shown), 500);
    const p = new URLSearchParams({ limit: String(limit) });
    if (more && state.queueCursor) p.set('cursor', state.queueCursor);
    const res = await api('GET', '/api/fleet/questions?' + p, undefined, signal);
    state.queueCursor = res.next_cursor || '';
    $('queue-more').hidden = !state.queueCursor;
    $('queue-count').textContent = String(res.total);
    const counted = () => { $('queue-empty').hidden = $('queue-list').children.length > 0; };
    if (more) {
      for (const q of res.questions) $('queue-list').append(questionForm(q, counted, true));
      counted();
    } else showQuestions($('queue-list'), res.questions, counted, true);
  }

  // onFleetEvent follows the fleet's stream. hello starts each connection:
  // the view is read again, as what changed before it (while the page
  // loaded, or the stream was down) is not replayed; so after a reset
  // (the stream's buffer overflowed).
  function onFleetEvent(name, data) {
    if (name === 'hello' || name === 'reset') {
      if (state.agent) refreshAgent();
      else { loadFleet(state.ctl.signal); loadQueue(state.ctl.signal).catch(() => {}); }
      return;
    }
    if (name !== 'change') return;
    if (!state.agent) {
      applyFleetChange(data);
      if (data.kind === 'questions') reloadSoon('queue', loadQueue);
      return;
    }
    if (data.agent.agent_id !== state.agent) return;
    const load = { timers: loadTimers, waits: loadWaits, wait_for: loadWaits, tasks: loadTasks, questions: loadQuestions,
      monitors: (signal) => Promise.all([loadMonitors(signal), loadTailRecord()]) }[data.kind];
    if (load) reloadSoon(data.kind === 'wait_for' ? 'waits' : data.kind, load);
  }

  function open(agent, monitor) {
    state.ctl?.abort();
    state.ctl = new AbortController();
    const signal = state.ctl.signal;
    state.agent = agent;
    state.notifs.clear();
    state.applied.clear();
    state.asOf = 0;
    state.deliveries = [];
    state.seenSeq.clear();
    closeTail();
    renderNotifs.marked = false;
    $('agent-input').value = agent;
    document.body.classList.toggle('all', !agent);
    document.title = agent ? `${agent} · chime console` : 'chime console';
    const url = new URL(location.href);
    if (agent) url.searchParams.set('agent', agent); else url.searchParams.delete('agent');
    history.replaceState(null, '', url);
    for (const id of ['notif-list', 'q-list', 't-list', 't-done', 'w-list', 'w-done', 'k-list', 'k-done', 'm-list', 'd-list', 'fleet-list', 'queue-list']) $(id).replaceChildren();
    for (const t of state.reloads.values()) clearTimeout(t);
    state.reloads.clear();
    $('k-output').hidden = true;
    loadNotifications(signal).catch((e) => { if (!signal.aborted) flash(e); });
    if (!agent) {
      loadFleet(signal);
      loadQueue(signal).catch((e) => { if (!signal.aborted) flash(e); });
    } else {
      refreshAgent(true);
      loadInbox(signal).catch((e) => { if (!signal.aborted) flash(e); });
      if (monitor && ID_RE.test(monitor)) openTail(monitor);
    }
  }

  function init() {
    $('agent-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const v = $('agent-input').value.trim();
      if (v && !ID_RE.test(v)) { $('agent-input').reportValidity(); return; }
      open(v);
    });
    $('all-agents').addEventListener('click', () => open(''));
    $('sign-out').addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); });
    $('sign-out').hidden = !sessionStorage.getItem(TOKEN_KEY);
    $('mark-all').addEventListener('click', markAll);
    $('clear-all').addEventListener('click', clearAll);
    $('t-form').addEventListener('submit', createTimer);
    $('i-form').addEventListener('submit', (ev) => { ev.preventDefault(); intervene('message'); });
    for (const b of document.querySelectorAll('#i-form button[type="button"]')) b.addEventListener('click', () => intervene(b.dataset.action));
    $('token-dialog').addEventListener('cancel', (ev) => ev.preventDefault()); // nothing works without it
    $('tail-stop').addEventListener('click', () => { if (state.tail) stopMonitor(state.tail.id, state.tail.record?.description); });
    $('tail-close').addEventListener('click', closeTail);
    // The remaining time of waits counts down on the page; no request.
    setInterval(tickWaits, 200);
    let typing = 0;
    $('fleet-filter').addEventListener('submit', (ev) => ev.preventDefault());
    let picking = 0;
    $('agent-input').addEventListener('input', () => {
      const v = $('agent-input').value.trim();
      clearTimeout(picking);
      if (/^[A-Za-z0-9_-]{0,64}$/.test(v)) picking = setTimeout(() => loadPicker(v), 250);
    });
    $('fleet-search').addEventListener('input', () => {
      if (!$('fleet-search').checkValidity()) { $('fleet-search').reportValidity(); return; }
      clearTimeout(typing);
      typing = setTimeout(() => loadFleet(state.ctl.signal), 200);
    });
    $('fleet-state').addEventListener('change', () => loadFleet(state.ctl.signal));
    $('fleet-more').addEventListener('click', () => loadFleet(state.ctl.signal, true));
    $('queue-more').addEventListener('click', () => loadQueue(state.ctl.signal, true).catch(flash));
    const params = new URLSearchParams(location.search);
    const agent = params.get('agent') || '';
    open(ID_RE.test(agent) ? agent : '', params.get('monitor') || '');
    loadPicker();
    // One stream for the page's life: every panel's changes.
    follow('/api/fleet/events', undefined, onFleetEvent, new AbortController().signal);
  }

  init();
})();

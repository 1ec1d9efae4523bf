// Fleet: every configured node, live (polled each second): state, load against its
// limit, its devices and their memory, each managed adapter's budget and room, per-target
// availability and footprint, version, heartbeat age, drain; drain (with an optional
// deadline) and resume. Cards are built once per node and updated in place, so a typed
// deadline survives the refresh and nothing jumps.

import { api } from './api.js';
import { bytes, clock, duration, el, poll } from './format.js';

const EVERY_MS = 1000;

const STATE_WORDS = {
  serving: 'serving', draining: 'draining', drained: 'drained',
  disconnected: 'disconnected', breaker_open: 'breaker open',
};

export function mount(page, _route, context) {
  const grid = el('div', { class: 'cards', id: 'nodes' });
  const notice = el('p', { class: 'notice', id: 'fleet-notice', role: 'status' });
  page.append(el('h1', { text: 'Fleet' }), notice, grid);
  const cards = new Map();

  const refresh = async () => {
    const list = await api('/nodes');
    for (const node of list.nodes) {
      if (!cards.has(node.id)) {
        const card = build(node, notice, context);
        cards.set(node.id, card);
        grid.append(card.root);
      }
      update(cards.get(node.id), node, list.now_ms);
    }
    if (list.nodes.length === 0) notice.textContent = 'No node is configured.';
    context.live();
  };
  return poll(refresh, EVERY_MS, context.fail);
}

function fact(facts, label, key) {
  const value = el('dd', { 'data-f': key });
  facts.append(el('dt', { text: label }), value);
  return value;
}

function build(node, notice, context) {
  const state = el('span', { class: 'state', 'data-f': 'state' });
  const facts = el('dl', { class: 'facts' });
  const root = el('article', { class: 'card', 'data-node': node.id },
    el('header', {},
      el('h2', {}, document.createTextNode(`${node.id} `), el('span', { class: 'alias', text: node.alias })),
      state),
    facts);
  const loadText = el('span', { 'data-f': 'load' });
  const bar = el('span');
  const load = fact(facts, 'Load', 'load-row');
  load.append(el('div', { class: 'load' }, loadText, el('div', { class: 'bar', 'aria-hidden': 'true' }, bar)));
  const card = {
    root, state, loadText, bar,
    devices: fact(facts, 'Devices', 'devices'),
    budgets: fact(facts, 'Budgets', 'budgets'),
    version: fact(facts, 'Version', 'version'),
    heartbeat: fact(facts, 'Heartbeat', 'heartbeat'),
    connected: fact(facts, 'Connected', 'connected'),
    drain: fact(facts, 'Drain', 'drain'),
    breaker: fact(facts, 'Breaker', 'breaker'),
    targets: el('ul', { class: 'targets', 'aria-label': 'Targets' }),
  };
  const deadline = el('input', {
    type: 'number', min: '0', step: '1', inputmode: 'numeric', placeholder: 'deadline s',
    'aria-label': `Drain deadline for ${node.id}, in seconds (empty: none)`, 'data-f': 'deadline',
  });
  card.drainButton = el('button', { type: 'button', 'data-action': 'drain', text: 'Drain' });
  card.resumeButton = el('button', { type: 'button', class: 'secondary', 'data-action': 'resume', text: 'Resume' });
  card.drainButton.addEventListener('click', () => act(node.id, 'drain', deadline, card, notice, context));
  card.resumeButton.addEventListener('click', () => act(node.id, 'resume', deadline, card, notice, context));
  root.append(el('h2', { class: 'muted', text: 'Targets' }), card.targets,
    el('div', { class: 'actions' }, deadline, card.drainButton, card.resumeButton));
  return card;
}

async function act(id, action, deadline, card, notice, context) {
  const deadlineText = deadline.value;
  const seconds = deadlineText.trim() === '' ? null : Number(deadlineText);
  if (seconds !== null && !(Number.isInteger(seconds) && seconds >= 0)) {
    notice.textContent = 'The deadline is a whole number of seconds.';
    return;
  }
  const body = action === 'drain' && seconds !== null ? { deadline_seconds: seconds } : undefined;
  try {
    const node = action === 'drain'
      ? await api(`/nodes/${encodeURIComponent(id)}/drain`, { method: 'POST', body })
      : await api(`/nodes/${encodeURIComponent(id)}/resume`, { method: 'POST' });
    update(card, node, Date.now());
    deadline.value = '';
    notice.textContent = action === 'drain'
      ? `${id}: drained${seconds !== null ? `, open runs cancelled in ${seconds} s` : ''}.`
      : `${id}: resumed, takes runs again.`;
  } catch (error) {
    context.fail(error);
  }
}

function update(card, node, nowMs) {
  card.state.className = `state ${node.state}`;
  card.state.textContent = STATE_WORDS[node.state] ?? node.state;
  const max = node.limits.max_concurrent_runs;
  card.loadText.textContent = `${node.active_runs} / ${max} runs`;
  card.bar.style.width = `${max ? Math.min(100, (100 * node.active_runs) / max) : 0}%`;
  card.version.textContent = node.node_version ?? '—';
  card.heartbeat.textContent = node.last_heartbeat_ms == null
    ? 'never (not connected)'
    : `${duration(Math.max(0, nowMs - node.last_heartbeat_ms))} ago (every ${duration(node.limits.heartbeat_interval_ms)})`;
  card.connected.textContent = node.connected_since_ms == null
    ? '—' : `since ${clock(node.connected_since_ms)} from ${node.peer}`;
  card.drain.textContent = !node.drain ? 'not drained'
    : `since ${clock(node.drain.since_ms)}${node.drain.deadline_ms ? `, deadline ${clock(node.drain.deadline_ms)}` : ', no deadline'}`;
  card.breaker.textContent = node.breaker_open ? 'open: new runs kept away' : 'closed';
  const devices = node.inventory?.devices ?? [];
  card.devices.textContent = devices.length === 0 ? 'not reported'
    : devices.map((d) => `${d.index}: ${d.name}, ${bytes(d.used_bytes)} of ${bytes(d.total_bytes)} used`).join('; ');
  const budgets = node.adapters.filter((adapter) => adapter.budget);
  card.budgets.textContent = budgets.length === 0 ? '—'
    : budgets.map((a) => `${a.name}: ${bytes(a.budget.room_bytes)} free of ${bytes(a.budget.bytes)} on ${a.budget.devices.join(',')}`).join('; ');
  const drained = Boolean(node.drain);
  card.resumeButton.disabled = !drained;
  card.targets.replaceChildren(...node.adapters.flatMap((adapter) => adapter.targets.map((target) => {
    const [word, cls] = target.available === true ? ['available', 'yes']
      : target.available === false ? ['unavailable', 'no'] : ['not reported', 'unknown'];
    const size = target.footprint ? el('span', { class: 'muted', 'data-f': 'footprint', text: bytes(target.footprint.bytes) }) : '';
    return el('li', {}, el('span', { class: 'mono', text: `${adapter.name}/${target.name}` }),
      size, el('span', { class: `avail ${cls}`, text: word }));
  })));
}

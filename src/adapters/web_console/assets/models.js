// Models: every model some connected node serves or can load (or is configured with, when
// a [[models]] entry names it), node by node — state, whether the edge manages the node's
// engine, runs in flight, last use, the reason of its last load or unload, a command in
// progress — with Load and Unload where the edge manages the engine (an unload waits up to
// the drain deadline for runs in flight); and the last loads and unloads with their
// reasons, newest first. Polled every 2 seconds from /admin/v1/models and the feed's
// history (/admin/v1/models/events).

import { api, apiLines } from './api.js';
import { clock, duration, el, poll } from './format.js';

const EVERY_MS = 2000;
/** How many of the feed's loads and unloads the page shows. */
const RECENT = 50;

const COLUMNS = ['Model', 'Node', 'State', 'Managed', 'In flight', 'Last use', 'Since', 'Why', 'Command', ''];

/** A `[[models]]` entry in a few words. */
function policy(entry) {
  if (!entry) return 'no [[models]] entry';
  const parts = [`min ${entry.min_loaded} loaded`];
  if (entry.pin.length) parts.push(`pinned on ${entry.pin.join(', ')}`);
  if (entry.idle_unload_ms != null) parts.push(`idle unload after ${duration(entry.idle_unload_ms)}`);
  return parts.join(' · ');
}

function stateText(on) {
  if (on.state === 'loading' && on.progress_percent > 0) return `loading ${on.progress_percent} %`;
  return on.state;
}

function actions(model, on, act) {
  if (!on.managed) return null;
  const busy = on.command != null;
  const load = el('button', { type: 'button', 'data-action': 'load', text: 'Load',
    disabled: busy || ['loaded', 'loading', 'sleeping'].includes(on.state) });
  const unload = el('button', { type: 'button', class: 'secondary', 'data-action': 'unload', text: 'Unload',
    disabled: busy || ['unloaded', 'failed'].includes(on.state) });
  load.addEventListener('click', () => act('load', model.model, on.node));
  unload.addEventListener('click', () => act('unload', model.model, on.node));
  return el('div', { class: 'actions' }, load, unload);
}

function row(model, on, nowMs, act) {
  const cell = (field, text, cls) => el('td', { 'data-f': field, class: cls, text });
  return el('tr', { 'data-model': model.model, 'data-node': on.node, title: policy(model.policy) },
    cell('model', model.model, 'mono'), cell('node', on.node),
    el('td', { 'data-f': 'state' }, el('span', { class: `state ${on.state}`, text: stateText(on) })),
    cell('managed', on.managed ? 'yes' : 'no'),
    cell('in_flight', String(on.in_flight), 'num'),
    cell('last_used', on.last_used_ms == null ? '—' : `${duration(Math.max(0, nowMs - on.last_used_ms))} ago`),
    cell('since', clock(on.since_ms)),
    cell('reason', on.failure ? `${on.reason || '—'}: ${on.failure}` : on.reason || '—', 'mono'),
    cell('command', on.command ?? '—'),
    el('td', {}, actions(model, on, act)));
}

function table(models, act) {
  const nowMs = Date.now();
  const rows = models.flatMap((model) => (model.nodes.length
    ? model.nodes.map((on) => row(model, on, nowMs, act))
    : [el('tr', { 'data-model': model.model }, el('td', { class: 'mono', 'data-f': 'model', text: model.model }),
      el('td', { colspan: String(COLUMNS.length - 1), class: 'muted', text: `on no connected node · ${policy(model.policy)}` }))]));
  const body = rows.length ? rows
    : [el('tr', {}, el('td', { class: 'empty', colspan: String(COLUMNS.length), text: 'No connected node serves or can load a model.' }))];
  return el('table', { id: 'models' },
    el('thead', {}, el('tr', {}, ...COLUMNS.map((h) => el('th', { text: h })))), el('tbody', {}, ...body));
}

function recent(events) {
  const rows = events.slice(-RECENT).reverse().map((e) => el('tr', { 'data-outcome': e.outcome },
    el('td', { text: clock(e.at_ms) }), el('td', { 'data-f': 'action', text: e.action }),
    el('td', { class: 'mono', text: e.model }), el('td', { text: e.node }),
    el('td', { class: 'mono', 'data-f': 'reason', text: e.reason }),
    el('td', { 'data-f': 'outcome' }, el('span', { class: `state ${e.outcome}`, text: e.outcome })),
    el('td', { class: 'num', text: e.took_ms == null ? '—' : duration(e.took_ms) }),
    el('td', { text: e.message || '' })));
  const body = rows.length ? rows
    : [el('tr', {}, el('td', { class: 'empty', colspan: '8', text: 'No load or unload since the edge started.' }))];
  return el('table', { id: 'model-events' },
    el('thead', {}, el('tr', {}, ...['At', 'Action', 'Model', 'Node', 'Why', 'Outcome', 'Took', 'Message']
      .map((h) => el('th', { text: h })))), el('tbody', {}, ...body));
}

export function mount(page, _route, context) {
  const notice = el('p', { class: 'notice', id: 'models-notice', role: 'status' });
  const deadline = el('input', {
    type: 'number', min: '0', step: '1', inputmode: 'numeric', placeholder: 'seconds', id: 'drain-deadline',
    'aria-label': 'Drain deadline for unloads, in seconds (empty: refuse while runs are in flight)',
  });
  const wrap = el('div', { class: 'table-wrap' });
  const history = el('div', { class: 'table-wrap' });
  page.append(el('h1', { text: 'Models' }),
    el('div', { class: 'filters' }, el('label', {}, document.createTextNode('Drain deadline for unloads (s)'), deadline)),
    notice, wrap, el('h2', { text: 'Recent loads and unloads' }), history);

  let refresh = null;
  const act = async (action, model, node) => {
    const text = deadline.value.trim();
    const seconds = text === '' ? null : Number(text);
    if (seconds !== null && !(Number.isInteger(seconds) && seconds >= 0)) {
      notice.textContent = 'The drain deadline is a whole number of seconds.';
      return;
    }
    const body = { model, node };
    if (action === 'unload' && seconds !== null) body.drain_deadline_seconds = seconds;
    notice.textContent = `${action === 'load' ? 'Loading' : 'Unloading'} ${model} on ${node}…`;
    try {
      await (action === 'load'
        ? api('/models/load', { method: 'POST', body })
        : api('/models/unload', { method: 'POST', body }));
      notice.textContent = `${model} ${action === 'load' ? 'loaded on' : 'unloaded from'} ${node}.`;
    } catch (error) {
      notice.textContent = `Cannot ${action} ${model} on ${node}: ${error.message}`;
      if (error.status === 401) context.fail(error);
    }
    if (refresh) await refresh().catch(context.fail);
  };
  refresh = async () => {
    const [list, events] = await Promise.all([api('/models'), apiLines('/models/events?format=jsonl&follow=false')]);
    wrap.replaceChildren(table(list.models, act));
    history.replaceChildren(recent(events));
    context.live();
  };
  return poll(refresh, EVERY_MS, context.fail);
}

// Runs: newest first, open and finished, with the management API's filters (state, node,
// adapter, target, outcome, API key name, time) kept in the URL, a page at a time. The
// first page is live (polled each second); older pages hold still while read.

import { api } from './api.js';
import { clock, duration, el, num, poll } from './format.js';

const EVERY_MS = 1000;
const PAGE = 50;
const FILTERS = ['state', 'outcome', 'node', 'adapter', 'target', 'key', 'since'];

function select(name, label, options, value) {
  const input = el('select', { name });
  for (const [optionValue, text] of options) {
    input.append(el('option', { value: optionValue, text, selected: optionValue === value }));
  }
  return el('label', {}, document.createTextNode(label), input);
}

function text(name, label, value, placeholder) {
  return el('label', {}, document.createTextNode(label),
    el('input', { name, value, placeholder, spellcheck: 'false', autocomplete: 'off' }));
}

function filterForm(params, nodes, context) {
  const value = (name) => params.get(name) ?? '';
  const form = el('form', { class: 'filters', id: 'run-filters' },
    select('state', 'State', [['', 'any'], ['open', 'open'], ['finished', 'finished']], value('state')),
    select('outcome', 'Outcome', [['', 'any'], ['open', 'open'], ['completed', 'completed'],
      ['failed', 'failed'], ['cancelled', 'cancelled'], ['unknown', 'unknown']], value('outcome')),
    select('node', 'Node', [['', 'any'], ...nodes.map((n) => [n.id, `${n.id} (${n.alias})`])], value('node')),
    text('adapter', 'Adapter', value('adapter'), 'any'),
    text('target', 'Target (model)', value('target'), 'any'),
    text('key', 'API key name', value('key'), 'any'),
    select('since', 'Accepted', [['', 'any time'], ['15m', 'last 15 min'], ['1h', 'last hour'],
      ['24h', 'last day'], ['7d', 'last week']], value('since')),
    el('button', { type: 'submit', text: 'Filter' }),
    el('button', { type: 'reset', class: 'secondary', text: 'Clear' }));
  const apply = (data) => {
    const query = new URLSearchParams();
    for (const name of FILTERS) if (data.get(name)) query.set(name, data.get(name));
    const text = query.toString();
    context.go(`#/runs${text ? `?${text}` : ''}`);
  };
  form.addEventListener('submit', (event) => { event.preventDefault(); apply(new FormData(form)); });
  form.addEventListener('reset', (event) => { event.preventDefault(); apply(new FormData()); });
  form.addEventListener('change', (event) => {
    if (event.target.tagName === 'SELECT') apply(new FormData(form));
  });
  return form;
}

function row(run) {
  const link = el('a', { href: `#/runs/${encodeURIComponent(run.id)}`, class: 'mono', text: run.id });
  const ttft = run.first_output_at_ms == null ? null : run.first_output_at_ms - run.queued_at_ms;
  const took = run.finished_at_ms == null ? null : run.finished_at_ms - run.queued_at_ms;
  return el('tr', { 'data-run': run.id },
    el('td', {}, link),
    el('td', {}, el('span', { class: `state ${run.outcome}`, text: run.outcome })),
    el('td', { class: 'mono', text: `${run.adapter}/${run.target}` }),
    el('td', { text: run.node ?? '—' }),
    el('td', { text: run.api_key_name ?? '—' }),
    el('td', { class: 'num', text: clock(run.queued_at_ms) }),
    el('td', { class: 'num', text: duration(ttft) }),
    el('td', { class: 'num', text: duration(took) }),
    el('td', { class: 'num', text: run.usage ? num(run.usage.output_tokens) : '—' }));
}

export function mount(page, { params }, context) {
  const body = el('tbody', { id: 'runs' });
  const heads = ['Run', 'Outcome', 'Adapter/target', 'Node', 'API key', 'Accepted', 'First output', 'Took', 'Tokens out'];
  const table = el('table', {}, el('thead', {}, el('tr', {},
    ...heads.map((h, i) => el('th', { class: i >= 5 ? 'num' : undefined, text: h })))), body);
  const empty = el('p', { class: 'empty', text: 'No run matches.', hidden: true });
  const newer = el('button', { type: 'button', class: 'secondary', text: '← Newest', disabled: true });
  const older = el('button', { type: 'button', class: 'secondary', text: 'Older →', disabled: true });
  const where = el('span', { class: 'muted' });
  const formSlot = el('div');
  page.append(el('h1', { text: 'Runs' }), formSlot,
    el('div', { class: 'table-wrap' }, table, empty), el('div', { class: 'pager' }, newer, older, where));
  api('/nodes').then((list) => formSlot.append(filterForm(params, list.nodes, context)), context.fail);

  const pages = [null]; // the cursor of each page shown so far; null is the newest
  let stop = () => {};
  const load = async () => {
    const cursor = pages[pages.length - 1];
    const query = new URLSearchParams({ limit: String(PAGE) });
    for (const name of FILTERS) if (params.get(name)) query.set(name, params.get(name));
    if (cursor) query.set('cursor', cursor);
    const list = await api(`/runs?${query}`);
    body.replaceChildren(...list.runs.map(row));
    empty.hidden = list.runs.length > 0;
    older.disabled = !list.next_cursor;
    older.dataset.cursor = list.next_cursor ?? '';
    newer.disabled = pages.length === 1;
    where.textContent = pages.length === 1 ? 'Newest first · live' : `Page ${pages.length} · held still`;
    if (pages.length === 1) context.live(); else context.status(`Page ${pages.length}`);
  };
  const show = () => {
    stop();
    stop = pages.length === 1 ? poll(load, EVERY_MS, context.fail) : (load().catch(context.fail), () => {});
  };
  older.addEventListener('click', () => { pages.push(older.dataset.cursor); show(); });
  newer.addEventListener('click', () => { pages.length = 1; show(); });
  show();
  return () => stop();
}

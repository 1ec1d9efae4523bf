// A run: its record (polled while open), attempts and route reasons, its events replayed
// from the journal then followed live until the terminal one, and cancel.

import { api, followEvents } from './api.js';
import { clock, duration, el, num, poll } from './format.js';

const EVERY_MS = 1000;

/** What an event says, in one line. */
function summary(event) {
  switch (event.kind) {
    case 'started': return event.node ? `on ${event.node}${event.reason ? ` (${event.reason})` : ''}` : '';
    case 'output': return event.text || (event.data ? `${event.data.length} base64 chars` : '');
    case 'completed': return [event.finish_reason && `finish: ${event.finish_reason}`,
      event.output_tokens !== undefined && `${event.input_tokens} in / ${event.output_tokens} out tokens`]
      .filter(Boolean).join(' · ');
    case 'failed': return `${event.code}: ${event.message}`;
    case 'cancelled': return event.reason ?? '';
    default: return '';
  }
}

function facts(run) {
  const ttft = run.first_output_at_ms == null ? null : run.first_output_at_ms - run.queued_at_ms;
  const took = run.finished_at_ms == null ? null : run.finished_at_ms - run.queued_at_ms;
  const rows = [
    ['Adapter/target', `${run.adapter}/${run.target}`], ['Operation', run.operation],
    ['Node', run.node ?? '—'], ['Route', run.route_reason ?? '—'], ['Pinned to', run.pin ?? '—'],
    ['API key', run.api_key_name ?? '—'], ['Accepted', clock(run.queued_at_ms)],
    ['First output', ttft === null ? '—' : `${duration(ttft)} after acceptance`],
    ['Ended', run.finished_at_ms == null ? '—' : `${clock(run.finished_at_ms)} (took ${duration(took)})`],
    ['Finish', run.finish_reason ?? '—'], ['Failure', run.code ? `${run.code}: ${run.message ?? ''}` : '—'],
    ['Tokens', run.usage ? `${num(run.usage.input_tokens)} in / ${num(run.usage.output_tokens)} out` : '—'],
    ['Events', `${num(run.events)} relayed, ${num(run.events_stored)} journaled`],
  ];
  const list = el('dl', { class: 'facts', id: 'run-facts' });
  for (const [label, value] of rows) list.append(el('dt', { text: label }), el('dd', { text: value }));
  return list;
}

function attempts(run) {
  const body = el('tbody', {}, ...run.attempts.map((a) => el('tr', {},
    el('td', { class: 'num', text: String(a.number) }), el('td', { text: a.node }),
    el('td', { class: 'mono', text: a.route_reason }), el('td', { class: 'num', text: clock(a.started_at_ms) }))));
  return el('div', { class: 'table-wrap' }, el('table', { id: 'attempts' },
    el('thead', {}, el('tr', {}, ...['#', 'Node', 'Why this node', 'Sent'].map((h) => el('th', { text: h })))), body),
  run.attempts.length ? null : el('p', { class: 'empty', text: 'Not placed on a node yet.' }));
}

export function mount(page, { id }, context) {
  const outcome = el('span', { class: 'state', id: 'run-outcome' });
  const cancel = el('button', { type: 'button', class: 'danger', id: 'cancel', text: 'Cancel run', hidden: true });
  const notice = el('p', { class: 'notice', id: 'run-notice', role: 'status' });
  const record = el('div', { class: 'panel' });
  const tries = el('div');
  const events = el('ol', { class: 'events', id: 'events', 'aria-label': 'Events' });
  const feedState = el('span', { class: 'muted', id: 'feed-state' });
  page.append(el('p', {}, el('a', { href: '#/runs', text: '← Runs' })),
    el('div', { class: 'run-head' }, el('h1', { class: 'mono', text: id }), el('div', { class: 'actions' }, outcome, cancel)),
    notice, record, el('h2', { text: 'Attempts' }), tries,
    el('h2', {}, document.createTextNode('Events '), feedState), events);

  let open = true;
  const refresh = async () => {
    if (!open) return;
    const run = await api(`/runs/${encodeURIComponent(id)}`);
    outcome.className = `state ${run.outcome}`;
    outcome.textContent = run.outcome;
    cancel.hidden = run.outcome !== 'open';
    record.replaceChildren(facts(run));
    tries.replaceChildren(attempts(run));
    open = run.outcome === 'open';
    context.live();
  };
  cancel.addEventListener('click', async () => {
    cancel.disabled = true;
    try {
      await api(`/runs/${encodeURIComponent(id)}`, { method: 'DELETE' });
      notice.textContent = 'Cancel sent: the run ends with its terminal event.';
    } catch (error) {
      notice.textContent = `Cannot cancel: ${error.message}`;
      if (error.status === 401) context.fail(error);
    } finally {
      cancel.disabled = false;
    }
  });

  const aborter = new AbortController();
  let last = null;
  const append = (index, event) => {
    last = index;
    events.append(el('li', { 'data-kind': event.kind, 'data-index': String(index), title: JSON.stringify(event) },
      el('span', { class: 'idx', text: String(index) }), el('span', { class: `state ${event.kind}`, text: event.kind }),
      el('span', { class: 'what', text: summary(event) })));
    events.scrollTop = events.scrollHeight;
  };
  feedState.textContent = '(following…)';
  followEvents(id, last, append, aborter.signal)
    .then(() => { feedState.textContent = '(complete)'; open = true; return refresh(); })
    .catch((error) => {
      if (aborter.signal.aborted) return;
      feedState.textContent = `(${error.message})`;
      context.fail(error);
    });
  const failed = (error) => {
    if (error.status === 404) {
      open = false;
      notice.textContent = `No open or journaled run has the id ${id}.`;
    }
    context.fail(error);
  };
  const stop = poll(refresh, EVERY_MS, failed);
  return () => { aborter.abort(); stop(); };
}

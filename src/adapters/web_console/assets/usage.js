// Usage: what runs consumed, from /admin/v1/usage (the journal's rollups), over a chosen
// period and bucket: a table by key, model, node and/or affinity source with totals, and a bar chart of
// input and output tokens per bucket. One request per refresh (every 10 seconds): the rows
// come split by bucket and group, the table sums them by group, the chart by bucket, so
// both count the same runs. The choices live in the URL.

import { api } from './api.js';
import { el, num, poll, svg } from './format.js';

const EVERY_MS = 10_000;
const W = 600;
const H = 160;
const PAD = { left: 52, right: 8, top: 8, bottom: 18 };

const PERIODS = [['1h', 'last hour'], ['24h', 'last day'], ['7d', 'last 7 days'], ['30d', 'last 30 days']];
/** The buckets each period offers (the first is its default): at most a few hundred. */
const BUCKETS = { '1h': ['minute'], '24h': ['hour', 'minute'], '7d': ['hour', 'day'], '30d': ['day', 'hour'] };
const BUCKET_MS = { minute: 60_000, hour: 3_600_000, day: 86_400_000 };
const DIMENSIONS = [['key', 'Key'], ['model', 'Model'], ['node', 'Node'], ['affinity', 'Affinity']];
const COLUMNS = [
  ['runs', 'Runs'], ['input_tokens', 'Input'], ['cached_input_tokens', 'Cached input'],
  ['output_tokens', 'Output'], ['reasoning_tokens', 'Reasoning'], ['errors', 'Errors'],
];
const BLANK = { key: '(no key)', model: '—', node: '(never placed)', affinity: '(not recorded)' };

/** The page's choices, from the URL, with defaults for what is missing or unknown. */
function choices(params) {
  const since = BUCKETS[params.get('since')] ? params.get('since') : '24h';
  const bucket = BUCKETS[since].includes(params.get('bucket')) ? params.get('bucket') : BUCKETS[since][0];
  const asked = (params.get('by') ?? 'key,model').split(',');
  const by = DIMENSIONS.map(([name]) => name).filter((name) => asked.includes(name));
  return { since, bucket, by };
}

function href({ since, bucket, by }) {
  return `#/usage?${new URLSearchParams({ since, bucket, by: by.join(',') })}`;
}

function form(chosen, context) {
  const period = el('select', { name: 'since', id: 'usage-since' },
    ...PERIODS.map(([value, text]) => el('option', { value, text, selected: value === chosen.since })));
  const bucket = el('select', { name: 'bucket', id: 'usage-bucket' },
    ...BUCKETS[chosen.since].map((value) => el('option', { value, text: value, selected: value === chosen.bucket })));
  const boxes = DIMENSIONS.map(([name, label]) => el('label', { class: 'check' },
    el('input', { type: 'checkbox', name: 'by', value: name, checked: chosen.by.includes(name) }),
    document.createTextNode(label)));
  const root = el('form', { class: 'filters', id: 'usage-filters' },
    el('label', {}, document.createTextNode('Period'), period),
    el('label', {}, document.createTextNode('Bucket'), bucket),
    el('fieldset', { class: 'group-by' }, el('legend', { text: 'Split by' }), ...boxes));
  root.addEventListener('submit', (event) => event.preventDefault());
  root.addEventListener('change', (event) => {
    const data = new FormData(root);
    const since = data.get('since');
    // A new period starts from its own default bucket.
    const next = event.target === period ? BUCKETS[since][0] : data.get('bucket');
    context.go(href({ since, bucket: next, by: data.getAll('by') }));
  });
  return root;
}

function zero() {
  return { runs: 0, errors: 0, input_tokens: 0, cached_input_tokens: 0, output_tokens: 0, reasoning_tokens: 0 };
}

function add(into, row) {
  for (const [field] of COLUMNS) into[field] += row[field] ?? 0;
}

function hitRate(counts) {
  return counts.input_tokens ? `${num((100 * counts.cached_input_tokens) / counts.input_tokens, 1)} %` : '—';
}

/** The report's rows summed by group (the chosen dimensions), most tokens first. */
function byGroup(report, by) {
  const groups = new Map();
  for (const row of report.rows) {
    const id = JSON.stringify(by.map((name) => row[name] ?? null));
    if (!groups.has(id)) groups.set(id, { names: Object.fromEntries(by.map((n) => [n, row[n] ?? null])), counts: zero() });
    add(groups.get(id).counts, row);
  }
  const tokens = (g) => g.counts.input_tokens + g.counts.output_tokens;
  return [...groups.values()].sort((a, b) => tokens(b) - tokens(a));
}

function cells(counts) {
  return [...COLUMNS.map(([field]) => el('td', { class: 'num', 'data-f': field, text: num(counts[field]) })),
    el('td', { class: 'num', 'data-f': 'cache_hit_rate', text: hitRate(counts) })];
}

function table(report, by) {
  const head = el('tr', {}, ...DIMENSIONS.filter(([n]) => by.includes(n)).map(([, label]) => el('th', { text: label })),
    ...COLUMNS.map(([, label]) => el('th', { class: 'num', text: label })),
    el('th', { class: 'num', text: 'Cache hit rate' }));
  const rows = byGroup(report, by).map(({ names, counts }) => {
    const attributes = Object.fromEntries(by.map((n) => [`data-${n}`, names[n] ?? '']));
    return el('tr', attributes, ...by.map((n) => el('td', { class: n === 'key' ? '' : 'mono', text: names[n] ?? BLANK[n] })),
      ...cells(counts));
  });
  const body = rows.length ? rows
    : [el('tr', {}, el('td', { class: 'empty', colspan: String(by.length + COLUMNS.length + 1), text: 'No run ended in this period.' }))];
  const totals = el('tr', { class: 'totals' }, by.length ? el('th', { colspan: String(by.length), text: 'Total' }) : null,
    ...cells(report.totals));
  return el('table', { id: 'usage' }, el('thead', {}, head), el('tbody', {}, ...body), el('tfoot', {}, totals));
}

/** Input and output tokens per bucket over the whole period, oldest first. */
function perBucket(report, size) {
  const count = Math.max(1, Math.ceil((report.until_ms - report.since_ms) / size));
  const slots = Array.from({ length: count }, () => ({ input: 0, output: 0 }));
  for (const row of report.rows) {
    const at = Math.floor((row.start_ms - report.since_ms) / size);
    if (at < 0 || at >= count) continue;
    slots[at].input += row.input_tokens;
    slots[at].output += row.output_tokens;
  }
  return slots;
}

/** A bucket's start, short (`Dec 2, 09:00` in English). */
function start(ms) {
  return new Date(ms).toLocaleString([], { day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit', hour12: false });
}

/** Stacked bars: input tokens (solid) under output tokens (outlined). */
function chart(report, chosen) {
  const slots = perBucket(report, BUCKET_MS[chosen.bucket]);
  const max = Math.max(1, ...slots.map((s) => s.input + s.output));
  const plot = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'plot bars', role: 'img', preserveAspectRatio: 'none',
    'aria-label': `Tokens per ${chosen.bucket}, input and output, ${PERIODS.find(([v]) => v === chosen.since)[1]}` });
  const step = (W - PAD.left - PAD.right) / slots.length;
  const y = (v) => H - PAD.bottom - (v * (H - PAD.top - PAD.bottom)) / max;
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    plot.append(svg('line', { x1: PAD.left, x2: W - PAD.right, y1: at, y2: at, class: 'grid' }));
    const label = svg('text', { x: PAD.left - 4, y: at + 4, 'text-anchor': 'end' });
    label.textContent = num(max * fraction);
    plot.append(label);
  }
  for (const [x, anchor, text] of [[PAD.left, 'start', start(report.since_ms)], [W - PAD.right, 'end', 'now']]) {
    const label = svg('text', { x, y: H - 4, 'text-anchor': anchor });
    label.textContent = text;
    plot.append(label);
  }
  const width = Math.max(0.5, step * 0.8);
  slots.forEach((slot, i) => {
    const x = (PAD.left + i * step + (step - width) / 2).toFixed(1);
    if (slot.input) plot.append(svg('rect', { x, width: width.toFixed(1), y: y(slot.input).toFixed(1),
      height: (y(0) - y(slot.input)).toFixed(1), class: 'b0' }));
    if (slot.output) plot.append(svg('rect', { x, width: width.toFixed(1), y: y(slot.input + slot.output).toFixed(1),
      height: (y(slot.input) - y(slot.input + slot.output)).toFixed(1), class: 'b1' }));
  });
  return el('figure', { class: 'chart', 'data-chart': 'usage-tokens' },
    el('figcaption', {}, el('span', { text: `Tokens per ${chosen.bucket}` }),
      el('span', { class: 'now', text: `${num(report.totals.input_tokens + report.totals.output_tokens)} in all` })),
    plot,
    el('div', { class: 'legend' }, el('span', { class: 'b0', text: 'input' }), el('span', { class: 'b1', text: 'output' })));
}

export function mount(page, { params }, context) {
  const chosen = choices(params);
  const wrap = el('div', { class: 'table-wrap' });
  const figure = el('div', { class: 'usage-chart' });
  page.append(el('h1', { text: 'Usage' }), form(chosen, context),
    el('p', { class: 'muted', text: 'Runs that ended, from the journal\'s usage rollups (UTC buckets). '
      + 'Cache hit rate is cached input over input. Budgets are not shown: the management API does not report them.' }),
    wrap, figure);
  const query = new URLSearchParams({ since: chosen.since, bucket: chosen.bucket });
  if (chosen.by.length) query.set('group_by', chosen.by.join(','));

  const refresh = async () => {
    const report = await api(`/usage?${query}`);
    wrap.replaceChildren(table(report, chosen.by));
    figure.replaceChildren(chart(report, chosen));
    context.live();
  };
  return poll(refresh, EVERY_MS, context.fail);
}

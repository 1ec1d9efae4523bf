// Charts: the last hour from /admin/v1/stats (10-second buckets the edge keeps in
// memory), for the whole edge or one node, drawn as inline SVG. Polled every 5 seconds.

import { api } from './api.js';
import { el, num, poll, svg } from './format.js';

const EVERY_MS = 5000;
const W = 600;
const H = 160;
const PAD = { left: 44, right: 8, top: 8, bottom: 18 };

/** The charts: title, unit, and each series' label and value per bucket. */
const CHARTS = [
  { id: 'requests', title: 'Requests', unit: '/s', digits: 2,
    series: [['started', (p, s) => p.started / s]] },
  { id: 'ttft', title: 'Time to first token', unit: ' ms', digits: 0,
    series: [['p50', (p) => p.ttft_p50_ms], ['p99', (p) => p.ttft_p99_ms]] },
  { id: 'tokens', title: 'Output tokens', unit: '/s', digits: 1,
    series: [['tokens', (p, s) => p.output_tokens / s]] },
  { id: 'errors', title: 'Errors and cancels', unit: ' per 10 s', digits: 0,
    series: [['failed', (p) => p.failed], ['cancelled', (p) => p.cancelled]] },
  { id: 'queue', title: 'Queue depth (peak)', unit: ' runs', digits: 0, edgeOnly: true,
    series: [['waiting', (p) => p.queue_peak]] },
];

/** The window's buckets, oldest first, with `null` where nothing happened. */
function dense(stats, points) {
  const count = Math.round((stats.now_ms - stats.since_ms) / stats.bucket_ms) + 1;
  const slots = new Array(Math.max(1, count)).fill(null);
  for (const point of points) {
    const at = Math.round((point.start_ms - stats.since_ms) / stats.bucket_ms);
    if (at >= 0 && at < slots.length) slots[at] = point;
  }
  return slots;
}

const ZERO = { started: 0, completed: 0, failed: 0, cancelled: 0, output_tokens: 0,
  ttft_p50_ms: null, ttft_p99_ms: null, queue_peak: 0 };

function draw(chart, slots, seconds) {
  const values = chart.series.map(([, read]) => slots.map((p) => read(p ?? ZERO, seconds)));
  const max = Math.max(1, ...values.flat().filter((v) => v !== null && v !== undefined));
  const plot = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'plot', role: 'img', preserveAspectRatio: 'none',
    'aria-label': `${chart.title}, last hour` });
  const x = (i) => PAD.left + (i * (W - PAD.left - PAD.right)) / Math.max(1, slots.length - 1);
  const y = (v) => H - PAD.bottom - (v * (H - PAD.top - PAD.bottom)) / max;
  for (const fraction of [0, 0.5, 1]) {
    const at = y(max * fraction);
    plot.append(svg('line', { x1: PAD.left, x2: W - PAD.right, y1: at, y2: at, class: 'grid' }));
    const label = svg('text', { x: PAD.left - 4, y: at + 4, 'text-anchor': 'end' });
    label.textContent = num(max * fraction, max < 10 ? 1 : 0);
    plot.append(label);
  }
  for (const [at, text] of [[0, '−60 min'], [0.5, '−30 min'], [1, 'now']]) {
    const label = svg('text', { x: x(at * (slots.length - 1)), y: H - 4,
      'text-anchor': at === 0 ? 'start' : at === 1 ? 'end' : 'middle' });
    label.textContent = text;
    plot.append(label);
  }
  values.forEach((series, s) => {
    // A gap (no value) breaks the line instead of drawing a false zero.
    let path = '';
    let pen = false;
    series.forEach((v, i) => {
      if (v === null || v === undefined) { pen = false; return; }
      path += `${pen ? 'L' : 'M'}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    if (path) plot.append(svg('path', { d: path, class: `s${s}` }));
  });
  return { plot, latest: values.map((series) => series.findLast((v) => v !== null && v !== undefined) ?? null) };
}

export function mount(page, { params }, context) {
  const scope = el('select', { id: 'chart-scope', 'aria-label': 'Whose activity' },
    el('option', { value: '', text: 'Whole edge' }));
  const grid = el('div', { class: 'chart-grid', id: 'charts' });
  const note = el('p', { class: 'muted', text: 'The last hour in 10-second buckets, kept in memory by the edge since it started.' });
  page.append(el('h1', { text: 'Charts' }), el('div', { class: 'filters' }, el('label', {}, document.createTextNode('Scope'), scope)), note, grid);
  scope.value = params.get('node') ?? '';
  scope.addEventListener('change', () => context.go(`#/charts${scope.value ? `?node=${encodeURIComponent(scope.value)}` : ''}`));

  const refresh = async () => {
    const [stats, nodes] = await Promise.all([api('/stats'), api('/nodes')]);
    const known = new Set([...scope.options].map((o) => o.value));
    for (const node of nodes.nodes) {
      if (!known.has(node.id)) scope.append(el('option', { value: node.id, text: `Node ${node.id}` }));
    }
    scope.value = params.get('node') ?? '';
    const node = scope.value;
    const points = node ? (stats.nodes.find((n) => n.node === node)?.points ?? []) : stats.edge;
    const slots = dense(stats, points);
    const seconds = stats.bucket_ms / 1000;
    grid.replaceChildren(...CHARTS.filter((c) => !(node && c.edgeOnly)).map((chart) => {
      const { plot, latest } = draw(chart, slots, seconds);
      const now = chart.series.map(([label], i) => `${label} ${latest[i] === null ? '—' : num(latest[i], chart.digits)}`).join(' · ');
      return el('figure', { class: 'chart', 'data-chart': chart.id },
        el('figcaption', {}, el('span', { text: `${chart.title} (${chart.unit.trim()})` }), el('span', { class: 'now', text: now })),
        plot,
        el('div', { class: 'legend' }, ...chart.series.map(([label], i) => el('span', { class: `k${i}`, text: label }))));
    }));
    context.live();
  };
  return poll(refresh, EVERY_MS, context.fail);
}

// Small helpers the pages share: elements (HTML and SVG), times, durations, numbers, live polling.

/** An element with attributes (`text` sets its text, `class` its class) and children. */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'text') node.textContent = value;
    else if (name === 'class') node.className = value;
    else node.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

/** An SVG element with attributes. */
export function svg(tag, attributes = {}) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

/** The local clock time of `ms` since the epoch, `—` without one. */
export function clock(ms) {
  if (ms === null || ms === undefined) return '—';
  const at = new Date(ms);
  const today = new Date().toDateString() === at.toDateString();
  const time = at.toLocaleTimeString([], { hour12: false });
  return today ? time : `${at.toLocaleDateString()} ${time}`;
}

/** A duration in ms for people: `850 ms`, `2.4 s`, `3 min 5 s`, `2 h 10 min`. */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** A number of bytes, short: `512 KiB`, `250.0 MiB`, `1.50 GiB`. */
export function bytes(n) {
  if (n === null || n === undefined) return '—';
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${Math.floor(n / 1024)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(2)} GiB`;
}

/** `n` with at most `digits` decimals. */
export function num(n, digits = 0) {
  if (n === null || n === undefined) return '—';
  return n.toLocaleString([], { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

/** Runs `tick` now and again `every` ms after each one ends, until the returned stop is
 *  called. `tick` errors go to `onError`. */
export function poll(tick, every, onError) {
  let stopped = false;
  let timer = null;
  const run = async () => {
    if (stopped) return;
    try { await tick(); } catch (error) { onError(error); }
    if (!stopped) timer = setTimeout(run, every);
  };
  run();
  return () => { stopped = true; clearTimeout(timer); };
}

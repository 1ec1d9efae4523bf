// The management API as the console calls it: every request goes to /admin/v1 on this
// origin, with the admin key of this tab (sessionStorage) as a bearer token.

const STORAGE = 'edge.adminKey';
const BASE = '/admin/v1';

/** An answer other than 2xx, with the API's error code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function adminKey() {
  return sessionStorage.getItem(STORAGE);
}

export function setAdminKey(key) {
  if (key) sessionStorage.setItem(STORAGE, key);
  else sessionStorage.removeItem(STORAGE);
}

function headers(extra) {
  const all = { Accept: 'application/json', ...extra };
  const key = adminKey();
  if (key) all.Authorization = `Bearer ${key}`;
  return all;
}

async function send(path, options) {
  try {
    return await fetch(BASE + path, { cache: 'no-store', ...options });
  } catch (error) {
    throw new ApiError(0, 'unreachable', `The edge did not answer (${error.message}).`);
  }
}

async function failure(response) {
  const text = await response.text().catch(() => '');
  let detail = null;
  try { detail = JSON.parse(text).error; } catch { /* not the API's shape */ }
  return new ApiError(response.status, detail?.code ?? `http_${response.status}`,
    detail?.message ?? (text || response.statusText));
}

/** `method path` with an optional JSON body; the JSON answer. */
export async function api(path, { method = 'GET', body } = {}) {
  const options = { method, headers: headers() };
  if (body !== undefined) {
    options.headers['Content-Type'] = 'application/json';
    options.body = JSON.stringify(body);
  }
  const response = await send(path, options);
  if (!response.ok) throw await failure(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** `GET path` answered as JSON lines (a feed read without following): its events. */
export async function apiLines(path) {
  const response = await send(path, { headers: headers({ Accept: 'application/jsonl' }) });
  if (!response.ok) throw await failure(response);
  const text = await response.text();
  return text.split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line));
}

/** Calls `onEvent(index, event)` for each of run `id`'s events from `after` on (replayed,
 *  then followed while the run is open); resolves when the feed ends or `signal` aborts. */
export async function followEvents(id, after, onEvent, signal) {
  const query = new URLSearchParams({ format: 'jsonl', follow: 'true' });
  if (after !== null) query.set('after', String(after));
  const path = `/runs/${encodeURIComponent(id)}/events?${query}`;
  const response = await send(path, { headers: headers({ Accept: 'application/jsonl' }), signal });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  let index = after === null ? 0 : after + 1;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (line.trim()) onEvent(index++, JSON.parse(line));
    }
  }
}

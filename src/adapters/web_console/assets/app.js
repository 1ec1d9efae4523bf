// The console's shell: sign-in, navigation between pages (the URL's fragment names the
// page: #/fleet, #/runs?filters, #/runs/<id>, #/charts, #/usage?choices, #/models) and the
// status line.

import { api, ApiError, adminKey, setAdminKey } from './api.js';
import { clock } from './format.js';
import * as fleet from './fleet.js';
import * as runs from './runs.js';
import * as run from './run.js';
import * as charts from './charts.js';
import * as usage from './usage.js';
import * as models from './models.js';

const $ = (selector) => document.querySelector(selector);
let unmount = null;

/** What pages get: a status line, error handling, navigation. */
const context = {
  status(text) { $('#status').textContent = text; },
  live() { context.status(`Live · updated ${clock(Date.now())}`); },
  fail(error) {
    if (error instanceof ApiError && error.status === 401) {
      setAdminKey(null);
      showSignIn('The admin key is no longer accepted: sign in again.');
      return;
    }
    context.status(`Error: ${error.message}`);
  },
  go(hash) { location.hash = hash; },
};

/** The page and parameters the URL's fragment names. */
function route() {
  const [path, query = ''] = location.hash.replace(/^#/, '').split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (parts[0] === 'runs' && parts[1]) return { page: run, name: 'runs', params, id: parts[1] };
  if (parts[0] === 'runs') return { page: runs, name: 'runs', params };
  if (parts[0] === 'charts') return { page: charts, name: 'charts', params };
  if (parts[0] === 'usage') return { page: usage, name: 'usage', params };
  if (parts[0] === 'models') return { page: models, name: 'models', params };
  return { page: fleet, name: 'fleet', params };
}

function render() {
  if (unmount) unmount();
  unmount = null;
  const page = $('#page');
  page.replaceChildren();
  if (!$('#sign-in').hidden) return;
  const { page: module, name, params, id } = route();
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.page === name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  unmount = module.mount(page, { params, id }, context);
}

function showSignIn(message) {
  if (unmount) unmount();
  unmount = null;
  $('#page').replaceChildren();
  $('#nav').hidden = true;
  $('#sign-out').hidden = true;
  $('#access').textContent = '';
  $('#sign-in').hidden = false;
  $('#sign-in-error').textContent = message;
  context.status('Signed out');
  $('#key').focus();
}

function opened() {
  $('#sign-in').hidden = true;
  $('#sign-in-error').textContent = '';
  $('#nav').hidden = false;
  const key = adminKey();
  $('#access').textContent = key ? 'Signed in with an admin key' : 'Open: this edge needs no admin key here';
  $('#sign-out').hidden = !key;
  render();
}

async function signIn(event) {
  event.preventDefault();
  const input = $('#key');
  const key = input.value.trim();
  input.value = '';
  if (!key) return;
  setAdminKey(key);
  $('#sign-in-button').disabled = true;
  try {
    await api('/nodes');
    opened();
  } catch (error) {
    setAdminKey(null);
    const refused = error instanceof ApiError && error.status === 401;
    $('#sign-in-error').textContent = refused
      ? `This admin key was refused (${error.message}).`
      : `Cannot sign in: ${error.message}`;
    input.focus();
  } finally {
    $('#sign-in-button').disabled = false;
  }
}

async function start() {
  $('#sign-in-form').addEventListener('submit', signIn);
  $('#sign-out').addEventListener('click', () => {
    setAdminKey(null);
    showSignIn('Signed out.');
  });
  window.addEventListener('hashchange', render);
  try {
    await api('/nodes');
    opened();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      const had = adminKey();
      setAdminKey(null);
      showSignIn(had ? 'The admin key is no longer accepted: sign in again.' : '');
    } else {
      context.status(`Error: ${error.message}`);
    }
  }
}

start();

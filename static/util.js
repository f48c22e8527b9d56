// util.js — helpers shared by the UI modules: building DOM, calling the API, writing numbers.

// ---- DOM ---------------------------------------------------------------------------------------

/** Build an element. Strings among the children become text nodes, never HTML. */
export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value == null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else if (key === 'testid') node.dataset.testid = value;
    else if (key === 'hidden') node.hidden = Boolean(value);
    else if (key.startsWith('on') && typeof value === 'function') node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child != null && child !== false) node.append(child);
  }
  return node;
}

export const byId = (id) => document.getElementById(id);

// Right-to-left letters and bidi controls (U+202A–U+202E, U+2066–U+2069, marks).
const BIDI = /[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufefc\u061c\u200f\u202a-\u202e\u2066-\u2069\u{10800}-\u{10fff}\u{1e800}-\u{1efff}]/u;

/** Text for a plain-text place (a tooltip, the tab title): isolated (FSI…PDI) when it holds bidi
 * text. An isolate the text opens and never closes is closed before ours (else our PDI closes
 * it, ours stays open and an override in the text reverses what follows); a PDI it holds that
 * closes nothing is dropped (else it would close ours). A PDI also ends every embedding and
 * override begun inside its isolate. */
export const isolate = (text) => {
  if (!BIDI.test(text)) return text;
  let open = 0;
  let kept = '';
  for (const c of text) {
    if (c === '\u2066' || c === '\u2067' || c === '\u2068') open += 1;
    else if (c === '\u2069') {
      if (open === 0) continue;
      open -= 1;
    }
    kept += c;
  }
  return `\u2068${kept}${'\u2069'.repeat(open)}\u2069`;
};

// ---- API ---------------------------------------------------------------------------------------

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

/** Say what went wrong from an error body: a string detail or FastAPI's list of problems. */
function detailText(body, response) {
  const detail = body && body.detail;
  if (typeof detail === 'string') return detail;
  if (Array.isArray(detail)) {
    return detail.map((p) => (p && p.msg ? p.msg : JSON.stringify(p))).join('; ');
  }
  return `The relay answered ${response.status} ${response.statusText}`.trim();
}

/** Send this tab to the login form; from a conversation's page, back to it after. */
export function toLogin() {
  const here = location.pathname;
  // "ended": the login form says the session ended (this tab was logged in).
  location.assign(/^\/c\/[1-9][0-9]*$/.test(here) ? `/login?ended=1&next=${here}` : '/login?ended=1');
}

/** Call the relay's API (same origin, cookie auth); answers {status, data}, throws ApiError.
 * body is sent as JSON; a Blob (a file) is sent as its own bytes, with its type. */
export async function api(path, { method = 'GET', body } = {}) {
  const init = { method, headers: { Accept: 'application/json' } };
  if (body instanceof Blob) {
    init.headers['Content-Type'] = body.type || 'application/octet-stream';
    init.body = body;
  } else if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, 'The relay cannot be reached. Check the connection and try again.');
  }
  if (response.status === 401) {
    toLogin();
    throw new ApiError(401, 'You are logged out.');
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) throw new ApiError(response.status, detailText(data, response));
  return { status: response.status, data };
}

// ---- numbers -----------------------------------------------------------------------------------

const withTenths = (tenths, unit) =>
  tenths % 10 === 0 ? `${tenths / 10}${unit}` : `${Math.floor(tenths / 10)}.${tenths % 10}${unit}`;

/** Write a token count as the server does: "999", "2.5k", "3k", "150k", "1M", "1.2M"; "—" if unknown. */
export function fmtTokens(n) {
  if (n == null || !Number.isFinite(Number(n))) return '—';
  const count = Math.max(0, Math.round(Number(n)));
  if (count < 1000) return String(count);
  // Rounds half up and moves to the next range when rounding reaches it (never "10.0k" or "1000k").
  const tenthsOfK = Math.floor((count + 50) / 100);
  if (tenthsOfK < 100) return withTenths(tenthsOfK, 'k');
  const thousands = Math.floor((count + 500) / 1000);
  if (thousands < 1000) return `${thousands}k`;
  return withTenths(Math.floor((count + 50000) / 100000), 'M');
}

/** Write an exact count with thousands separators: 150046 → "150,046". */
export const fmtExact = (n) => Number(n).toLocaleString('en-US');

/** The cost and duration of a turn: "$0.0126 · 0.3 s". */
export function fmtResult(result) {
  if (!result) return '';
  const parts = [];
  if (result.cost_usd != null) parts.push(`$${Number(result.cost_usd).toFixed(4)}`);
  if (result.duration_ms != null) parts.push(`${(Number(result.duration_ms) / 1000).toFixed(1)} s`);
  return parts.join(' · ');
}

export const isBusy = (turn) => Boolean(turn) && (turn.state === 'running' || turn.state === 'compacting');

// compaction.js — what each compaction did: a compaction line (or the SDK engine's row) opens
// to its details: tokens before and after, how long it took, the backup written just before
// it, and the agent's own summary. Everything the agent wrote is set as text, never as HTML.
import { h, fmtExact } from './util.js';

const count = (n) => (Number.isFinite(n) ? fmtExact(n) : '—');

/** "0.4 s", "12.3 s", "2 min 5 s"; "—" when unknown. */
export function fmtDuration(ms) {
  if (!Number.isFinite(ms)) return '—';
  const seconds = ms / 1000;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const whole = Math.round(seconds);
  return `${Math.floor(whole / 60)} min ${whole % 60} s`;
}

function fact(term, value, testid) {
  return [h('dt', { text: term }), h('dd', { testid, text: value })];
}

function panel(entry, id) {
  const data = entry.data || {};
  const running = entry.state === 'running';
  const facts = [
    ...fact('Tokens before', count(data.pre_tokens), 'compaction-before'),
    ...fact('Tokens after', count(data.post_tokens), 'compaction-after'),
  ];
  if (Number.isFinite(data.messages_removed) || Number.isFinite(data.tokens_removed)) {
    facts.push(...fact('Removed', `${count(data.messages_removed)} messages, ${count(data.tokens_removed)} tokens`, 'compaction-removed'));
  }
  facts.push(...fact('Took', running ? 'still running…' : fmtDuration(data.duration_ms), 'compaction-took'));
  const name = typeof data.backup === 'string' ? data.backup : null;
  facts.push(h('dt', { text: 'Backup before it' }), h('dd', { testid: 'compaction-details-backup' },
    name ? h('a', { href: '#', 'data-backup': name, text: name }) : running ? 'being written…' : '—'));
  const summary = typeof data.summary === 'string' && data.summary
    ? h('pre', { class: 'compaction-summary', testid: 'compaction-summary', dir: 'auto', tabindex: '0', text: data.summary })
    : h('p', { class: 'compaction-none', testid: 'compaction-summary-none', text: running ? 'Not written yet.' : 'The agent reported no summary.' });
  return h('div', { class: 'compaction-details', id, testid: 'compaction-details', role: 'region', 'aria-label': 'What this compaction did' },
    h('dl', { class: 'compaction-facts' }, facts),
    h('div', { class: 'compaction-summary-title', text: "The agent's summary" }),
    summary);
}

/** Make a compaction's text (a button) open its details below row; returns the entry's element.
 *  A redrawn entry (new numbers, its backup, its summary) keeps the fold as the user left it. */
export function withDetails(row, toggle, entry, old) {
  const id = `compaction-details-${entry.id}`;
  const details = panel(entry, id);
  const open = Boolean(old && old.querySelector('.compaction-details:not([hidden])'));
  details.hidden = !open;
  toggle.setAttribute('aria-expanded', String(open));
  toggle.setAttribute('aria-controls', id);
  toggle.addEventListener('click', () => {
    details.hidden = !details.hidden;
    toggle.setAttribute('aria-expanded', String(!details.hidden));
  });
  return h('div', { class: 'compaction-entry' }, row, details);
}

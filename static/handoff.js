// handoff.js — the context watch and the handoff (SPEC §7): the 🧠 button's amber and red, the
// bar above the input, the /clear confirmation, the handoff in the 🧠 modal, and the timeline's
// "Handoff saved" card and "Context note sent to the agent" line.
import { h, api, byId, fmtTokens } from './util.js';

const NO_HANDOFF = 'No handoff was saved; the new conversation starts empty.';

/** The thresholds the page was served with (OARLOCK_CONTEXT_SOFT / _HARD). */
export function thresholds() {
  const soft = Number(document.body.dataset.contextSoft) || 300000;
  const hard = Number(document.body.dataset.contextHard) || 500000;
  return { soft, hard };
}

/** 'hard', 'soft' or null for a context of `used` tokens. */
export function watchLevel(used, { soft, hard } = thresholds()) {
  if (used == null) return null;
  if (used >= hard) return 'hard';
  if (used >= soft) return 'soft';
  return null;
}

/** A handoff as the text the next conversation gets (without its header line). */
export function handoffText(handoff) {
  return `Done: ${handoff.done}\nNext: ${handoff.next}\nFiles: ${handoff.files.join(', ')}`;
}

/** The banner over a new conversation's carry-over: a /clear handoff, a backup or a /compact summary. */
export function pendingLabel(pending) {
  if (pending && pending.startsWith('[Handoff from the previous session]\n')) {
    return 'The handoff of the previous session will be sent with your first message.';
  }
  if (pending && pending.startsWith('[Carry-over context from backup ')) { // a fresh start (§6)
    return 'The backup of the previous conversation will be sent with your first message.';
  }
  return 'A carry-over summary of the previous conversation will be sent with your first message.';
}

/** Colour the 🧠 button and show the bar above the input for an active conversation. */
export function renderWatch(conv, archived) {
  const level = archived ? null : watchLevel(conv.context_tokens);
  const button = byId('context-button');
  if (level) button.dataset.watch = level;
  else delete button.dataset.watch;
  const bar = byId('watch-bar');
  bar.hidden = !level;
  if (level) {
    bar.dataset.level = level;
    byId('watch-text').textContent = `Context at ${fmtTokens(conv.context_tokens)} tokens: a fresh start is recommended.`;
  }
}

/** A user-bubble renderer that adds "Context note sent to the agent" under a bubble whose
 * delivery carried the note (the note itself is the line's tooltip). */
export function withContextNote(render) {
  return (entry, ...rest) => {
    const el = render(entry, ...rest);
    const note = entry.data && entry.data.context_note;
    if (note) el.append(h('div', { class: 'context-note', testid: 'context-note', title: note, text: 'Context note sent to the agent' }));
    return el;
  };
}

/** The timeline card of a handoff the agent saved. */
export function handoffCard(entry) {
  const data = entry.data || {};
  const files = Array.isArray(data.files) ? data.files : [];
  const row = (label, value) => h('div', { class: 'handoff-row' },
    h('span', { class: 'handoff-label', text: label }), h('span', { class: 'handoff-value', dir: 'auto', text: value }));
  return h('div', { class: 'activity handoff-card', testid: 'handoff-card' },
    h('div', { class: 'handoff-title', text: entry.text || 'Handoff saved' }),
    row('Done', String(data.done || '')),
    row('Next', String(data.next || '')),
    row('Files', files.join(', ')));
}

/** The /clear confirmation: says what the new conversation will carry, then runs onConfirm. */
export class ClearDialog {
  constructor(dialogs, onConfirm) {
    this.dialogs = dialogs;
    this.dialog = byId('clear-dialog');
    this.convId = null;
    dialogs.register(this.dialog);
    byId('clear-cancel').addEventListener('click', () => dialogs.close(this.dialog));
    byId('clear-confirm').addEventListener('click', () => {
      dialogs.close(this.dialog);
      onConfirm(this.convId);
    });
  }

  async open(convId) {
    this.convId = convId;
    const status = byId('clear-status');
    const text = byId('clear-handoff');
    status.textContent = 'Loading the latest handoff…';
    status.hidden = false;
    text.hidden = true;
    this.dialogs.open(this.dialog, byId('clear-confirm'));
    try {
      const { data } = await api(`/api/conversations/${convId}/handoff`);
      if (this.convId !== convId) return;
      if (data.handoff) {
        status.hidden = true;
        text.textContent = handoffText(data.handoff);
        text.hidden = false;
      } else {
        status.textContent = NO_HANDOFF;
      }
    } catch (err) {
      if (this.convId === convId) status.textContent = err.message;
    }
  }
}

/** The handoff part of the 🧠 modal: the project's latest one, written or edited in place. */
export class HandoffSection {
  constructor() {
    this.convId = null;
    this.handoff = null;
    this.readOnly = false;
    // What is typed in the form and not saved, per conversation: closing the modal keeps it,
    // and the form opens with it again (Cancel or Save lets it go).
    this.drafts = new Map();
    byId('handoff-edit').addEventListener('click', () => this.edit());
    byId('handoff-cancel').addEventListener('click', () => {
      this.drafts.delete(this.convId);
      this.shown();
    });
    for (const id of ['handoff-done', 'handoff-next', 'handoff-files']) {
      byId(id).addEventListener('input', () => this.drafts.set(this.convId, this.typed()));
    }
    byId('handoff-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.save();
    });
  }

  async load(convId, { readOnly = false } = {}) {
    this.convId = convId;
    this.readOnly = readOnly;
    this.handoff = null;
    byId('handoff-form').hidden = true;
    byId('handoff-edit').hidden = true;
    byId('handoff-empty').hidden = true;
    byId('handoff-text').hidden = true;
    byId('handoff-meta').textContent = 'Loading…';
    try {
      const { data } = await api(`/api/conversations/${convId}/handoff`);
      if (this.convId !== convId) return;
      this.handoff = data.handoff;
      this.show();
      const draft = this.drafts.get(convId);
      if (draft && !readOnly) this.edit(draft);
    } catch (err) {
      if (this.convId === convId) byId('handoff-meta').textContent = err.message;
    }
  }

  /** The form's fields as typed. */
  typed() {
    return { done: byId('handoff-done').value, next: byId('handoff-next').value, files: byId('handoff-files').value };
  }

  show() {
    const handoff = this.handoff;
    byId('handoff-form').hidden = true;
    byId('handoff-empty').hidden = Boolean(handoff);
    byId('handoff-text').hidden = !handoff;
    byId('handoff-text').textContent = handoff ? handoffText(handoff) : '';
    const when = handoff ? new Date(handoff.created_at).toLocaleString() : '';
    const by = handoff && handoff.source === 'user' ? 'written by you' : 'saved by the agent';
    byId('handoff-meta').textContent = handoff ? `${by} · ${when}` : '';
    const edit = byId('handoff-edit');
    edit.hidden = this.readOnly;
    edit.textContent = handoff ? 'Edit' : 'Write a handoff';
  }

  /** Back from the form (saved or cancelled): the focus goes to Edit, not to the page's body
   *  (the form it was in is hidden). */
  shown() {
    this.show();
    byId('handoff-edit').focus();
  }

  /** The agent saved a handoff while the modal is open (and not being edited): show it. */
  onEntry(convId, entry) {
    const saved = entry.data && entry.data.type === 'handoff';
    if (saved && convId === this.convId && byId('context-modal').open && byId('handoff-form').hidden) {
      this.load(convId, { readOnly: this.readOnly });
    }
  }

  /** Open the form with the handoff shown, or (draft) with what was typed and not saved. */
  edit(draft = null) {
    const handoff = this.handoff || { done: '', next: '', files: [] };
    const shown = draft || { ...handoff, files: handoff.files.join('\n') };
    byId('handoff-done').value = shown.done;
    byId('handoff-next').value = shown.next;
    byId('handoff-files').value = shown.files;
    byId('handoff-error').hidden = true;
    byId('handoff-form').hidden = false;
    byId('handoff-edit').hidden = true;
    byId('handoff-done').focus();
  }

  async save() {
    const convId = this.convId;
    const typed = this.typed();
    const files = typed.files.split('\n').map((f) => f.trim()).filter(Boolean);
    const body = { done: typed.done, next: typed.next, files };
    const button = byId('handoff-save');
    button.disabled = true;
    try {
      const { data } = await api(`/api/conversations/${convId}/handoff`, { method: 'PUT', body });
      this.drafts.delete(convId);
      if (this.convId !== convId) return;
      this.handoff = data.handoff;
      this.shown();
    } catch (err) {
      const error = byId('handoff-error');
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  }
}

// steer.js — steering a compaction (SPEC §8): the /compact preview with its editable
// carry-over and left-out list, the pinned messages, and the record of what a compaction
// carried and left out (shown in the old conversation and in the new one).
import { h, api, byId } from './util.js';

const LIMIT = 3500; // the carry-over's characters (code points), as the server cuts it
const ROLE = { user: 'You', agent: 'Agent' };
const codePoints = (text) => [...text].length;

/** One message as one line: "You: …" / "Agent: …" (text only). */
function lineItem(message, testid) {
  return h('li', { class: 'line-item', testid },
    h('span', { class: 'line-role', text: `${ROLE[message.role] || message.role}: ` }),
    h('span', { class: 'line-text', dir: 'auto', text: message.line || '(no text)' }));
}

// ---- pins ----------------------------------------------------------------------------------------

/** The conversation's pins: the strip above the timeline, and the pin buttons of its messages. */
export class Pins {
  /** hooks: changed(ids Set, editable) when the timeline's buttons must follow. */
  constructor(hooks) {
    this.hooks = hooks;
    this.box = byId('pins');
    this.list = byId('pins-list');
    this.convId = null;
    this.pins = [];
    this.editable = false;
    this.loading = 0;
  }

  /** A conversation opened: show its pins (read-only when archived). */
  async load(convId, editable) {
    const same = this.convId === convId;
    this.convId = convId;
    this.editable = editable;
    this.set(convId, same ? this.pins : []); // the same conversation's pins stay until the answer
    const ticket = ++this.loading;
    try {
      const { data } = await api(`/api/conversations/${convId}/pins`);
      if (ticket === this.loading && this.convId === convId) this.set(convId, data.pins || []);
    } catch (_err) { /* the strip stays empty; the next event or open tries again */ }
  }

  /** The pins changed (an answer or another tab's event). */
  set(convId, pins) {
    if (convId !== this.convId) return;
    this.pins = pins;
    const focused = document.activeElement;
    const at = focused && this.list.contains(focused) ? [...this.list.querySelectorAll('button')].indexOf(focused) : -1;
    const entryId = at >= 0 ? focused.closest('li')?.dataset.entryId : null;
    this.list.replaceChildren(...pins.map((pin) => {
      const item = lineItem(pin, 'pin');
      item.dataset.entryId = pin.entry_id;
      if (this.editable) {
        item.append(' ', h('button', {
          type: 'button', class: 'link-btn', testid: 'unpin', text: 'Unpin',
          'aria-label': `Unpin: ${pin.line}`, onclick: () => this.toggle(pin.entry_id, false),
        }));
      }
      return item;
    }));
    this.box.hidden = pins.length === 0;
    this.hooks.changed(new Set(pins.map((pin) => pin.entry_id)), this.editable);
    if (at >= 0 && !focused.isConnected) {
      // The strip was drawn again under the keyboard's focus (an Unpin): the next Unpin, else the
      // message's own Pin button, else the composer (the focus fell to the page).
      const buttons = this.list.querySelectorAll('button');
      const next = buttons[Math.min(at, buttons.length - 1)]
        || document.querySelector(`.entry[data-entry-id="${entryId}"] .pin-btn`) || byId('message-input');
      next.focus({ preventScroll: true });
    }
  }

  /** Say in a dialog that the pins go along (/clear); hidden when there are none. */
  describe(el) {
    const count = this.pins.length;
    el.textContent = count === 1 ? 'The pinned message is carried too.' : `The ${count} pinned messages are carried too.`;
    el.hidden = count === 0;
  }

  async toggle(entryId, on) {
    const convId = this.convId;
    try {
      const { data } = await api(`/api/conversations/${convId}/pins/${entryId}`, { method: on ? 'PUT' : 'DELETE' });
      this.set(convId, data.pins || []);
    } catch (err) {
      this.hooks.error(err.message);
    }
  }
}

// ---- the record of a compaction ------------------------------------------------------------------

const KIND = { compact: '/compact', clear: '/clear', backup: 'a fresh start from a backup' };
// What a carry-over holds besides pins and chosen messages (app/steer.py's Plan.source).
const SOURCES = { handoff: 'the latest handoff', backup: 'the backup', earlier: 'the earlier carry-over' };

/** Fill a <details> with what a compaction carried and left out. */
function renderRecord(details, record, title) {
  const carried = record.carried || [];
  const pins = record.pins || [];
  const leftOut = record.left_out || {};
  const parts = [];
  if (record.edited) parts.push('the edited carry-over');
  else if (pins.length) parts.push(`${pins.length} pinned`);
  if (carried.length) parts.push(`${carried.length} message${carried.length === 1 ? '' : 's'}`);
  if (!record.edited && SOURCES[record.source]) parts.push(SOURCES[record.source]);
  const what = parts.length ? parts.join(', ') : record.summary == null ? 'nothing' : 'the carry-over';
  details.replaceChildren(
    h('summary', { testid: 'carry-summary', text: `${title}: ${what}. ${leftOut.text || ''}` }),
    h('p', { class: 'muted', text: `Made by ${KIND[record.kind] || record.kind}.` }),
    pins.length ? h('p', { class: 'record-head', text: 'Pinned' }) : null,
    pins.length ? h('ol', { class: 'line-list' }, ...pins.map((pin) => lineItem(pin, 'record-pin'))) : null,
    carried.length ? h('p', { class: 'record-head', text: 'Carried' }) : null,
    carried.length ? h('ol', { class: 'line-list' }, ...carried.map((m) => lineItem(m, 'record-carried'))) : null,
    (leftOut.newest || []).length ? h('p', { class: 'record-head', text: 'Left out (newest)' }) : null,
    (leftOut.newest || []).length ? h('ol', { class: 'line-list' }, ...leftOut.newest.map((m) => lineItem(m, 'record-left-out'))) : null,
    record.summary != null ? h('p', { class: 'record-head', text: record.edited ? 'The carry-over (edited)' : 'The carry-over' }) : null,
    record.summary != null ? h('pre', { class: 'pending-text', testid: 'record-text', dir: 'auto', text: record.summary }) : null);
  details.hidden = false;
}

/** The records of the compaction that made the open conversation and of the one that ended it. */
export class CarryRecords {
  constructor() {
    this.from = byId('carry-from');
    this.into = byId('carry-into');
    this.edited = byId('carry-edited');
    this.key = '';
  }

  /** Show the open conversation's records (fetched again only when its links changed). */
  async show(conv) {
    const key = `${conv.id}:${conv.compacted_from_id}:${conv.compacted_into_id}`;
    if (key === this.key) return;
    this.key = key;
    for (const el of [this.from, this.into, this.edited]) el.hidden = true;
    if (conv.compacted_from_id == null && conv.compacted_into_id == null) return;
    try {
      const { data } = await api(`/api/conversations/${conv.id}/carry`);
      if (this.key !== key) return;
      if (data.from) {
        renderRecord(this.from, data.from, 'Carried here');
        this.edited.hidden = !data.from.edited;
      }
      if (data.into) renderRecord(this.into, data.into, 'Carried on');
    } catch (_err) {
      this.key = ''; // try again on the next render
    }
  }
}

// ---- the /compact confirmation's preview ---------------------------------------------------------

export class CompactPreview {
  /** hooks: compacted(conversation), error(message) */
  constructor(dialogs, hooks) {
    this.dialogs = dialogs;
    this.hooks = hooks;
    this.dialog = byId('compact-dialog');
    this.autoFocused = null; // where the dialog put the focus while Compact was disabled
    this.text = byId('compact-carry');
    this.count = byId('compact-count');
    this.editedBadge = byId('compact-edited');
    this.reset = byId('compact-reset');
    this.leftOut = byId('compact-left-out');
    this.leftOutText = byId('compact-left-out-text');
    this.leftOutList = byId('compact-left-out-list');
    this.older = byId('compact-older');
    this.error = byId('compact-error');
    this.confirm = byId('compact-confirm');
    this.convId = null;
    this.preview = null;
    this.confirming = false;
    this.olderBefore = null;
    this.text.addEventListener('input', () => this.showEdited());
    this.reset.addEventListener('click', () => {
      this.text.value = this.preview ? this.preview.summary : '';
      this.showEdited();
      this.text.focus();
    });
    this.older.addEventListener('click', () => this.loadOlder());
    byId('compact-cancel').addEventListener('click', () => this.dialogs.close(this.dialog));
    this.confirm.addEventListener('click', () => this.submit());
  }

  isOpenFor(convId) {
    return this.dialog.open && this.convId === convId;
  }

  /** Ask: load the preview of what /compact would carry now. */
  async open(convId) {
    this.convId = convId;
    this.preview = null;
    this.confirming = false;
    this.error.hidden = true;
    this.text.value = '';
    this.text.disabled = true;
    this.confirm.disabled = true;
    this.leftOutText.textContent = 'Loading the preview…';
    this.leftOutList.replaceChildren();
    this.older.hidden = true;
    this.leftOut.open = false;
    this.showEdited();
    this.dialogs.open(this.dialog, this.confirm);
    // Compact is disabled until the preview comes: the dialog put the focus elsewhere (the
    // left-out fold, where Enter unfolds instead of confirming).
    this.autoFocused = document.activeElement;
    await this.load(true);
  }

  async load(fresh) {
    const convId = this.convId;
    try {
      const { data } = await api(`/api/conversations/${convId}/compact`);
      if (!this.isOpenFor(convId)) return;
      const edited = !fresh && this.isEdited();
      this.preview = data;
      if (!edited) this.text.value = data.summary || '';
      this.text.disabled = false;
      this.confirm.disabled = false;
      this.showLeftOut(data.left_out || {});
      this.showEdited();
      if (fresh && document.activeElement === this.autoFocused) this.confirm.focus();
    } catch (err) {
      if (!this.isOpenFor(convId)) return;
      this.showError(err.message);
      this.leftOutText.textContent = '';
    }
  }

  isEdited() {
    return Boolean(this.preview) && this.text.value !== this.preview.summary;
  }

  showEdited() {
    const edited = this.isEdited();
    this.editedBadge.hidden = !edited;
    this.reset.hidden = !edited;
    const length = codePoints(this.text.value);
    this.count.textContent = length > LIMIT
      ? `${length.toLocaleString('en-US')} / ${LIMIT.toLocaleString('en-US')} characters: the end will be cut`
      : `${length.toLocaleString('en-US')} / ${LIMIT.toLocaleString('en-US')} characters`;
  }

  showLeftOut(leftOut) {
    this.leftOutText.textContent = leftOut.text || '';
    const newest = leftOut.newest || [];
    this.leftOutList.replaceChildren(...newest.map((m) => lineItem(m, 'left-out-item')));
    this.olderBefore = leftOut.older ? leftOut.older_before : null;
    this.older.hidden = !leftOut.older;
    this.older.textContent = leftOut.older === 1 ? 'Show the older one' : `Show the ${Number(leftOut.older).toLocaleString('en-US')} older ones`;
    this.leftOut.classList.toggle('empty', !newest.length && !leftOut.older); // nothing to unfold
  }

  /** The older ones, newest page first, 50 at a time, above the ones shown. */
  async loadOlder() {
    const convId = this.convId;
    if (this.olderBefore == null) return;
    this.older.disabled = true;
    try {
      const { data } = await api(`/api/conversations/${convId}/message-lines?before=${this.olderBefore}&limit=50`);
      if (!this.isOpenFor(convId)) return;
      const pinned = new Set(((this.preview && this.preview.pins) || []).map((pin) => pin.entry_id));
      const items = (data.messages || []).filter((m) => !pinned.has(m.entry_id)).map((m) => lineItem(m, 'left-out-item'));
      this.leftOutList.prepend(...items);
      this.olderBefore = data.before;
      this.older.hidden = data.before == null;
      this.older.textContent = 'Show more';
    } catch (err) {
      this.showError(err.message);
    } finally {
      this.older.disabled = false;
    }
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = false;
  }

  async submit() {
    const convId = this.convId;
    if (!this.preview || this.confirming) return;
    const body = { revision: this.preview.revision };
    if (this.isEdited()) body.carry_over = this.text.value;
    this.confirming = true;
    this.confirm.disabled = true;
    this.error.hidden = true;
    try {
      const { data } = await api(`/api/conversations/${convId}/compact`, { method: 'POST', body });
      this.dialogs.close(this.dialog);
      this.hooks.compacted(convId, data.compacted_into);
    } catch (err) {
      if (!this.isOpenFor(convId)) return;
      this.showError(err.message);
      if (err.status === 409) await this.load(false); // what it would carry now; edits are kept
    } finally {
      this.confirming = false;
      if (this.isOpenFor(convId)) this.confirm.disabled = !this.preview;
    }
  }

  /** The conversation was compacted (here, or in another tab while this one previewed). */
  onCompacted(convId) {
    if (!this.isOpenFor(convId)) return false;
    const here = this.confirming;
    this.dialogs.close(this.dialog);
    return !here;
  }
}

// keep.js — what a sidebar item shows besides its title (when it was last active, whether a
// turn runs) and its ⋯ menu: rename, export, archive, delete (the last two confirmed).
import { h, api, byId, isolate } from './util.js';

const MINUTE = 60 * 1000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** "just now", "5 min ago", "3 h ago", "2 d ago", then the date. */
export function relativeTime(iso, now = Date.now()) {
  const then = Date.parse(iso);
  if (!Number.isFinite(then)) return '';
  const ago = Math.max(0, now - then);
  if (ago < MINUTE) return 'just now';
  if (ago < HOUR) return `${Math.floor(ago / MINUTE)} min ago`;
  if (ago < DAY) return `${Math.floor(ago / HOUR)} h ago`;
  if (ago < 7 * DAY) return `${Math.floor(ago / DAY)} d ago`;
  return new Date(then).toLocaleDateString();
}

const STATES = {
  waiting: { text: 'needs you', says: 'The agent waits for your answer' },
  running: { text: 'running', says: 'A turn is running' },
};

/** What a conversation is doing that the sidebar says: "waiting" (a question waits for the
 * user's answer: it says more than running), "running", or null. */
export const convState = (conv) => (conv.questions > 0 ? 'waiting' : conv.running ? 'running' : null);

/** A sidebar item's words for the hover and screen readers: its state and when it was last
 * active, exactly (the row shows one of them, the title keeps the room). */
export function convDescription(conv) {
  const busy = convState(conv);
  const when = conv.updated_at ? `last active ${new Date(conv.updated_at).toLocaleString()}` : '';
  return [busy && STATES[busy].says, when].filter(Boolean).join(' · ');
}

/** Beside a sidebar title, one short thing: its state while it has one ("needs you" before
 * "running"), else when it was last active (the exact time as its title). */
export function convMeta(conv) {
  const busy = convState(conv);
  const mark = busy
    ? h('span', { class: `conv-${busy}`, testid: `conv-${busy}`, title: STATES[busy].says, text: STATES[busy].text })
    : h('time', {
      class: 'conv-when',
      testid: 'conv-when',
      datetime: conv.updated_at || null,
      title: conv.updated_at ? new Date(conv.updated_at).toLocaleString() : null,
      text: relativeTime(conv.updated_at),
    });
  return h('span', { class: 'conv-meta' }, mark);
}

/** Outside the list, how many conversations need the user: "(2) " before the page's title and
 * a mark on ☰ (a phone's closed drawer hides the list). */
export function showNeeds(convs) {
  const count = convs.filter((conv) => convState(conv) === 'waiting').length;
  const menu = byId('menu-button');
  menu.classList.toggle('needs-you', count > 0);
  menu.setAttribute('aria-label', count ? `Conversations (${count} ${count === 1 ? 'needs' : 'need'} you)` : 'Conversations');
  needs = count;
  setPageTitle(pageTitle);
}

let needs = 0;
let pageTitle = 'oarlock';

/** The page's title: base, after the count of conversations that need the user. */
export function setPageTitle(base) {
  pageTitle = base;
  document.title = needs ? `(${needs}) ${base}` : base;
}

const exportUrl = (id, format, ancestors) =>
  `/api/conversations/${id}/export?format=${format}${ancestors ? '&ancestors=true' : ''}`;

/** The ⋯ menu of sidebar items (one popover, outside the lists: a redraw does not close it). */
export class ConvActions {
  /** hooks: get(id) → conv, clock() → the feed count now, changed(conv, asked: clock() before the request), removed(id), dialogs (app.js's) */
  constructor(hooks) {
    this.hooks = hooks;
    this.menu = byId('conv-menu');
    this.convId = null;
    this.anchor = null; // the ⋯ button the menu was opened from
    this.menu.addEventListener('keydown', (e) => this.key(e));
    this.menu.addEventListener('toggle', (e) => {
      if (e.newState === 'closed' && this.anchor) this.anchor.setAttribute('aria-expanded', 'false');
    });
    this.renameDialog = byId('rename-dialog');
    this.confirmDialog = byId('confirm-dialog');
    this.confirmAction = null;
    hooks.dialogs.register(this.renameDialog);
    hooks.dialogs.register(this.confirmDialog, () => { this.confirmAction = null; });
    byId('rename-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.saveRename();
    });
    byId('rename-cancel').addEventListener('click', () => hooks.dialogs.close(this.renameDialog));
    byId('confirm-cancel').addEventListener('click', () => hooks.dialogs.close(this.confirmDialog));
    byId('confirm-ok').addEventListener('click', () => this.confirmed());
  }

  /** The ⋯ button of one sidebar item. */
  button(conv) {
    const button = h('button', {
      type: 'button',
      class: 'conv-menu-btn',
      testid: 'conv-menu-button',
      'aria-label': `Actions for ${isolate(conv.title || 'Untitled')}`,
      'aria-haspopup': 'menu',
      'aria-expanded': 'false',
      text: '⋯',
    });
    if (this.convId === conv.id && this.isOpen()) { // redrawn while its menu is open
      button.setAttribute('aria-expanded', 'true');
      this.anchor = button;
    }
    button.addEventListener('click', (e) => {
      e.preventDefault();
      e.stopPropagation();
      this.open(conv.id, button);
    });
    return button;
  }

  /** A conversation's new state (any tab's change): a dialog that stopped its turn asks its
   *  question once the turn has ended. */
  seen(conv) {
    const pending = this.confirmAction;
    if (pending?.stopping && pending.id === conv.id && !conv.running && this.confirmDialog.open) {
      this.ask(conv.id, pending.action);
    }
  }

  open(id, anchor) {
    const conv = this.hooks.get(id);
    if (!conv) return;
    this.convId = id;
    this.anchor = anchor;
    const active = conv.status !== 'archived';
    const item = (text, testid, onClick) => {
      const b = h('button', { type: 'button', class: 'menu-item', role: 'menuitem', tabindex: '-1', testid, text });
      b.addEventListener('click', () => {
        if (this.anchor?.isConnected) this.anchor.focus({ preventScroll: true }); // not the body
        this.menu.hidePopover();
        onClick();
      });
      return b;
    };
    const download = (text, testid, format, ancestors) => h('a', {
      class: 'menu-item', role: 'menuitem', tabindex: '-1', testid, text, href: exportUrl(id, format, ancestors), download: '',
    });
    const withAncestors = conv.compacted_from_id != null;
    const items = [
      active ? item('Rename…', 'conv-rename', () => this.startRename(id)) : null,
      download('Export Markdown', 'conv-export-md', 'md', false),
      download('Export JSON Lines', 'conv-export-jsonl', 'jsonl', false),
      withAncestors ? download('Export Markdown with earlier conversations', 'conv-export-md-ancestors', 'md', true) : null,
      withAncestors ? download('Export JSON Lines with earlier conversations', 'conv-export-jsonl-ancestors', 'jsonl', true) : null,
      active ? item('Archive…', 'conv-archive', () => this.ask(id, 'archive')) : null,
      item('Delete…', 'conv-delete', () => this.ask(id, 'delete')),
    ];
    this.menu.replaceChildren(...items.filter(Boolean));
    for (const link of this.menu.querySelectorAll('a')) {
      link.addEventListener('click', () => this.menu.hidePopover());
    }
    this.menu.showPopover();
    anchor.setAttribute('aria-expanded', 'true');
    const rect = anchor.getBoundingClientRect();
    const width = this.menu.offsetWidth;
    this.menu.style.left = `${Math.max(8, Math.min(rect.right - width, innerWidth - width - 8))}px`;
    this.menu.style.top = `${Math.min(rect.bottom + 4, innerHeight - this.menu.offsetHeight - 8)}px`;
    const first = this.menu.querySelector('.menu-item');
    if (first) first.focus();
  }

  isOpen() {
    try {
      return this.menu.matches(':popover-open');
    } catch {
      return false; // a browser without popovers
    }
  }

  /** The keys of a menu (WAI-ARIA): arrows, Home and End move; a letter goes to the next item
   * it begins; Esc closes it back to its ⋯ button; Tab closes it and moves on from that button. */
  key(e) {
    const items = [...this.menu.querySelectorAll('.menu-item')];
    if (!items.length) return;
    const at = items.indexOf(document.activeElement);
    const step = (by) => items[(Math.max(at, by > 0 ? -1 : 0) + by + items.length) % items.length];
    let next = null;
    if (e.key === 'ArrowDown') next = step(1);
    else if (e.key === 'ArrowUp') next = step(-1);
    else if (e.key === 'Home') next = items[0];
    else if (e.key === 'End') next = items[items.length - 1];
    else if (e.key === 'Escape' || e.key === 'Tab') {
      this.menu.hidePopover();
      if (this.anchor?.isConnected) this.anchor.focus(); // Tab's own move starts from there
      if (e.key === 'Escape') {
        e.preventDefault();
        e.stopPropagation(); // Esc closed the menu: not the drawer too, nor a running turn
      }
      return;
    } else if (e.key.length === 1 && !e.ctrlKey && !e.metaKey && !e.altKey) {
      const letter = e.key.toLowerCase();
      const order = [...items.slice(at + 1), ...items.slice(0, at + 1)];
      next = order.find((each) => each.textContent.trim().toLowerCase().startsWith(letter)) || null;
    } else return;
    e.preventDefault();
    if (next) next.focus();
  }

  startRename(id) {
    const conv = this.hooks.get(id);
    if (!conv) return;
    const field = byId('rename-input');
    field.value = conv.title || '';
    this.renaming = id;
    byId('rename-error').hidden = true;
    this.hooks.dialogs.open(this.renameDialog, field);
    this.returnTo(this.renameDialog, id);
    field.select();
  }

  async saveRename() {
    const id = this.renaming;
    const title = byId('rename-input').value.trim();
    const error = byId('rename-error');
    if (!title) {
      error.textContent = 'The title cannot be empty.';
      error.hidden = false;
      return;
    }
    try {
      const asked = this.hooks.clock();
      const { data } = await api(`/api/conversations/${id}`, { method: 'PATCH', body: { title } });
      this.hooks.changed(data, asked);
      this.hooks.dialogs.close(this.renameDialog);
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    }
  }

  ask(id, action) {
    const conv = this.hooks.get(id);
    if (!conv) return;
    const title = isolate(conv.title || 'Untitled'); // a right-to-left override in it reverses nothing after it
    // A turn running (as the sidebar knows it): said at once, with Stop the turn (the question
    // follows once it has ended: seen()); the relay refuses the same way if one began since
    // (the 409's message, shown under the question). Not a question alone: a background
    // subagent's outlives its turn, and archiving is the way to end it.
    const busy = Boolean(conv.running);
    byId('confirm-question').textContent = busy
      ? `A turn is running in “${title}”; stop it before you ${action} it.`
      : action === 'delete'
        ? `Delete “${title}”? Its messages and backups are deleted too. This cannot be undone.`
        : `Archive “${title}”? It becomes read-only; it is not compacted.`;
    const ok = byId('confirm-ok');
    ok.textContent = busy ? 'Stop the turn' : action === 'delete' ? 'Delete' : 'Archive';
    ok.classList.toggle('btn-danger', action === 'delete' && !busy);
    ok.disabled = false;
    byId('confirm-cancel').textContent = busy ? 'Close' : 'Cancel';
    byId('confirm-error').hidden = true;
    this.confirmAction = { id, action, stop: busy };
    this.hooks.dialogs.open(this.confirmDialog, byId('confirm-cancel'));
    this.returnTo(this.confirmDialog, id);
  }

  /** Where focus goes back when a dialog opened from the menu closes: its ⋯ button, found
   * again if the sidebar was redrawn meanwhile (a rename, an archive), else the list's start. */
  returnTo(dialog, id) {
    const opener = dialog.returnFocus;
    dialog.returnFocus = () => {
      if (opener && opener !== document.body && opener.isConnected) return opener;
      return document.querySelector(`.conv-item[data-id="${id}"] .conv-menu-btn`) || byId('new-conversation');
    };
  }

  async confirmed() {
    const pending = this.confirmAction;
    if (!pending) return;
    const ok = byId('confirm-ok');
    ok.disabled = true;
    try {
      if (pending.stop) { // then, once the turn has ended (seen()), the question itself
        ok.textContent = 'Stopping…';
        pending.stopping = true;
        await api(`/api/conversations/${pending.id}/interrupt`, { method: 'POST', body: {} });
        const conv = this.hooks.get(pending.id);
        if (this.confirmAction === pending && conv && !conv.running) this.ask(pending.id, pending.action);
        return;
      }
      if (pending.action === 'delete') {
        // Its ⋯ button goes with it: focus goes to a neighbour's, or New. The neighbour is
        // found before the request (the socket's removal may redraw the list before its answer)
        // and its button again when the dialog closes (the list redrawn meanwhile).
        const item = document.querySelector(`.conv-item[data-id="${pending.id}"]`);
        const sibling = [item?.nextElementSibling, item?.previousElementSibling].find((el) => el?.matches('.conv-item[data-id]'));
        const neighbourId = sibling?.dataset.id;
        await api(`/api/conversations/${pending.id}`, { method: 'DELETE' });
        this.confirmDialog.returnFocus = () => document.querySelector(`.conv-item[data-id="${neighbourId}"] .conv-menu-btn`)
          || byId('new-conversation');
        this.hooks.removed(pending.id);
      } else {
        const asked = this.hooks.clock();
        const { data } = await api(`/api/conversations/${pending.id}/archive`, { method: 'POST', body: {} });
        this.hooks.changed(data, asked);
      }
      this.hooks.dialogs.close(this.confirmDialog);
    } catch (err) {
      const error = byId('confirm-error');
      error.textContent = err.message;
      error.hidden = false;
      ok.disabled = false;
      if (pending.stop) {
        pending.stopping = false;
        ok.textContent = 'Stop the turn';
      }
    }
  }
}

// backups.js — backups at thresholds (SPEC §6): the header link to the newest one, the list in
// the 🧠 modal, a backup's rendered view with Download, and "Start fresh from this backup".
import { h, api, byId } from './util.js';
import { enhance } from './timeline.js';

const backupUrl = (convId, name) => `/api/conversations/${convId}/backups/${encodeURIComponent(name)}`;

/** "2026-02-18T14:15:07.123Z" → the browser's local date and time. */
function when(iso) {
  const date = new Date(iso || '');
  return Number.isNaN(date.getTime()) ? '' : date.toLocaleString([], { dateStyle: 'medium', timeStyle: 'short' });
}

export class Backups {
  /** hooks: current() → {id, archived} | null, onFresh(newConversation); dialogs: the shared helper */
  constructor(hooks, dialogs) {
    this.hooks = hooks;
    this.dialogs = dialogs;
    this.viewer = byId('backup-dialog');
    this.confirm = byId('fresh-dialog');
    this.name = null; // the backup in the viewer
    this.listFor = null; // the conversation the modal's list shows
    dialogs.register(this.viewer);
    dialogs.register(this.confirm);
    // Every "open this backup" link (header, 🧠 list, compaction lines) carries data-backup.
    document.addEventListener('click', (e) => {
      const link = e.target.closest('[data-backup]');
      if (!link || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      this.open(link.dataset.backup);
    });
    byId('backup-close').addEventListener('click', () => dialogs.close(this.viewer));
    byId('backup-fresh').addEventListener('click', () => dialogs.open(this.confirm, byId('fresh-confirm')));
    byId('fresh-cancel').addEventListener('click', () => dialogs.close(this.confirm));
    byId('fresh-confirm').addEventListener('click', () => this.startFresh());
  }

  /** Close the backup dialogs (another conversation opens). */
  close() {
    this.name = null;
    this.dialogs.close(this.confirm);
    this.dialogs.close(this.viewer);
  }

  /** The header's link to the newest backup of the open conversation. */
  renderHeader(conv) {
    const link = byId('backup-link');
    const name = conv && conv.backup;
    link.hidden = !name;
    if (!name) return;
    link.textContent = `↳ ${name}`;
    link.dataset.backup = name;
    link.href = backupUrl(conv.id, name);
    link.title = 'The newest backup of this conversation';
  }

  /** A conversation's newest backup changed: refresh the 🧠 list if it shows that one. */
  changed(convId) {
    if (this.listFor === convId && byId('context-modal').open) this.loadList(convId);
  }

  /** Fill the 🧠 modal's list, newest first. */
  async loadList(convId) {
    this.listFor = convId;
    let found = [];
    try {
      const { data } = await api(`/api/conversations/${convId}/backups`);
      found = (data && data.backups) || [];
    } catch (err) {
      if (this.listFor === convId) byId('backups-section').hidden = true;
      return;
    }
    if (this.listFor !== convId) return;
    byId('backups-section').hidden = found.length === 0;
    byId('backup-list').replaceChildren(...found.map((b) =>
      h('li', { class: 'backup-item', testid: 'backup-item' },
        h('a', { href: backupUrl(convId, b.name), class: 'backup-name', 'data-backup': b.name, testid: 'backup-open', text: b.name }),
        h('span', { class: 'backup-facts', testid: 'backup-facts', text: [b.trigger, b.context_remaining && `${b.context_remaining} left`, when(b.generated)].filter(Boolean).join(' · ') }))));
  }

  /** Open one backup of the open conversation, rendered. */
  async open(name) {
    const cur = this.hooks.current();
    if (!cur) return;
    this.name = name;
    byId('backup-title').textContent = name;
    byId('backup-meta').textContent = 'Loading…';
    byId('backup-body').replaceChildren();
    byId('backup-error').hidden = true;
    const download = byId('backup-download');
    download.href = `${backupUrl(cur.id, name)}?download=true`;
    download.setAttribute('download', name);
    byId('backup-fresh').hidden = cur.archived;
    this.dialogs.open(this.viewer, byId('backup-close'));
    try {
      const { data } = await api(`${backupUrl(cur.id, name)}/rendered`);
      if (this.name !== name) return;
      byId('backup-meta').textContent = [data.trigger, data.context_remaining && `${data.context_remaining} left`, when(data.generated)].filter(Boolean).join(' · ');
      const body = byId('backup-body');
      body.innerHTML = data.html; // sanitized by the server (app/render.py)
      enhance(body); // its links open in a new tab, as a message's do (not in place of the app)
    } catch (err) {
      if (this.name === name) byId('backup-meta').textContent = err.message;
    }
  }

  /** Archive the conversation and open a new one whose first message carries this backup. */
  async startFresh() {
    const cur = this.hooks.current();
    const name = this.name;
    if (!cur || !name) return;
    const button = byId('fresh-confirm');
    button.disabled = true;
    try {
      const { data } = await api(`${backupUrl(cur.id, name)}/fresh`, { method: 'POST' });
      this.dialogs.close(this.confirm);
      this.dialogs.close(this.viewer);
      if (data && data.compacted_into) this.hooks.onFresh(data.compacted_into);
    } catch (err) {
      this.dialogs.close(this.confirm);
      const error = byId('backup-error');
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  }
}

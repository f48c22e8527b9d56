// changes.js — the header's Changes view: the files git sees changed in the conversation's
// repository since the last commit, each opening onto its diff (app/changes.py).
import { h, api, byId, fmtExact } from './util.js';
import { diffBlock } from './timeline.js';

const STATUS = {
  modified: ['M', 'Modified'],
  added: ['A', 'Added'],
  deleted: ['D', 'Deleted'],
  renamed: ['R', 'Renamed'],
  copied: ['C', 'Copied'],
  typechange: ['T', 'Type changed'],
  unmerged: ['U', 'In conflict'],
  untracked: ['?', 'New, untracked'],
};

const plural = (n, one, many) => `${fmtExact(n)} ${n === 1 ? one : many}`;

/** "On branch main · 3 files changed · +12 −4" and the like. */
export function changesSummary(view) {
  if (!view.repo) return 'The working directory is not in a git repository.';
  const where = view.branch
    ? `On branch ${view.branch}${view.head ? '' : ', no commits yet'}`
    : `HEAD detached at ${view.head}`;
  const files = view.files || [];
  if (!files.length) return `${where} · No changes since the last commit.`;
  const added = files.reduce((n, f) => n + (f.added || 0), 0);
  const removed = files.reduce((n, f) => n + (f.removed || 0), 0);
  const count = view.truncated ? `the first ${plural(files.length, 'file', 'files')} changed listed`
    : `${plural(files.length, 'file', 'files')} changed`;
  return `${where} · ${count} · +${fmtExact(added)} −${fmtExact(removed)}`;
}

function counts(file) {
  if (file.binary) return 'binary';
  const parts = [];
  if (file.added != null) parts.push(`+${fmtExact(file.added)}`);
  if (file.removed != null) parts.push(`−${fmtExact(file.removed)}`);
  return parts.join(' ');
}

export class Changes {
  /** dialogs: the shared helper (app.js) */
  constructor(dialogs) {
    this.dialogs = dialogs;
    this.dialog = byId('changes-dialog');
    this.convId = null; // the conversation the dialog shows
    this.asked = 0; // the last list asked for: an older answer arriving late is dropped
    this.openPaths = new Set(); // the files whose diff is shown, kept across a refresh
    dialogs.register(this.dialog, () => { this.convId = null; });
    byId('changes-close').addEventListener('click', () => dialogs.close(this.dialog));
    byId('changes-refresh').addEventListener('click', () => this.load());
  }

  get isOpen() { return this.dialog.open; }

  open(convId) {
    if (this.convId !== convId) this.openPaths.clear();
    this.convId = convId;
    this.dialogs.open(this.dialog, byId('changes-refresh'));
    this.load();
  }

  close() { this.dialogs.close(this.dialog); }

  /** A turn of the open conversation ended: what it changed shows (when the view is open). */
  turnEnded(convId) {
    if (this.isOpen && this.convId === convId) this.load();
  }

  async load() {
    const convId = this.convId;
    if (convId == null) return;
    const asked = ++this.asked;
    const error = byId('changes-error');
    byId('changes-dialog').setAttribute('aria-busy', 'true');
    let view;
    try {
      ({ data: view } = await api(`/api/conversations/${convId}/changes`));
    } catch (err) {
      if (asked !== this.asked) return;
      byId('changes-dialog').removeAttribute('aria-busy');
      error.textContent = err.message;
      error.hidden = false;
      return;
    }
    if (asked !== this.asked || convId !== this.convId) return;
    byId('changes-dialog').removeAttribute('aria-busy');
    error.hidden = true;
    byId('changes-meta').textContent = changesSummary(view);
    byId('changes-root').textContent = view.root || '';
    const paths = new Set((view.files || []).map((f) => f.path));
    for (const path of [...this.openPaths]) if (!paths.has(path)) this.openPaths.delete(path);
    byId('changes-list').replaceChildren(...(view.files || []).map((f) => this.item(convId, f)));
  }

  item(convId, file) {
    const [letter, label] = STATUS[file.status] || ['M', file.status];
    const name = file.old_path ? `${file.old_path} → ${file.path}` : file.path;
    const body = h('div', { class: 'change-diff', testid: 'change-diff', hidden: true });
    const toggle = h('button', {
      type: 'button', class: 'change-toggle', testid: 'change-toggle', 'aria-expanded': 'false', title: label,
    },
    h('span', { class: `change-status ${file.status}`, testid: 'change-status', 'aria-label': label, text: letter }),
    h('span', { class: 'change-path', testid: 'change-path', dir: 'ltr', text: name }),
    h('span', { class: 'change-counts', testid: 'change-counts', text: counts(file) }));
    const show = (open) => {
      toggle.setAttribute('aria-expanded', String(open));
      body.hidden = !open;
      if (open) {
        this.openPaths.add(file.path);
        this.loadDiff(convId, file.path, body);
      } else {
        this.openPaths.delete(file.path);
      }
    };
    toggle.addEventListener('click', () => show(body.hidden));
    if (this.openPaths.has(file.path)) show(true);
    return h('li', { class: 'change-item', testid: 'change-item' }, toggle, body);
  }

  async loadDiff(convId, path, body) {
    body.replaceChildren(h('p', { class: 'muted', text: 'Loading…' }));
    let diff;
    try {
      ({ data: diff } = await api(`/api/conversations/${convId}/changes/diff?path=${encodeURIComponent(path)}`));
    } catch (err) {
      body.replaceChildren(h('p', { class: 'dialog-error', text: err.message }));
      return;
    }
    if (convId !== this.convId) return;
    if (diff.binary) {
      body.replaceChildren(h('p', { class: 'muted', text: 'A binary file: no lines to show.' }));
    } else if (!diff.diff.length) {
      body.replaceChildren(h('p', { class: 'muted', text: diff.status === 'renamed' ? 'Moved, no line changed.' : 'No line changed (its mode or type did).' }));
    } else {
      const block = diffBlock(diff);
      if (diff.cut) block.append(h('span', { class: 'diff-line hunk', text: '… the rest is too long to show' }));
      body.replaceChildren(block);
    }
  }
}

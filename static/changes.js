// changes.js — the header's Changes view: the files git sees changed in the conversation's
// repository since the last commit, each opening onto its diff (app/changes.py).
import { h, api, byId, fmtExact } from './util.js';
import { diffBlock, visible } from './timeline.js';

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
    ? `On branch ${visible(view.branch).shown}${view.head ? '' : ', no commits yet'}`
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
  if (file.directory) return 'folder';
  if (file.binary) return 'binary';
  const parts = [];
  if (file.added != null) parts.push(`+${fmtExact(file.added)}`);
  if (file.removed != null) parts.push(`−${fmtExact(file.removed)}`);
  return parts.join(' ');
}

/** Why a text file's diff has no line: an empty file came or went, or only its name, mode or type changed. */
function noLines(status) {
  if (status === 'renamed') return 'Moved, no line changed.';
  if (status === 'untracked' || status === 'added') return 'A new, empty file.';
  if (status === 'deleted') return 'An empty file, deleted.';
  return 'No line changed (its mode or type did).';
}

export class Changes {
  /** dialogs: the shared helper (app.js) */
  constructor(dialogs) {
    this.dialogs = dialogs;
    this.dialog = byId('changes-dialog');
    this.convId = null; // the conversation the dialog shows
    this.asked = 0; // the last list asked for: an older answer arriving late is dropped
    this.shownFor = null; // the conversation whose list the view shows
    this.openPaths = new Set(); // the files whose diff is shown, kept across a refresh
    dialogs.register(this.dialog, () => { this.convId = null; });
    byId('changes-close').addEventListener('click', () => dialogs.close(this.dialog));
    byId('changes-refresh').addEventListener('click', () => this.load());
  }

  get isOpen() { return this.dialog.open; }

  open(convId) {
    if (this.shownFor !== convId) { // another conversation's list is never shown meanwhile
      this.openPaths.clear();
      this.clear('Loading…');
    }
    this.convId = convId;
    this.dialogs.open(this.dialog, byId('changes-refresh'));
    this.load();
  }

  close() { this.dialogs.close(this.dialog); }

  /** A turn of the open conversation ended: what it changed shows (when the view is open). */
  turnEnded(convId) {
    if (this.isOpen && this.convId === convId) this.load();
  }

  /** Empty the view: its summary line says meta. */
  clear(meta) {
    this.shownFor = null;
    byId('changes-error').hidden = true;
    byId('changes-meta').textContent = meta;
    byId('changes-root').textContent = '';
    byId('changes-list').replaceChildren();
  }

  async load() {
    const convId = this.convId;
    if (convId == null) return;
    const asked = ++this.asked;
    const error = byId('changes-error');
    this.dialog.setAttribute('aria-busy', 'true'); // (the list dims meanwhile)
    let view;
    try {
      ({ data: view } = await api(`/api/conversations/${convId}/changes`));
    } catch (err) {
      if (asked !== this.asked) return;
      this.dialog.removeAttribute('aria-busy');
      this.clear(''); // an error under an older list would read as that list's
      error.textContent = err.message;
      error.hidden = false;
      return;
    }
    if (asked !== this.asked || convId !== this.convId) return;
    this.dialog.removeAttribute('aria-busy');
    error.hidden = true;
    this.shownFor = convId;
    byId('changes-meta').textContent = changesSummary(view);
    byId('changes-root').textContent = visible(view.root || '').shown;
    const paths = new Set((view.files || []).map((f) => f.path));
    for (const path of [...this.openPaths]) if (!paths.has(path)) this.openPaths.delete(path);
    byId('changes-list').replaceChildren(...(view.files || []).map((f) => this.item(convId, f)));
  }

  item(convId, file) {
    const [letter, label] = STATUS[file.status] || ['M', file.status];
    const name = visible(file.old_path ? `${file.old_path} → ${file.path}` : file.path).shown;
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
        this.loadDiff(convId, file, body);
      } else {
        this.openPaths.delete(file.path);
      }
    };
    toggle.addEventListener('click', () => show(body.hidden));
    if (this.openPaths.has(file.path)) show(true); // (kept open across a refresh)
    return h('li', { class: 'change-item', testid: 'change-item' }, toggle, body);
  }

  async loadDiff(convId, file, body) {
    if (file.directory) {
      body.replaceChildren(h('p', { class: 'muted', text: 'A folder git does not look into (a repository of its own): its changes are not shown here.' }));
      return;
    }
    if (!body.firstChild) body.append(h('p', { class: 'muted', text: 'Loading…' })); // (a refresh keeps the old diff meanwhile)
    const query = new URLSearchParams({ path: file.path });
    if (file.old_path) query.set('old_path', file.old_path);
    let diff;
    try {
      ({ data: diff } = await api(`/api/conversations/${convId}/changes/diff?${query}`));
    } catch (err) {
      body.replaceChildren(h('p', { class: 'dialog-error', text: err.message }));
      return;
    }
    if (convId !== this.convId) return;
    if (diff.binary) {
      body.replaceChildren(h('p', { class: 'muted', text: 'A binary file: no lines to show.' }));
    } else if (!diff.diff.length) {
      body.replaceChildren(h('p', { class: 'muted', text: noLines(diff.status) }));
    } else {
      const block = diffBlock(diff);
      if (diff.cut) block.append(h('span', { class: 'diff-line hunk', text: '… the rest is too long to show' }));
      body.replaceChildren(block);
    }
  }
}

// import.js — sessions started in a terminal: the list in the new-conversation dialog (import
// one), and the `claude --resume` line of a Claude Code conversation in the 🧠 modal.
import { h, api, byId } from './util.js';
import { relativeTime } from './keep.js';

/** A path as one shell word: single-quoted unless it is plainly safe. */
export const shellWord = (text) => (/^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`);

/** The command that continues a conversation's session in a terminal, from its directory. */
export const resumeCommand = (conv) => `cd ${shellWord(conv.cwd)} && claude --resume ${conv.session_id}`;

/** The 🧠 modal's "Continue in a terminal" section: Claude Code conversations with a session. */
export function renderResume(conv) {
  const section = byId('resume-section');
  const show = Boolean(conv && conv.provider === 'claude' && conv.session_id);
  section.hidden = !show;
  if (!show) return;
  byId('resume-command').textContent = resumeCommand(conv);
  byId('resume-cwd').textContent = conv.cwd;
}

function wireCopy() {
  const button = byId('resume-copy');
  button.addEventListener('click', () => {
    const text = byId('resume-command').textContent;
    navigator.clipboard?.writeText(text).then(() => {
      button.textContent = 'Copied';
      setTimeout(() => { button.textContent = 'Copy'; }, 1200);
    }, () => {
      // No clipboard (an http page that is not localhost): select it to copy by hand.
      window.getSelection().selectAllChildren(byId('resume-command'));
    });
  });
}

/** The import list in the new-conversation dialog. hooks: onImported(conversation), onOpen(id). */
export class Imports {
  constructor(hooks) {
    this.hooks = hooks;
    this.loading = 0;
    byId('import-toggle').addEventListener('click', () => this.toggle());
    wireCopy();
  }

  /** Folded again each time the dialog opens. */
  reset() {
    this.loading += 1;
    byId('import-panel').hidden = true;
    byId('import-toggle').setAttribute('aria-expanded', 'false');
    byId('import-list').replaceChildren();
    this.status('');
  }

  toggle() {
    const panel = byId('import-panel');
    panel.hidden = !panel.hidden;
    byId('import-toggle').setAttribute('aria-expanded', String(!panel.hidden));
    if (!panel.hidden) this.load();
  }

  status(text, alert = false) {
    const el = byId('import-status');
    el.textContent = text;
    el.hidden = !text;
    el.setAttribute('role', alert ? 'alert' : 'status');
  }

  async load() {
    const ticket = ++this.loading;
    this.status('Loading…');
    byId('import-list').replaceChildren();
    try {
      const { data } = await api('/api/claude-sessions');
      if (ticket === this.loading) this.render(data);
    } catch (err) {
      if (ticket === this.loading) this.status(err.message, true);
    }
  }

  render(data) {
    const fresh = data.sessions.filter((s) => s.conversation_id == null);
    const held = data.sessions.length - fresh.length;
    byId('import-list').replaceChildren(...fresh.map((s) => this.item(s)));
    const parts = [];
    if (!fresh.length) parts.push(`No Claude Code sessions to import from ${data.config_dir} (only those in the workspace roots are listed).`);
    if (held) parts.push(`${held} already in oarlock ${held === 1 ? 'is' : 'are'} not listed.`);
    if (data.more) parts.push('Only the latest are listed.');
    this.status(parts.join(' '));
  }

  item(session) {
    const button = h('button', { type: 'button', class: 'btn btn-small', testid: 'import-button', text: 'Import' });
    const error = h('p', { class: 'dialog-error', role: 'alert', hidden: true });
    // The session's folder has Claude Code settings of its own: imported only once trusted
    // (as Create asks, app/trust.py), with this box under the refusal.
    const trusted = h('input', { type: 'checkbox', testid: 'import-trust' });
    const trust = h('label', { class: 'check-field', hidden: true }, trusted, h('span', { text: "Trust this folder's settings" }));
    button.addEventListener('click', async () => {
      button.disabled = true;
      error.hidden = true;
      try {
        const body = { permission_mode: byId('new-permission').value }; // as the dialog says
        if (trusted.checked) body.trust_project = true;
        const { data } = await api(`/api/claude-sessions/${encodeURIComponent(session.session_id)}/import`, { method: 'POST', body });
        this.hooks.onImported(data);
      } catch (err) {
        error.textContent = err.message;
        error.hidden = false;
        button.disabled = false;
        if (err.status === 409 && err.message.startsWith('This folder has Claude Code settings')) trust.hidden = false;
      }
    });
    const when = h('time', { datetime: session.updated_at, title: new Date(session.updated_at).toLocaleString(), text: relativeTime(session.updated_at) });
    return h('li', { class: 'import-item', testid: 'import-item', 'data-session': session.session_id },
      h('div', { class: 'import-main' },
        h('span', { class: 'import-title', dir: 'auto', testid: 'import-title', text: session.title }),
        h('span', { class: 'import-meta' }, h('span', { class: 'import-cwd', dir: 'ltr', text: session.cwd }), ' · ', when)),
      button, error, trust);
  }
}

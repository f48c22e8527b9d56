// mode.js — under the message box: the permission mode (what the agent may do without asking)
// and, for Claude Code, the model; both changeable at any time (the relay switches a live
// agent in place). "Never ask" is confirmed first: a stray arrow key on the closed list must
// not choose it.
import { byId, h } from './util.js';

const BYPASS = 'bypassPermissions';

/** Mark the modes a provider's agent would refuse to start in here (refused: mode → the relay's
 *  reason, from /api/providers): disabled, saying so, the reason as the option's tooltip. The
 *  selected one stays choosable (a conversation already in it). */
export function markRefusedModes(select, refused) {
  for (const option of select.options) {
    option.dataset.label ??= option.textContent;
    const reason = (refused || {})[option.value];
    option.disabled = Boolean(reason) && option.value !== select.value;
    option.textContent = reason ? `${option.dataset.label} (not available here)` : option.dataset.label;
    option.title = reason || '';
  }
}

export class ModeControl {
  /** hooks: current() → the shown conversation or null, save(id, mode) → Promise (rejects with
   *  the relay's message), refusedModes(provider) → mode → reason; dialogs: the page's dialog
   *  helper. */
  constructor(hooks, dialogs) {
    this.hooks = hooks;
    this.dialogs = dialogs;
    this.select = byId('mode-select');
    this.dialog = byId('bypass-dialog');
    this.pending = null; // the conversation id "Never ask" waits to be confirmed for
    dialogs.register(this.dialog, () => {
      if (this.pending != null) this.show(this.hooks.current()); // cancelled: as it was
      this.pending = null;
    });
    this.select.addEventListener('change', () => this.chosen(this.select.value));
    byId('bypass-cancel').addEventListener('click', () => dialogs.close(this.dialog));
    byId('bypass-ok').addEventListener('click', () => {
      const id = this.pending;
      this.pending = null;
      dialogs.close(this.dialog);
      if (id != null) this.save(id, BYPASS);
    });
  }

  /** Show a conversation's mode (its event, any tab's change); archived: read-only. */
  show(conv) {
    if (!conv) return;
    if (this.select.value !== conv.permission_mode) this.select.value = conv.permission_mode;
    markRefusedModes(this.select, this.hooks.refusedModes(conv.provider));
    this.select.disabled = conv.status === 'archived';
  }

  chosen(mode) {
    const conv = this.hooks.current();
    if (!conv) return;
    if (mode !== BYPASS) {
      this.save(conv.id, mode);
      return;
    }
    this.pending = conv.id;
    this.dialogs.open(this.dialog, byId('bypass-cancel'));
    this.dialog.returnFocus = this.select;
  }

  async save(id, mode) {
    try {
      await this.hooks.save(id, mode);
    } catch (err) {
      this.show(this.hooks.current()); // not changed: as it was
      this.hooks.refused(err.message);
    }
  }
}

/** The model a Claude Code conversation uses (Default: the relay's OARLOCK_CLAUDE_MODEL or
 * Claude Code's own); one set through the API shows as itself. */
export class ModelControl {
  /** hooks: current() → the shown conversation or null, save(id, model) → Promise,
   *  refused(message). */
  constructor(hooks) {
    this.hooks = hooks;
    this.field = byId('model-field');
    this.select = byId('model-select');
    this.select.addEventListener('change', () => this.chosen(this.select.value));
  }

  show(conv) {
    if (!conv) return;
    this.field.hidden = conv.provider !== 'claude';
    const value = conv.chosen_model || '';
    // One set through the API, as itself: the only option of its kind (another conversation's
    // is gone).
    for (const option of this.select.querySelectorAll('option.custom')) option.remove();
    if (![...this.select.options].some((o) => o.value === value)) {
      this.select.append(h('option', { value, class: 'custom', text: value }));
    }
    if (this.select.value !== value) this.select.value = value;
    this.select.disabled = conv.status === 'archived';
  }

  async chosen(model) {
    const conv = this.hooks.current();
    if (!conv) return;
    try {
      await this.hooks.save(conv.id, model || null);
    } catch (err) {
      this.show(this.hooks.current()); // not changed: as it was
      this.hooks.refused(err.message);
    }
  }
}

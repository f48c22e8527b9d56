// context.js — the 🧠 modal: how full the context is, and the auto-compact window slider,
// which saves when the modal closes.
import { h, api, byId, fmtTokens } from './util.js';

const COMPACT_BUFFER = 33000; // the agent compacts this many tokens before the window's end
const notchLabel = (value) => (value == null ? 'Auto' : fmtTokens(value));

export class ContextModal {
  /** hooks: onSave(conversationId, window|null), dialogs: the shared dialog helper */
  constructor(hooks, dialogs) {
    this.hooks = hooks;
    this.dialog = byId('context-modal');
    this.slider = byId('window-slider');
    this.ctx = null;
    this.convId = null;
    this.initial = 0; // the slider's index when it was last loaded
    this.touched = false; // the user moved the slider since then
    this.timer = 0;
    this.slider.addEventListener('input', () => {
      this.touched = true;
      this.showNotch();
    });
    byId('context-close').addEventListener('click', () => this.close());
    // Every way out (close button, Escape, backdrop) ends in the dialog's close event: save there.
    dialogs.register(this.dialog, () => this.saveOnClose());
    this.dialogs = dialogs;
  }

  get isOpen() {
    return this.dialog.open;
  }

  async open(convId, { readOnly = false } = {}) {
    this.convId = convId;
    this.readOnly = readOnly;
    this.ctx = null;
    this.touched = false;
    byId('context-body').hidden = true;
    byId('context-status').textContent = 'Loading…';
    byId('context-status').hidden = false;
    this.dialogs.open(this.dialog, byId('context-close'));
    await this.load(false);
    if (this.isOpen && !byId('window-section').hidden) this.slider.focus();
  }

  /** Another tab or the agent changed the conversation: reload, keeping a slider the user moved. */
  refresh(convId) {
    if (!this.isOpen || convId !== this.convId) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.load(this.touched), 250);
  }

  async load(keepSlider) {
    const id = this.convId;
    try {
      const { data } = await api(`/api/conversations/${id}/context`);
      if (this.isOpen && id === this.convId) this.render(data, keepSlider && this.ctx != null);
    } catch (err) {
      if (!this.isOpen || id !== this.convId || this.ctx) return;
      byId('context-status').textContent = err.message;
    }
  }

  close() {
    this.dialogs.close(this.dialog);
  }

  /** Save the window setting if the slider moved to another notch. */
  saveOnClose() {
    clearTimeout(this.timer);
    const index = Number(this.slider.value);
    const changed = this.ctx != null && this.ctx.supports_window && this.touched && index !== this.initial && !this.readOnly;
    if (changed) this.hooks.onSave(this.convId, this.ctx.notches[index] ?? null);
    this.touched = false;
  }

  render(ctx, keepSlider) {
    this.ctx = ctx;
    byId('context-status').hidden = true;
    byId('context-body').hidden = false;

    const used = ctx.used || 0;
    const scale = ctx.window || ctx.model_window || Math.max(used, 1);
    const bar = byId('context-bar');
    // No window known yet (an imported session before its first turn here): no bar, whose scale
    // would be the figure itself, a full bar that read as "the context is full".
    bar.hidden = !(ctx.window || ctx.model_window);
    bar.setAttribute('aria-valuemax', String(scale));
    bar.setAttribute('aria-valuenow', String(Math.min(used, scale)));
    bar.setAttribute('aria-valuetext', `${fmtTokens(used)} of ${fmtTokens(scale)} tokens`);
    byId('context-fill').style.width = `${Math.min(100, (used / scale) * 100)}%`;
    this.scale = scale;
    this.placeMarker(ctx.threshold);
    const level = ctx.threshold == null ? 'ok' : used >= ctx.threshold ? 'over' : used > 0.8 * ctx.threshold ? 'warn' : 'ok';
    bar.dataset.level = level;

    // Unknown until the agent reports (a fresh or just compacted conversation): "—", as the 🧠 button.
    const usedText = ctx.used == null ? '—' : fmtTokens(used);
    byId('context-used').textContent = ctx.window || ctx.model_window
      ? `${usedText} used of ${fmtTokens(scale)}`
      : `${usedText} used`;
    byId('context-free').textContent = `free until auto-compaction: ${ctx.free == null ? '—' : fmtTokens(ctx.free)}`;
    byId('context-model').textContent = ctx.model || 'known after the first turn';
    byId('context-model-window').textContent = ctx.model_window ? fmtTokens(ctx.model_window) : '—';
    byId('context-threshold').textContent = ctx.threshold == null ? '—' : `${fmtTokens(ctx.threshold)} (window ${fmtTokens(ctx.window)})`;

    const categories = Array.isArray(ctx.categories) ? ctx.categories : [];
    byId('context-categories-section').hidden = categories.length === 0;
    byId('context-categories').replaceChildren(...categories.map((c) =>
      h('li', { class: `category kind-${c.kind || 'used'}` },
        h('span', { class: 'category-name', text: c.name }),
        h('span', { class: 'category-tokens', text: fmtTokens(c.tokens) }))));

    const section = byId('window-section');
    section.hidden = !ctx.supports_window;
    if (!ctx.supports_window) return;
    const notches = ctx.notches || [null];
    this.slider.max = String(notches.length - 1);
    this.slider.disabled = Boolean(this.readOnly);
    byId('window-ticks').replaceChildren(...notches.map((value, i) => {
      const tick = h('span', { class: 'tick', 'aria-hidden': 'true', text: notchLabel(value) });
      tick.style.left = `${(i / Math.max(1, notches.length - 1)) * 100}%`;
      tick.addEventListener('click', () => {
        if (this.slider.disabled) return;
        this.slider.value = String(i);
        this.touched = true;
        this.showNotch();
      });
      return tick;
    }));
    if (!keepSlider) {
      this.initial = Math.max(0, notches.indexOf(ctx.setting ?? null));
      this.slider.value = String(this.initial);
      this.touched = false;
    }
    this.showNotch();
  }

  /** The slider moved (or loaded): its label, the note and the warning; nothing is saved yet. */
  showNotch() {
    const ctx = this.ctx;
    if (!ctx || !ctx.supports_window) return;
    const value = ctx.notches[Number(this.slider.value)] ?? null;
    const label = notchLabel(value);
    byId('window-label').textContent = label;
    this.slider.setAttribute('aria-valuetext', label);
    for (const [i, tick] of [...byId('window-ticks').children].entries()) {
      tick.classList.toggle('current', i === Number(this.slider.value));
    }
    // What a change would do, only when there is one: a new notch, or one not yet applied.
    const index = Number(this.slider.value);
    const changed = index !== this.initial || Boolean(ctx.pending_restart);
    byId('window-note').textContent = changed ? ctx.note || '' : '';
    byId('window-save').hidden = index === this.initial || Boolean(this.readOnly);
    const window = this.windowAt(value);
    this.placeMarker(window == null ? ctx.threshold : index === this.initial ? ctx.threshold : window - COMPACT_BUFFER);
    byId('window-line').textContent = ctx.line || '';
    // At the saved notch the relay's own verdict; elsewhere the same rule, computed here.
    const warn = index === this.initial && ctx.warning !== undefined ? Boolean(ctx.warning) : this.willCompact(value);
    byId('window-warning').hidden = !warn;
    const cap = byId('window-cap');
    const capped = value != null && ctx.model_window != null && value > ctx.model_window;
    cap.hidden = !capped;
    if (capped) cap.textContent = `The model's own window is ${fmtTokens(ctx.model_window)}: a larger setting stops there.`;
  }

  /** The threshold marker on the bar: where auto-compaction starts (null: hidden). */
  placeMarker(threshold) {
    const marker = byId('context-marker');
    marker.hidden = threshold == null;
    if (threshold == null) return;
    marker.style.left = `${Math.max(0, Math.min(100, (threshold / this.scale) * 100))}%`;
    marker.title = `Auto-compaction at ${fmtTokens(threshold)}`;
    marker.dataset.threshold = String(threshold);
  }

  /** The window in force at a notch (null when not known before the first turn). */
  windowAt(value) {
    const ctx = this.ctx;
    // Auto: the window Auto gives (the environment's, else the model's), even while the
    // conversation has a setting of its own.
    const chosen = value ?? ctx.auto_window ?? ctx.model_window;
    if (chosen == null) return null;
    return ctx.model_window ? Math.min(chosen, ctx.model_window) : chosen;
  }

  /** Would the window at this notch be already full? (used ≥ window in force − 33k) */
  willCompact(value) {
    const used = this.ctx.used || 0;
    const window = this.windowAt(value);
    if (used <= 0 || window == null) return false;
    return used >= window - COMPACT_BUFFER;
  }
}

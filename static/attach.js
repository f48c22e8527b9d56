// attach.js — images for the next message: pasted, dropped or picked with 📎, uploaded at once,
// shown as thumbnails above the message box (✕ removes one), sent with the message's text.
// The relay keeps what was uploaded and not sent: a reload, or another tab, shows it again.
import { h, api } from './util.js';

export const MAX_BYTES = 5 * 1024 * 1024 * 3 / 4; // app/attachments.py MAX_IMAGE_BYTES
export const MAX_PER_MESSAGE = 5; // app/attachments.py MAX_PER_MESSAGE
const TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];

/** An attached image's URL (its bytes, served with a sandboxing CSP). */
export const imageUrl = (id) => `/api/attachments/${encodeURIComponent(id)}`;

/** The thumbnails of a sent message's images, each a link to the whole image. */
export function sentImages(images) {
  if (!Array.isArray(images) || !images.length) return null;
  return h('div', { class: 'sent-images', testid: 'sent-images' }, images.map((image, n) =>
    h('a', { href: imageUrl(image.id), target: '_blank', rel: 'noopener noreferrer' },
      h('img', { src: imageUrl(image.id), alt: `Image ${n + 1}`, loading: 'lazy', testid: 'sent-image' }))));
}

export class Attachments {
  /** list: the thumbnails' <ul>; button: 📎; picker: its <input type=file>; onError(message);
   * onChange(): the composer's state changed (uploading, or the list). */
  constructor({ list, button, picker, onError, onChange }) {
    Object.assign(this, { list, button, picker, onError, onChange });
    this.byConversation = new Map(); // id → [{id, media_type, size}], oldest first
    this.current = null; // the conversation shown
    this.enabled = false; // its agent takes images, and it is not archived
    this.uploading = 0;
    button.addEventListener('click', () => picker.click());
    picker.addEventListener('change', () => {
      const files = [...picker.files];
      picker.value = ''; // (the same file can be picked again)
      this.add(files);
    });
  }

  /** The composer now shows conversation id; enabled: images can go with its messages. */
  show(id, enabled) {
    this.current = id;
    this.enabled = enabled;
    this.button.hidden = !enabled;
    this.draw();
    if (enabled && !this.byConversation.has(id)) this.load(id);
  }

  /** Read what the relay keeps unsent for a conversation. */
  async load(id) {
    try {
      const { data } = await api(`/api/conversations/${id}/attachments`);
      this.byConversation.set(id, data.attachments || []);
    } catch {
      return; // shown again on the next visit
    }
    if (id === this.current) this.draw();
  }

  /** The images waiting in the shown conversation. */
  get waiting() {
    return this.byConversation.get(this.current) || [];
  }

  /** True when dt (a paste's or a drop's DataTransfer) carries files. */
  static hasFiles(dt) {
    return Boolean(dt) && [...(dt.types || [])].includes('Files');
  }

  /** Upload files to the shown conversation, one after the other; what is not an image, or is
   * too big, is said (the relay checks again, from the bytes). */
  async add(files) {
    const id = this.current;
    if (!this.enabled || id == null) return;
    for (const file of files) {
      if (!TYPES.includes(file.type)) {
        this.onError(`${file.name || 'That file'} is not a PNG, JPEG, GIF or WebP image.`);
        continue;
      }
      if (file.size > MAX_BYTES) {
        this.onError(`${file.name || 'The image'} is over the limit of ${MAX_BYTES} bytes.`);
        continue;
      }
      this.uploading += 1;
      this.onChange();
      try {
        const { data } = await api(`/api/conversations/${id}/attachments`, { method: 'POST', body: file });
        this.byConversation.set(id, [...(this.byConversation.get(id) || []), data]);
      } catch (err) {
        this.onError(err.message);
      } finally {
        this.uploading -= 1;
        if (id === this.current) this.draw();
        this.onChange();
      }
    }
  }

  /** Take the shown conversation's images for a message being sent (at most MAX_PER_MESSAGE:
   * the others wait for the next one). */
  take() {
    const all = this.waiting;
    const taken = all.slice(0, MAX_PER_MESSAGE);
    this.byConversation.set(this.current, all.slice(MAX_PER_MESSAGE));
    this.draw();
    return taken;
  }

  /** Images of a message that did not go (or was taken back) wait again, first. */
  giveBack(id, images) {
    if (!images || !images.length) return;
    const known = new Set(images.map((image) => image.id));
    const rest = (this.byConversation.get(id) || []).filter((image) => !known.has(image.id));
    this.byConversation.set(id, [...images, ...rest]);
    if (id === this.current) this.draw();
    this.onChange();
  }

  async remove(image) {
    const id = this.current;
    try {
      await api(`/api/conversations/${id}/attachments/${image.id}`, { method: 'DELETE' });
    } catch (err) {
      if (err.status !== 404) return this.onError(err.message); // 404: sent or removed already
    }
    this.byConversation.set(id, (this.byConversation.get(id) || []).filter((i) => i.id !== image.id));
    if (id === this.current) this.draw();
    this.onChange();
  }

  draw() {
    const images = this.enabled ? this.waiting : [];
    this.list.replaceChildren(...images.map((image, n) => h('li', { class: 'attached', testid: 'attached' },
      h('img', { src: imageUrl(image.id), alt: `Image ${n + 1}` }),
      h('button', {
        type: 'button', class: 'attached-remove', testid: 'attached-remove', text: '✕',
        'aria-label': `Remove image ${n + 1}`, title: 'Remove this image',
        onclick: () => this.remove(image),
      }))));
    if (this.uploading && this.enabled) {
      this.list.append(h('li', { class: 'attached uploading', testid: 'attached-uploading', text: 'Uploading…' }));
    }
    this.list.hidden = !this.list.children.length;
  }
}

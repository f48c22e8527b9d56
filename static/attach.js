// attach.js — images for the next message: pasted, dropped or picked with 📎, uploaded at once,
// shown as thumbnails above the message box (✕ removes one), sent with the message's text.
// The relay keeps what was uploaded and not sent: a reload, or another tab, shows it again.
import { h, api } from './util.js';

export const MAX_BYTES = 5 * 1024 * 1024 * 3 / 4; // app/attachments.py MAX_IMAGE_BYTES
export const MAX_PER_MESSAGE = 5; // app/attachments.py MAX_PER_MESSAGE
const TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];

/** True when dt (a paste's or a drag's DataTransfer) carries files. */
export const hasFiles = (dt) => Boolean(dt) && [...(dt.types || [])].includes('Files');

/** Files dragged or pasted (a DataTransfer) that are images. */
export const imageFiles = (dt) => [...((dt && dt.files) || [])].filter((file) => file.type.startsWith('image/'));

/** An attached image's URL (its bytes, served with a sandboxing CSP). */
export const imageUrl = (id) => `/api/attachments/${encodeURIComponent(id)}`;

/** An image that cannot be shown (gone, unreadable) says so in words, not with the browser's
 * broken-image icon. */
function unavailable(e) {
  const img = e.target;
  const box = img.closest('a') || img;
  box.replaceWith(h('span', { class: 'image-gone', testid: 'image-gone', role: 'img', 'aria-label': img.alt, text: 'Image unavailable' }));
}

/** The thumbnails of a sent message's images, each a link to the whole image. */
export function sentImages(images) {
  if (!Array.isArray(images) || !images.length) return null;
  return h('div', { class: 'sent-images', testid: 'sent-images' }, images.map((image, n) =>
    h('a', { href: imageUrl(image.id), target: '_blank', rel: 'noopener noreferrer' },
      h('img', { src: imageUrl(image.id), alt: `Image ${n + 1}`, loading: 'lazy', testid: 'sent-image', onerror: unavailable }))));
}

/** The relay's refusal of a file's bytes, naming the file (several may be picked at once). */
function refusal(err, name) {
  if (!name) return err.message;
  if (err.status === 415) return `${name} is not a PNG, JPEG, GIF or WebP image.`; // (as said above)
  return err.message.startsWith('The image ') ? `${name} ${err.message.slice('The image '.length)}` : err.message;
}

export class Attachments {
  /** list: the thumbnails' <ul>; button: 📎; picker: its <input type=file>; onError(message, id):
   * something went wrong for conversation id; onChange(): the composer's state changed. */
  constructor({ list, button, picker, onError, onChange }) {
    Object.assign(this, { list, button, picker, onError, onChange });
    this.byConversation = new Map(); // id → [{id, media_type, size}], oldest first (the relay's)
    this.changes = new Map(); // id → how many times its list changed: a list read before is old
    this.uploads = new Map(); // id → uploads on their way to that conversation
    this.current = null; // the conversation shown
    this.enabled = false; // its agent takes images, and it is not archived
    button.addEventListener('click', () => picker.click());
    picker.addEventListener('change', () => {
      const files = [...picker.files];
      picker.value = ''; // (the same file can be picked again)
      this.add(files);
    });
  }

  /** The composer now shows conversation id; enabled: images can go with its messages. */
  show(id, enabled) {
    if (id === this.current && enabled === this.enabled) return; // (drawn: focus stays)
    this.current = id;
    this.enabled = enabled;
    this.button.hidden = !enabled;
    this.draw();
    if (enabled && !this.byConversation.has(id)) this.load(id);
  }

  /** Read what the relay keeps unsent for a conversation. */
  async load(id) {
    const asked = this.changes.get(id) || 0;
    try {
      const { data } = await api(`/api/conversations/${id}/attachments`);
      // An event (an upload, a send) changed the list while this answer was on its way: it is
      // the newer one.
      if ((this.changes.get(id) || 0) === asked) this.set(id, data.attachments || []);
    } catch { /* shown again on the next visit */ }
  }

  /** The relay's list for a conversation (an `attachments` event: another tab, a send). */
  set(id, images) {
    this.keep(id, images);
    if (id === this.current) this.draw();
    this.onChange();
  }

  /** Keep a conversation's list (each change counted: see load). */
  keep(id, images) {
    this.byConversation.set(id, images);
    this.changes.set(id, (this.changes.get(id) || 0) + 1);
  }

  /** The images waiting in the shown conversation. */
  get waiting() {
    return this.byConversation.get(this.current) || [];
  }

  /** Uploads on their way to the shown conversation. */
  get uploading() {
    return this.uploads.get(this.current) || 0;
  }

  /** Upload files to the shown conversation, one after the other; what is not an image, or is
   * too big, is said (the relay checks again, from the bytes). */
  async add(files) {
    const id = this.current;
    if (!this.enabled || id == null) return;
    for (const file of files) {
      const name = file.name || 'The image';
      if (!TYPES.includes(file.type)) {
        this.onError(`${name} is not a PNG, JPEG, GIF or WebP image.`, id);
        continue;
      }
      if (file.size > MAX_BYTES) {
        this.onError(`${name} is over the limit of 3.75 MiB.`, id);
        continue;
      }
      this.counted(id, 1);
      try {
        const { data } = await api(`/api/conversations/${id}/attachments`, { method: 'POST', body: file });
        const known = this.byConversation.get(id) || [];
        if (!known.some((image) => image.id === data.id)) this.keep(id, [...known, data]);
      } catch (err) {
        this.onError(refusal(err, file.name), id);
      } finally {
        this.counted(id, -1);
      }
    }
  }

  counted(id, step) {
    this.uploads.set(id, (this.uploads.get(id) || 0) + step);
    if (id === this.current) this.draw();
    this.onChange();
  }

  /** Take the shown conversation's images for a message being sent (at most MAX_PER_MESSAGE:
   * the others wait for the next one). */
  take() {
    const all = this.waiting;
    const taken = all.slice(0, MAX_PER_MESSAGE);
    this.keep(this.current, all.slice(MAX_PER_MESSAGE));
    this.draw();
    return taken;
  }

  /** Images of a message that did not go, or was taken back, wait again: the relay's list is
   * read again (it holds them unsent; /compact may have moved them). */
  giveBack(id, images) {
    if (images && images.length) this.load(id);
  }

  async remove(image, n) {
    const id = this.current;
    try {
      await api(`/api/conversations/${id}/attachments/${image.id}`, { method: 'DELETE' });
    } catch (err) {
      if (err.status !== 404) return this.onError(err.message, id); // 404: sent or removed already
    }
    this.keep(id, (this.byConversation.get(id) || []).filter((i) => i.id !== image.id));
    if (id !== this.current) return;
    this.draw();
    this.onChange();
    // The focus goes to the next image's ✕ (the one before it at the end), else the message box.
    const buttons = this.list.querySelectorAll('.attached-remove');
    (buttons[Math.min(n, buttons.length - 1)] || document.getElementById('message-input')).focus();
  }

  draw() {
    const images = this.enabled ? this.waiting : [];
    this.list.replaceChildren(...images.map((image, n) => h('li', { class: 'attached', testid: 'attached' },
      h('img', { src: imageUrl(image.id), alt: `Image ${n + 1} (${image.media_type.slice(6).toUpperCase()})`, onerror: unavailable }),
      h('button', {
        type: 'button', class: 'attached-remove', testid: 'attached-remove', text: '✕',
        'aria-label': `Remove image ${n + 1}`, title: 'Remove this image',
        onclick: () => this.remove(image, n),
      }))));
    if (this.uploading && this.enabled) {
      this.list.append(h('li', { class: 'attached uploading', testid: 'attached-uploading', text: 'Uploading…' }));
    }
    this.list.hidden = !this.list.children.length;
  }
}

// notify.js — browser notifications (SPEC §9): a turn ended, or an agent asks permission, in a
// conversation this page is not looking at. Permission is asked from the "Notify me" button only,
// never on load. The service worker (sw.js) makes the app installable and shows Web Push
// notifications when no page is open.

import { api, byId } from './util.js';

const FLAG = 'oarlock.notify'; // 'on': this browser turned notifications on
const WORKER = '/static/sw.js';
// Tabs of one browser tell each other which conversation one of them is looking at when an
// event of it comes: the others wait this long for that before they notify.
const LOOKING = 'oarlock.looking';
const LOOKING_WAIT_MS = 300;

/** Base64url text of an ArrayBuffer (a push subscription's applicationServerKey). */
function b64url(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = '';
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

export class Notify {
  /**
   * send(message) writes to the socket; current() is the id of the conversation on screen (or
   * null); open(id) shows a conversation.
   */
  constructor({ send, current, open }) {
    this.send = send;
    this.current = current;
    this.open = open;
    this.button = byId('notify-button');
    this.registration = null;
    this.looked = new Map(); // conversation id → when another tab said it is looking at it
    this.channel = 'BroadcastChannel' in window ? new BroadcastChannel(LOOKING) : null;
    if (this.channel) {
      this.channel.onmessage = ({ data }) => {
        if (data && Number.isInteger(data.looking)) this.looked.set(data.looking, Date.now());
      };
    }
  }

  start() {
    if (!('Notification' in window)) return; // the button stays hidden
    this.button.hidden = false;
    this.button.addEventListener('click', () => this.toggle());
    document.addEventListener('visibilitychange', () => this.sendPresence());
    this.render();
    this.register();
  }

  /** True when this browser wants notifications and allows them. */
  get on() {
    return 'Notification' in window && Notification.permission === 'granted' && localStorage.getItem(FLAG) === 'on';
  }

  render() {
    const button = this.button;
    const blocked = Notification.permission === 'denied';
    button.textContent = blocked ? '🔕 Notifications blocked' : this.on ? '🔔 Notifications on' : '🔔 Notify me';
    button.setAttribute('aria-pressed', String(this.on));
    if (!window.isSecureContext) button.title = 'Browsers allow notifications only from https:// pages (or localhost)';
    else if (blocked) button.title = 'Allow notifications for this site in the browser’s settings, then click again';
    else if (this.on) button.title = 'Click to turn notifications off in this browser';
    else button.title = 'Be notified when a turn ends or an agent asks permission in a conversation you are not looking at';
  }

  async toggle() {
    if (this.on) {
      localStorage.removeItem(FLAG);
      this.render();
      await this.unsubscribe();
      return;
    }
    const permission = await Notification.requestPermission();
    if (permission === 'granted') localStorage.setItem(FLAG, 'on');
    this.render();
    if (this.on) await this.subscribe();
  }

  /** Register the service worker (it asks nothing); keep this browser's push subscription current. */
  async register() {
    if (!('serviceWorker' in navigator)) return; // not a secure context (http to another host)
    try {
      this.registration = await navigator.serviceWorker.register(WORKER, { scope: '/' });
    } catch {
      return;
    }
    navigator.serviceWorker.addEventListener('message', (event) => {
      const data = event.data || {};
      if (data.type === 'open' && Number.isSafeInteger(data.conversation_id)) this.open(data.conversation_id);
    });
    if (this.on) await this.subscribe(); // a new login, or a subscription the relay forgot
  }

  /** Subscribe to Web Push and give the subscription to the relay (none: page notifications only). */
  async subscribe() {
    const registration = this.registration;
    if (!registration || !registration.pushManager) return;
    try {
      const { data } = await api('/api/push/key');
      let subscription = await registration.pushManager.getSubscription();
      const key = subscription && subscription.options.applicationServerKey;
      if (subscription && (!key || b64url(key) !== data.public_key)) {
        await subscription.unsubscribe(); // made for another relay key
        subscription = null;
      }
      if (!subscription) {
        subscription = await registration.pushManager.subscribe({
          userVisibleOnly: true,
          applicationServerKey: data.public_key,
        });
      }
      await api('/api/push/subscriptions', { method: 'POST', body: subscription.toJSON() });
      this.button.dataset.push = 'on';
    } catch {
      // No push service here (some browsers, headless ones): notifications while a page is open.
      this.button.dataset.push = 'off';
    }
  }

  async unsubscribe() {
    const registration = this.registration;
    if (!registration || !registration.pushManager) return;
    try {
      const subscription = await registration.pushManager.getSubscription();
      if (!subscription) return;
      await api('/api/push/subscriptions', { method: 'DELETE', body: { endpoint: subscription.endpoint } });
      await subscription.unsubscribe();
    } catch {
      // The relay forgets it anyway when the push service says it is gone.
    }
    this.button.dataset.push = 'off';
  }

  /** Tell the relay whether this page is visible: no Web Push to a browser showing a page. */
  sendPresence() {
    this.send({ type: 'presence', visible: document.visibilityState === 'visible' });
  }

  /** A notify event: show it unless this page, or another tab of this browser, is visible and
   *  on that conversation (that tab says so when the same event reaches it). */
  onNotify(message) {
    const id = message.conversation_id;
    if (document.visibilityState === 'visible' && this.current() === id) {
      if (this.channel) this.channel.postMessage({ looking: id });
      return;
    }
    if (!this.on) return;
    if (!this.channel) {
      this.show(message);
      return;
    }
    const arrived = Date.now();
    setTimeout(() => {
      if ((this.looked.get(id) ?? 0) >= arrived - LOOKING_WAIT_MS) return; // looked at there
      if (this.on) this.show(message);
    }, LOOKING_WAIT_MS);
  }

  show(message) {
    const title = message.title || 'oarlock';
    const options = {
      body: message.body,
      tag: `oarlock-${message.conversation_id}`, // a Web Push of the same event replaces it
      icon: '/static/icon-192.png',
      data: { conversation_id: message.conversation_id },
    };
    try {
      const notification = new Notification(title, options);
      notification.addEventListener('click', () => {
        window.focus();
        this.open(message.conversation_id);
        notification.close();
      });
    } catch {
      // Android's Chrome shows notifications from the service worker only (its click opens it).
      if (this.registration) this.registration.showNotification(title, options).catch(() => {});
    }
  }
}

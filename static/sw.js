// sw.js — the service worker: shows Web Push notifications and opens the conversation clicked.
// It caches nothing and handles no fetch: every page and API call goes to the relay as usual.

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

/** The notification a push asks for: the conversation's title and one short line. */
function fromPush(data) {
  const id = Number.isSafeInteger(data.conversation_id) ? data.conversation_id : null;
  return {
    title: typeof data.title === 'string' && data.title ? data.title : 'oarlock',
    options: {
      body: typeof data.body === 'string' ? data.body : '',
      tag: id == null ? 'oarlock' : `oarlock-${id}`, // the page's own notification has the same tag
      icon: '/static/icon-192.png',
      data: { conversation_id: id },
    },
  };
}

self.addEventListener('push', (event) => {
  let data = {};
  try {
    data = event.data ? event.data.json() : {};
  } catch {
    data = {};
  }
  const { title, options } = fromPush(data || {});
  event.waitUntil(self.registration.showNotification(title, options));
});

/** A window running the app (its list or a conversation), which opens what it is told; not a
 *  backup file, the API docs or the login page of the same origin, which would not. */
function appWindow(windows, origin) {
  return windows.find((client) => {
    const url = new URL(client.url);
    return url.origin === origin && (url.pathname === '/' || url.pathname.startsWith('/c/'));
  });
}

self.addEventListener('notificationclick', (event) => {
  event.notification.close();
  const id = event.notification.data ? event.notification.data.conversation_id : null;
  const url = new URL(id == null ? '/' : `/c/${id}`, self.location.origin).href;
  event.waitUntil((async () => {
    const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
    const page = appWindow(windows, self.location.origin);
    if (!page) return self.clients.openWindow(url);
    await page.focus();
    page.postMessage({ type: 'open', conversation_id: id }); // the page opens it (static/notify.js)
    return undefined;
  })());
});

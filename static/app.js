// app.js — the oarlock browser UI: state, the WebSocket, the sidebar, routing, the chat's
// header and notices, the composer with /compact, and the dialogs.
import { h, api, byId, fmtTokens, isBusy, isolate, toLogin } from './util.js';
import { Timeline, visible } from './timeline.js';
import { ClearDialog, HandoffSection, pendingLabel, renderWatch } from './handoff.js';
import { ContextModal } from './context.js';
import { Backups } from './backups.js';
import { Changes } from './changes.js';
import { Search } from './search.js';
import { ConvActions, convDescription, convMeta, convState, setPageTitle, showNeeds } from './keep.js';
import { Imports, renderResume } from './import.js';
import { CarryRecords, CompactPreview, Pins } from './steer.js';
import { Notify } from './notify.js';
import { markRefusedModes, ModeControl, ModelControl } from './mode.js';
import { Attachments, hasFiles, imageFiles } from './attach.js';

const IDLE = { state: 'idle', queued: 0 };
const COMMANDS = [
  { name: '/compact', description: 'Start a new conversation with a carry-over summary' },
  { name: '/handoff', description: 'Ask the agent to save a handoff for this project now' },
  { name: '/clear', description: 'Start a fresh conversation with the latest handoff' },
];

const IMAGES_MAKE_TEXT = 'Sent to the agent as text while images are attached';

// ---- state -------------------------------------------------------------------------------------

const state = {
  epoch: null, // the relay's epoch, from the socket's hello
  providers: [],
  defaultProvider: null,
  providersLoaded: false,
  convs: new Map(), // every conversation the sidebar knows, by id
  removed: new Map(), // deleted conversations' id -> created_at: a late answer never revives one
  archiveQuery: '',
  // The open conversation: { id, loaded, conv, turn, seq, epoch, waiting, waitingSince }
  current: null,
  opening: 0, // bumps on every open, so a slow answer for an older open is dropped
  drafts: new Map(), // unsent text per conversation
  reveal: null, // a search hit to scroll to once its conversation is open: { conversationId, entryId }
};

// Which is newer, an HTTP answer about a conversation or the socket's last word on it? The relay
// broadcasts every change of a conversation's fields (a turn's begin and end too) after storing
// it, so an answer whose request went out before the socket's last `conversation` event about
// that conversation may predate the event: it then only fills in fields the tab lacks. (Applied
// blindly, an answer computed before a turn began and read after its broadcast kept the sidebar's
// "running" off for the whole turn.) A later change always comes as a later event.
const feed = { clock: 0, seen: new Map() }; // events counted; conversation id -> count at its last

/** True when the socket told of this conversation after a request that went out at `asked`. */
const overtaken = (id, asked) => asked != null && (feed.seen.get(id) || 0) > asked;

/** The conversation as the tab should hold it after this answer (asked: feed.clock at request). */
function merged(conv, asked) {
  const old = state.convs.get(conv.id);
  return overtaken(conv.id, asked) ? { ...conv, ...old } : { ...old, ...conv };
}

// Did the page's first lists miss a global event? They may be read before the socket is
// registered for the global feed: an event broadcast in between reaches neither. The relay
// counts its global feed; each list answer carries the count before its read, the hello the count
// at registration (docs/api.md, `feed`). Only a hello past the lists' count (or from another
// process) means something happened in the gap: the lists are read again, once.
const gap = { lists: null, hello: null, checked: false }; // the first lists' feeds, the first hello

function checkGap() {
  if (gap.checked || !gap.lists || !gap.hello) return;
  gap.checked = true;
  const hello = gap.hello.feed;
  const missed = gap.lists.some((f) => !hello || !f || f.id !== hello.id || f.count < hello.count);
  if (missed) loadLists().catch(() => {});
}

const isArchived = (conv) => Boolean(conv) && conv.status === 'archived';
const newestFirst = (a, b) =>
  (Date.parse(b.updated_at) || 0) - (Date.parse(a.updated_at) || 0) || b.id - a.id;
const providerName = (id) => (state.providers.find((p) => p.id === id) || {}).name || id;
const refusedModes = (id) => (state.providers.find((p) => p.id === id) || {}).refused_modes || {};

// ---- dialogs -----------------------------------------------------------------------------------

/** Native modal <dialog>s: focus goes in on open and back on close; a backdrop click closes. */
const dialogs = {
  register(dialog, onClosed) {
    let downOnBackdrop = false;
    dialog.addEventListener('pointerdown', (e) => { downOnBackdrop = e.target === dialog; });
    dialog.addEventListener('click', (e) => {
      if (e.target === dialog && downOnBackdrop) dialogs.close(dialog);
      downOnBackdrop = false;
    });
    // An Enter held down (from the composer's "/compact" or a confirmation before) repeats
    // onto the button the dialog focused: a repeat confirms nothing, a fresh press does.
    dialog.addEventListener('keydown', (e) => {
      if (e.repeat && e.key === 'Enter' && e.target.closest('button')) e.preventDefault();
    }, true);
    // Escape, the close button and the backdrop all end here.
    dialog.addEventListener('close', () => {
      if (onClosed) onClosed();
      let back = dialog.returnFocus; // an element, or a function finding it now
      dialog.returnFocus = null;
      if (typeof back === 'function') back = back();
      if (back && back.isConnected && !document.querySelector('dialog[open]')) back.focus({ preventScroll: true });
    });
  },
  open(dialog, focus) {
    if (!dialog.open) {
      dialog.returnFocus = document.activeElement;
      dialog.showModal();
    }
    if (focus) focus.focus();
  },
  close(dialog) {
    if (dialog.open) dialog.close();
  },
};

let toastTimer = 0;
/** Say something for a few seconds; action: { label, run }, a button after the text. A toast
 *  with a button stays until used or dismissed (✕, or Esc in it): reached by Tab, it must not
 *  go away while someone is on their way to it. */
function toast(message, action = null) {
  const el = byId('toast');
  el.textContent = message;
  clearTimeout(toastTimer);
  if (action) {
    el.append(
      ' ',
      h('button', { type: 'button', class: 'toast-action', text: action.label, onclick: () => { hideToast(); action.run(); } }),
      h('button', { type: 'button', class: 'toast-dismiss', 'aria-label': 'Dismiss', text: '✕', onclick: hideToast }),
    );
  } else {
    toastTimer = setTimeout(() => { el.hidden = true; }, 6000);
  }
  el.hidden = false;
}
function hideToast() {
  const el = byId('toast');
  const focused = el.contains(document.activeElement);
  el.hidden = true;
  if (focused) byId('message-input').focus(); // the keyboard goes back to the composer
}
byId('toast').addEventListener('keydown', (event) => {
  if (event.key === 'Escape') hideToast();
});

/** A message a line's button sent again, shown queued in conversation cur (still open) unless
 * the socket showed it already: the answer (queued) is older than what the socket said. */
function showResent(cur, sent) {
  if (state.current === cur && sent && sent.id != null && !timeline.has(sent.id)) timeline.upsert(sent);
}

const timeline = new Timeline({
  onPermission: async (entry, allow, answers, more = {}) => { // more: a plan's mode, a message
    const cur = state.current;
    const { data } = await api(`/api/conversations/${cur.id}/permissions/${entry.id}`, {
      method: 'POST', body: answers ? { allow, answers, ...more } : { allow, ...more },
    });
    if (state.current === cur && data && data.id != null) timeline.upsert(data);
  },
  onResend: async (line) => {
    const cur = state.current;
    const { data } = await api(`/api/conversations/${cur.id}/messages/${line.data.entry_id}/resend`, {
      method: 'POST',
    });
    showResent(cur, data);
  },
  onTrust: async (line) => {
    const cur = state.current;
    const { data } = await api(`/api/conversations/${cur.id}/lines/${line.id}/trust`, { method: 'POST' });
    showResent(cur, data && data.message);
  },
  onWithdraw: (entry) => withdraw(entry),
  onLoadEarlier: () => loadEarlier(),
  onPin: (entry, on) => pins.toggle(entry.id, on),
});
const pins = new Pins({
  changed: (ids, editable) => timeline.setPins(ids, editable),
  error: (message) => toast(message),
});
const carryRecords = new CarryRecords();

const contextModal = new ContextModal({
  onSave: async (closedId, value) => {
    // Compacted in another tab while the modal was open: the setting goes on to the conversation
    // it continues in (a compaction carries the window over); before, an "archived" error toast.
    const id = successorOf(closedId);
    try {
      const asked = feed.clock;
      const { data } = await api(`/api/conversations/${id}`, {
        method: 'PATCH', body: { auto_compact_window: value },
      });
      onConversation(data, asked);
    } catch (err) {
      toast(`The auto-compact window was not saved: ${err.message}`);
    }
  },
}, dialogs);

const modeControl = new ModeControl({
  current: () => (state.current && state.current.loaded ? state.current.conv : null),
  save: async (id, mode) => {
    const asked = feed.clock;
    const { data } = await api(`/api/conversations/${id}`, { method: 'PATCH', body: { permission_mode: mode } });
    onConversation(data, asked);
  },
  refused: (message) => toast(`The permission mode was not changed: ${message}`),
  refusedModes,
}, dialogs);

const attachments = new Attachments({
  list: byId('attachments'),
  button: byId('attach-button'),
  picker: byId('attach-input'),
  onError: (message, id) => (state.current && state.current.id === id ? showComposerError(message) : toast(message)),
  onChange: () => {
    updateComposer();
    if (menuOpen() && menu.kind === 'command') updateMenu(); // (an image from another tab)
  },
});

const modelControl = new ModelControl({
  current: () => (state.current && state.current.loaded ? state.current.conv : null),
  save: async (id, model) => {
    const asked = feed.clock;
    const { data } = await api(`/api/conversations/${id}`, { method: 'PATCH', body: { chosen_model: model } });
    onConversation(data, asked);
  },
  refused: (message) => toast(`The model was not changed: ${message}`),
});

const backups = new Backups({
  current: () => {
    const cur = state.current;
    return cur && cur.loaded ? { id: cur.id, archived: isArchived(cur.conv) } : null;
  },
  onFresh: (conv) => {
    onConversation(conv);
    navigate(conv.id, { focus: true });
  },
}, dialogs);

// The header's Changes: what git sees changed in the conversation's repository.
const changes = new Changes(dialogs);

// Find and keep (SPEC §9): the search box, and each sidebar item's ⋯ menu.
const search = new Search({ onOpen: (hit) => openAt(hit) });
const convActions = new ConvActions({
  get: (id) => state.convs.get(id),
  clock: () => feed.clock, // taken before a request: its answer may be older than the socket
  changed: (conv, asked) => onConversation(conv, asked),
  removed: (id) => onRemoved(id),
  dialogs,
});

const notify = new Notify({
  send: (message) => send(message),
  current: () => (state.current ? state.current.id : null),
  open: (id) => navigate(id),
});

// ---- socket ------------------------------------------------------------------------------------

const socket = { ws: null, backoff: 500, retry: 0, ping: 0, helloSeen: false, leaving: false };

function connect() {
  clearTimeout(socket.retry);
  const ws = new WebSocket(`${location.protocol === 'https:' ? 'wss://' : 'ws://'}${location.host}/ws`);
  socket.ws = ws;
  let opened = false;
  ws.addEventListener('open', () => {
    opened = true;
  });
  ws.addEventListener('message', (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch {
      return;
    }
    // A frame holds one event (an object) or several in order (an array).
    for (const one of Array.isArray(message) ? message : [message]) onSocketMessage(one);
  });
  ws.addEventListener('close', (event) => {
    if (socket.ws !== ws) return;
    socket.ws = null;
    clearInterval(socket.ping);
    if (socket.leaving) return; // this tab is logging out: its own navigation goes to /login
    byId('connection-status').hidden = false;
    if (event.code === 4401) { // the relay ended this session (a log out, here or in another tab)
      // Straight to /login: probing the API first would get a 401 that Chromium logs as a
      // console error, and a reconnect would be refused (logged too).
      toLogin();
      return;
    }
    // A refused socket (the handshake fails before opening: code 1006 in browsers) may mean
    // the session ended: an API call sends a logged-out tab to /login.
    if (!opened || [1008, 4403].includes(event.code)) api('/api/providers').catch(() => {});
    socket.retry = setTimeout(connect, socket.backoff);
    socket.backoff = Math.min(socket.backoff * 2, 5000);
  });
}

function send(message) {
  if (!socket.ws || socket.ws.readyState !== WebSocket.OPEN) return false;
  socket.ws.send(JSON.stringify(message));
  return true;
}

function onSocketMessage(message) {
  switch (message.type) {
    case 'hello': {
      const reconnected = socket.helloSeen;
      socket.helloSeen = true;
      state.epoch = message.epoch;
      socket.backoff = 500;
      byId('connection-status').hidden = true;
      if (byId('composer-error').dataset.offline === 'true') hideComposerError(); // reachable again
      clearInterval(socket.ping);
      socket.ping = setInterval(() => send({ type: 'ping' }), 25000);
      if (reconnected) {
        loadLists().catch(() => {}); // sidebar events may have been missed (asked after this hello)
      } else {
        gap.hello = message;
        checkGap();
      }
      subscribe(true);
      notify.sendPresence();
      if (warmPending != null && state.current && state.current.id === warmPending) warmAgent();
      warmPending = null;
      return;
    }
    case 'snapshot':
      onSnapshot(message.conversation);
      return;
    case 'resync':
      subscribe(false);
      return;
    case 'notify':
      notify.onNotify(message);
      return;
    case 'pong':
    case 'presence':
    case 'warm': // the answer to a warm-up; the agent events that follow say the rest
      return;
    case 'error':
      // A conversation deleted while this tab was away (its subscribe's answer): dropped, as a
      // conversation_removed would have done.
      if (message.gone && message.conversation_id != null) onRemoved(message.conversation_id);
      else console.warn('oarlock relay:', message.detail);
      return;
    case 'conversation_removed':
      onRemoved(message.conversation_id);
      return;
    case 'conversation':
      if (message.seq == null) { // the global feed: sidebar (and header) only
        if (message.conversation && message.conversation.id != null) {
          feed.clock += 1;
          feed.seen.set(message.conversation.id, feed.clock);
        }
        onConversation(message.conversation);
        return;
      }
      break;
    default:
      break;
  }
  if (message.conversation_id != null && message.seq != null) onConversationEvent(message);
}

/** Follow the open conversation, from the last event applied (or ask for a snapshot). */
function subscribe(withSeq) {
  const cur = state.current;
  if (!cur || !cur.loaded) return;
  const message = { type: 'subscribe', conversation_id: cur.id };
  if (withSeq && cur.epoch != null) {
    message.epoch = cur.epoch;
    message.seq = cur.seq;
  }
  if (send(message)) {
    cur.waiting = true;
    cur.waitingSince = Date.now();
  }
}

function onConversationEvent(message) {
  const cur = state.current;
  if (!cur || !cur.loaded || message.conversation_id !== cur.id) {
    if (message.type === 'conversation') onConversation(message.conversation);
    return;
  }
  if (message.seq <= cur.seq) return; // already applied (a replay overlapping the live feed)
  if (message.seq !== cur.seq + 1) {
    // A gap: ask again from the last event applied; the relay replays or sends a snapshot.
    if (!cur.waiting || Date.now() - cur.waitingSince > 3000) subscribe(true);
    return;
  }
  cur.seq = message.seq;
  cur.waiting = false;
  switch (message.type) {
    case 'entry': {
      const before = timeline.stateOf(message.entry.id);
      timeline.upsert(message.entry);
      sayArrived(message.entry, before);
      handoffSection.onEntry(cur.id, message.entry);
      break;
    }
    case 'entry_removed': timeline.remove(message.entry_id); break;
    case 'delta': timeline.delta(message.entry_id, message.text, message.html, message.rendered); break;
    case 'turn': setTurn(message.turn); break;
    case 'agent': setAgent(message.agent); break;
    case 'conversation': onConversation(message.conversation); break;
    case 'pins': pins.set(cur.id, message.pins || []); break;
    case 'attachments': attachments.set(cur.id, message.attachments || []); break;
    case 'compacted':
      onConversation(message.into);
      // Opened when archived already (Back to it, a link): read there, not followed. (A CI
      // run: the event, replayed to the tab gone Back, sent it forward to the new one again.)
      if (cur.openedArchived) break;
      if (compactPreview.onCompacted(cur.id)) toast('This conversation was compacted in another tab; you are now in the new one.');
      followCompaction(message.into.id);
      break;
    default: break;
  }
}

// ---- screen readers: what arrives, said once ----------------------------------------------------

let saying = null; // what is about to be said: the words of one burst, joined
const SAID_KEPT = 5; // the lines #announce keeps (the older ones dropped as new ones come)
/** Say text to screen readers: a new line in #announce, a log whose added lines are read in
 *  turn (a question said, then the reply before it ended a moment later: replacing the
 *  region's text lost the question, as a CI run showed). Said together with what came in the
 *  same moment (a question in one frame with the end of the reply before it), questions first;
 *  the same words again are a new line, said again. */
function announce(text, first = false) {
  if (saying) {
    saying.parts[first ? 'unshift' : 'push'](text);
    return;
  }
  saying = { parts: [text] };
  setTimeout(() => {
    const el = byId('announce');
    el.append(h('div', { text: saying.parts.join(' ') }));
    saying = null;
    while (el.childElementCount > SAID_KEPT) el.firstElementChild.remove();
  }, 60);
}

/** Markdown as words to hear: marks dropped, clipped. */
function spoken(text, limit = 400) {
  const words = String(text).replace(/```[\s\S]*?```/g, ' (code) ').replace(/[*_`#>|~]+/g, '').replace(/\s+/g, ' ').trim();
  return words.length > limit ? `${words.slice(0, limit)}…` : words;
}

const QUESTIONS = { AskUserQuestion: 'The agent asks you.', ExitPlanMode: 'The plan waits for your answer.' };

/** A finished agent message or a new question of the open conversation, as it arrives. */
function sayArrived(entry, before) {
  const data = entry.data || {};
  if (entry.kind === 'agent' && entry.state === 'done' && before !== 'done' && entry.text) {
    announce(`Agent: ${spoken(entry.text)}`);
  } else if (entry.kind === 'activity' && data.type === 'permission' && entry.state === 'pending' && before == null) {
    announce(QUESTIONS[data.tool] || `${data.tool || 'The agent'} waits for your answer.`, true);
  }
}

let listsRead = false; // the lists' first pages are in
let waitingIds = null; // the conversations that needed the user at the last drawing since
/** Another conversation that newly needs the user (a question), said once. */
function sayNeeds(all) {
  if (!listsRead) return;
  const now = new Set(all.filter((c) => convState(c) === 'waiting').map((c) => c.id));
  const cur = state.current && state.current.id;
  if (waitingIds) {
    const fresh = all.filter((c) => now.has(c.id) && !waitingIds.has(c.id) && c.id !== cur);
    if (fresh.length) announce(fresh.map((c) => `“${c.title || 'Untitled'}” needs you.`).join(' '));
  }
  waitingIds = now;
}

function onSnapshot(data) {
  const cur = state.current;
  if (!data || !cur || data.id !== cur.id) return;
  if (cur.conv && !isArchived(cur.conv) && isArchived(data) && data.compacted_into_id != null) {
    // Compacted while this tab was away (its 'compacted' event was not replayed): it follows
    // into the new conversation as the tabs that were there did, with what was typed.
    followCompaction(data.compacted_into_id);
    return;
  }
  showConversation(data, { keepScroll: true });
}

// ---- conversations (sidebar) -------------------------------------------------------------------

/** True for a conversation this tab saw deleted (an answer sent before the delete, read after). */
function isRemoved(conv) {
  return state.removed.has(conv.id) && state.removed.get(conv.id) === conv.created_at;
}

/** A conversation's fields changed: sidebar, and the header if it is the open one. */
function onConversation(conv, asked = null) { // asked: feed.clock when an HTTP request went out
  if (!conv || conv.id == null || isRemoved(conv)) return;
  const stale = overtaken(conv.id, asked);
  state.convs.set(conv.id, merged(conv, asked));
  renderLists();
  convActions.seen(state.convs.get(conv.id));
  const cur = state.current;
  if (cur && cur.id === conv.id && cur.conv) {
    cur.conv = stale ? { ...cur.conv, ...conv, ...state.convs.get(conv.id) } : { ...cur.conv, ...conv };
    renderChrome();
    contextModal.refresh(conv.id);
    if ('backup' in conv) backups.changed(conv.id);
  }
}

/** The conversation a compacted one continues in (the last of its successors known), or itself. */
function successorOf(id) {
  const seen = new Set();
  let conv = state.convs.get(id);
  while (conv && conv.compacted_into_id != null && !seen.has(id)) {
    seen.add(id);
    id = conv.compacted_into_id;
    conv = state.convs.get(id);
  }
  return id;
}

/** The "missing" view: why, and what was typed there (to copy) if anything. */
function showMissing(text, typed = '') {
  byId('missing-text').textContent = text;
  byId('missing-draft').hidden = !typed.trim();
  byId('missing-draft-text').value = typed;
  showView('missing');
}

/** A conversation was deleted (here or in another tab): gone from the sidebar and the view. */
function onRemoved(id) {
  const known = state.convs.get(id) || (state.current && state.current.id === id && state.current.conv);
  if (known) state.removed.set(id, known.created_at);
  if (!state.convs.delete(id) && !(state.current && state.current.id === id)) return;
  renderLists();
  if (state.current && state.current.id === id) {
    leaveConversation();
    // Deleted in another tab while this one had text typed: it stays to be copied.
    const typed = state.drafts.get(id) || '';
    state.drafts.delete(id);
    showMissing('This conversation was deleted.', typed);
    // Its address no longer names anything: a reload opens the list's newest, not a 404.
    if (pathId() === id) history.replaceState(null, '', '/');
  } else if ((state.drafts.get(id) || '').trim() && known) {
    // Typed in, then left for another: the text is kept at its address (openConversation).
    toast(`“${isolate(known.title || 'Untitled')}” was deleted; what you had typed in it is kept.`, {
      label: 'Show it', run: () => navigate(id),
    });
  }
}

/** Open a search hit: its conversation, scrolled to the message (earlier pages loaded as needed). */
async function openAt(hit) {
  state.reveal = { conversationId: hit.conversation_id, entryId: hit.entry_id };
  const cur = state.current;
  if (cur && cur.id === hit.conversation_id && cur.loaded) {
    setDrawer(false);
    await revealPending();
  } else {
    navigate(hit.conversation_id);
  }
}

async function revealPending() {
  const target = state.reveal;
  const cur = state.current;
  if (!target || !cur || !cur.loaded || cur.id !== target.conversationId) return;
  state.reveal = null;
  while (!timeline.has(target.entryId) && !byId('load-earlier').hidden && state.current === cur) {
    const from = timeline.pageBefore();
    await loadEarlier();
    if (timeline.pageBefore() === from) break; // no page further back: stop rather than spin
  }
  if (state.current !== cur) return;
  const el = byId('entries').querySelector(`[data-entry-id="${target.entryId}"]`)
    || byId('queued-entries').querySelector(`[data-entry-id="${target.entryId}"]`);
  if (!el) {
    toast('That message is no longer in this conversation.');
    return;
  }
  for (const old of document.querySelectorAll('.search-target')) old.classList.remove('search-target');
  timeline.stick = false; // stay on the message, not at the bottom
  el.classList.add('search-target');
  el.scrollIntoView({ block: 'center' });
}

/** Where each sidebar list's next page starts (null: everything is loaded). */
const more = { active: null, archived: null };

async function loadPage(status, before) {
  const cursor = before ? `&before=${encodeURIComponent(before)}` : '';
  const asked = feed.clock;
  const { data } = await api(`/api/conversations?status=${status}&limit=100${cursor}`);
  for (const conv of data.conversations) {
    if (!isRemoved(conv)) state.convs.set(conv.id, merged(conv, asked));
  }
  if (!before) dropUnlisted(status, data, asked);
  more[status] = data.next;
  return data.feed;
}

/** A first page read (a reconnect's): what it should list and does not was deleted meanwhile
 * (or moved to the other list, which lists it). Not one heard of since the page was asked. */
function dropUnlisted(status, data, asked) {
  const listed = new Set(data.conversations.map((c) => c.id));
  const last = data.conversations[data.conversations.length - 1];
  for (const [id, conv] of state.convs) {
    if (listed.has(id) || isArchived(conv) !== (status === 'archived')) continue;
    if ((feed.seen.get(id) || 0) > asked) continue;
    if (data.next && last && newestFirst(conv, last) > 0) continue; // on a later page
    state.convs.delete(id);
  }
}

/** Read both lists' first pages; returns where the global feed was before each was read. */
async function loadLists() {
  const feeds = await Promise.all([loadPage('active'), loadPage('archived')]);
  listsRead = true;
  renderLists();
  return feeds;
}

/** The archive's title search, asked of the relay too: the lists hold only the pages loaded. */
const archiveSearch = { query: '', next: null, pending: false, timer: 0 };

function searchArchive(value) {
  state.archiveQuery = value;
  clearTimeout(archiveSearch.timer);
  Object.assign(archiveSearch, { query: value.trim(), next: null, pending: Boolean(value.trim()) });
  if (archiveSearch.pending) {
    const query = archiveSearch.query;
    archiveSearch.timer = setTimeout(() => loadMatches(query).catch(() => {}), 150);
  }
  renderLists();
}

/** A page of the archived conversations whose title holds the query (each kept in the lists). */
async function loadMatches(query, before) {
  const cursor = before ? `&before=${encodeURIComponent(before)}` : '';
  const asked = feed.clock;
  try {
    const { data } = await api(`/api/conversations?status=archived&limit=100&q=${encodeURIComponent(query)}${cursor}`);
    if (archiveSearch.query !== query) return; // typed on meanwhile: its own search follows
    for (const conv of data.conversations) {
      if (!isRemoved(conv)) state.convs.set(conv.id, merged(conv, asked));
    }
    archiveSearch.next = data.next;
  } finally {
    if (archiveSearch.query === query) archiveSearch.pending = false;
    renderLists();
  }
}

/** A list's "Show more": load runs once per click (the lists are drawn again after it). */
function moreButton(status, load = () => loadPage(status, more[status])) {
  const button = h('button', { type: 'button', class: 'list-more', testid: `${status}-more`, text: 'Show more' });
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      await load();
    } finally {
      renderLists();
    }
  });
  return h('li', {}, button);
}

async function loadProviders() {
  const { data } = await api('/api/providers');
  state.providers = data.providers || [];
  state.defaultProvider = data.default;
  state.providersLoaded = true;
  renderLists();
  if (state.current && state.current.conv) renderChrome();
}

let listsFrame = 0;
function renderLists() {
  if (!listsFrame) listsFrame = requestAnimationFrame(drawLists);
}

function drawLists() {
  listsFrame = 0;
  const all = [...state.convs.values()].sort(newestFirst);
  const query = state.archiveQuery.trim().toLowerCase();
  const active = all.filter((c) => !isArchived(c));
  const archived = all.filter((c) => isArchived(c) && (!query || (c.title || '').toLowerCase().includes(query)));
  const activeItems = active.map((c) => convItem(c, 'conversation-item'));
  const archivedItems = archived.map((c) => convItem(c, 'archive-item'));
  if (more.active) activeItems.push(moreButton('active'));
  if (query && archiveSearch.next) {
    archivedItems.push(moreButton('archived', () => loadMatches(archiveSearch.query, archiveSearch.next)));
  }
  else if (!query && more.archived) archivedItems.push(moreButton('archived'));
  // A redraw replaces the items: keyboard focus on one (its link or ⋯) goes to its new self.
  const focused = document.activeElement;
  const item = focused instanceof Element ? focused.closest('.conv-item[data-id]') : null;
  const part = item && ['conv-link', 'conv-menu-btn'].find((name) => focused.classList.contains(name));
  byId('conversation-list').replaceChildren(...activeItems);
  byId('archive-list').replaceChildren(...archivedItems);
  showNeeds(all);
  sayNeeds(all);
  if (part && !focused.isConnected) {
    const again = document.querySelector(`.conv-item[data-id="${item.dataset.id}"] .${part}`);
    if (again) again.focus({ preventScroll: true });
  }
  byId('conversation-empty').hidden = active.length > 0;
  const archiveEmpty = byId('archive-empty');
  archiveEmpty.hidden = archived.length > 0;
  archiveEmpty.textContent = !query ? 'Nothing archived yet.'
    : archiveSearch.pending ? 'Searching…' : 'No archived conversation matches.';
}

function convItem(conv, testid) {
  const open = state.current != null && state.current.id === conv.id;
  const link = h('a', {
    href: `/c/${conv.id}`,
    class: open ? 'conv-link current' : 'conv-link',
    testid,
    'data-id': conv.id,
    'data-provider': conv.provider,
    'aria-current': open ? 'page' : null,
    title: [isolate(conv.title || 'Untitled'), providerName(conv.provider), convDescription(conv)].filter(Boolean).join(' · '),
  }, h('span', { class: 'conv-title', dir: 'auto', text: conv.title || 'Untitled' }));
  link.addEventListener('click', (e) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(conv.id);
  });
  return h('li', { class: 'conv-item', 'data-id': conv.id }, link, convMeta(conv), convActions.button(conv));
}

// ---- routing -----------------------------------------------------------------------------------

function pathId() {
  const match = location.pathname.match(/^\/c\/(\d+)\/?$/);
  return match ? Number(match[1]) : null;
}

function navigate(id, { replace = false, focus = false } = {}) {
  const path = `/c/${id}`;
  // Chosen in the drawer: in the drawer's place in the history (Back then goes to where it
  // was opened, not to the drawer again).
  const instead = replace || Boolean(history.state?.drawer);
  if (location.pathname !== path) history[instead ? 'replaceState' : 'pushState'](null, '', path);
  setDrawer(false);
  if (state.current && state.current.id === id) {
    // Still loading (a socket event opened it first): the composer takes focus once shown.
    if (focus && !state.current.loaded) state.current.focusOnLoad = true;
    else if (focus) byId('message-input').focus();
    return;
  }
  openConversation(id, { focus });
}

/** Show what the URL names: /c/<id>, or at / the newest active conversation (or the empty state). */
function route() {
  const id = pathId();
  if (id != null) {
    if (!state.current || state.current.id !== id) openConversation(id);
    return;
  }
  const newest = [...state.convs.values()].filter((c) => !isArchived(c)).sort(newestFirst)[0];
  if (newest) {
    navigate(newest.id, { replace: true });
  } else {
    leaveConversation();
    showView('empty');
  }
}

function showView(name) {
  for (const view of ['empty', 'missing', 'loading', 'chat']) byId(`${view}-state`).hidden = view !== name;
  byId('chat-head').hidden = name !== 'chat';
  byId('head-actions').hidden = name !== 'chat';
  if (name !== 'chat') setPageTitle('oarlock');
}

function leaveConversation() {
  saveDraft();
  closeMenu();
  state.opening += 1;
  state.current = null;
  if (contextModal.isOpen) contextModal.close();
  backups.close();
  changes.close();
  // The /compact and /clear questions act on the conversation left (Back, a link): closed too.
  for (const dialog of [compactPreview.dialog, clearDialog.dialog]) {
    if (dialog.open) dialogs.close(dialog);
  }
  renderLists();
}

async function openConversation(id, { focus = false } = {}) {
  leaveConversation();
  const token = state.opening;
  state.current = {
    id, loaded: false, conv: null, turn: IDLE, seq: 0, epoch: null, waiting: false, waitingSince: 0,
  };
  renderLists();
  showView('loading');
  let data;
  const asked = feed.clock;
  try {
    ({ data } = await api(`/api/conversations/${id}`));
  } catch (err) {
    if (token !== state.opening) return;
    if (err.status !== 404) {
      showMissing(err.message);
      return;
    }
    // Text typed in it before it was deleted (another tab, or before a reload) is shown to copy.
    const typed = state.drafts.get(id) || '';
    showMissing(state.removed.has(id) ? 'This conversation was deleted.' : 'This conversation does not exist.', typed);
    return;
  }
  if (token !== state.opening) return;
  resetChrome();
  const input = byId('message-input');
  input.value = state.drafts.get(id) || ''; // (before the chrome: an archived one shows it)
  showConversation(data, { keepScroll: false, asked });
  state.current.openedArchived = isArchived(state.current.conv);
  autosize();
  updateComposer();
  subscribe(true);
  if ((focus || state.current.focusOnLoad) && !isArchived(state.current.conv)) input.focus();
  await revealPending();
}

/** Render a conversation as GET /api/conversations/{id} (asked: see merged) or a snapshot gives it. */
function showConversation(data, { keepScroll, asked = null }) {
  const cur = state.current;
  const { timeline: entries, has_more: hasMore, earlier, turn, agent, seq, epoch, ...conv } = data;
  state.convs.set(conv.id, merged(conv, asked));
  cur.conv = overtaken(conv.id, asked) ? { ...conv, ...state.convs.get(conv.id) } : conv;
  cur.seq = seq ?? 0;
  cur.epoch = epoch ?? state.epoch;
  cur.loaded = true;
  cur.waiting = false;
  renderLists();
  showView('chat');
  pins.load(conv.id, !isArchived(conv)); // again on a snapshot: a pins event may have been missed
  renderChrome();
  timeline.reset(entries || [], Boolean(hasMore), { keepScroll, earlier });
  setTurn(turn || IDLE);
  setAgent(agent);
}

async function loadEarlier() {
  const cur = state.current;
  const before = timeline.pageBefore();
  if (!cur || !cur.loaded || before == null) return;
  const button = byId('load-earlier');
  // Pressed from the keyboard: the focus stays on it, or goes to the timeline once it is gone
  // (disabled meanwhile, then hidden, it left the focus to the page's body).
  const focused = document.activeElement === button;
  button.disabled = true;
  try {
    const { data } = await api(`/api/conversations/${cur.id}?limit=200&before=${before}`);
    if (state.current === cur) {
      timeline.prepend(data.timeline || [], Boolean(data.has_more), data.earlier);
    }
  } catch (err) {
    toast(err.message);
    button.disabled = false;
  }
  if (focused && state.current === cur) (button.hidden ? byId('timeline') : button).focus({ preventScroll: true });
}

// ---- the chat's header, notices and banner -----------------------------------------------------

function contextLabel(conv) {
  const used = conv.context_tokens == null ? '—' : fmtTokens(conv.context_tokens); // as the modal
  return conv.window == null ? used : `${used} / ${fmtTokens(conv.window)}`;
}

/** The 🧠 button: the emoji, a word for fonts without it, and the figures. */
function contextButton(conv) {
  return [h('span', { class: 'ctx-icon', 'aria-hidden': 'true', text: '🧠' }), ' ',
    h('span', { class: 'ctx-word', text: 'Context' }), ' ', contextLabel(conv)];
}

/** Per-conversation bits that reset when another conversation opens. */
function resetChrome() {
  stopRename(false);
  const toggle = byId('pending-summary-toggle');
  toggle.textContent = 'Show summary';
  toggle.setAttribute('aria-expanded', 'false');
  byId('pending-summary-text').hidden = true;
  hideComposerError();
  closeMenu();
}

function renderChrome() {
  const cur = state.current;
  const conv = cur && cur.conv;
  if (!conv) return;
  const archived = isArchived(conv);
  setPageTitle(`${isolate(conv.title || 'Untitled')} · oarlock`);

  const title = byId('title');
  // "(compacted)" or "(compacted ×2)" kept whole at the end: the ellipsis cuts the title before it.
  const [, main, suffix] = (conv.title || 'Untitled').match(/^(.*?)((?:\s*\(compacted(?: ×\d+)?\))*)$/s);
  title.replaceChildren(h('span', { class: 'title-main', text: main }),
    suffix ? h('span', { class: 'title-suffix', text: suffix }) : '');
  title.title = archived ? '' : 'Rename';
  title.classList.toggle('readonly', archived);
  byId('provider-badge').textContent = providerName(conv.provider);
  byId('provider-badge').dataset.provider = conv.provider;
  byId('cwd').textContent = conv.cwd || '';
  byId('cwd').title = conv.cwd || '';

  const ctx = byId('context-button');
  ctx.replaceChildren(...contextButton(conv));
  const warn = conv.context_tokens != null && conv.threshold != null && conv.context_tokens > 0.8 * conv.threshold;
  if (warn) ctx.dataset.warn = 'true';
  else delete ctx.dataset.warn;
  ctx.classList.toggle('warn', warn);
  renderWatch(conv, archived);
  byId('stop-button').hidden = !isBusy(cur.turn); // archived too: a turn running on stops there

  const from = byId('compacted-from');
  from.hidden = conv.compacted_from_id == null;
  if (conv.compacted_from_id != null) {
    const link = byId('compacted-from-link');
    setConvLink(link, conv.compacted_from_id);
    const earlier = state.convs.get(conv.compacted_from_id);
    link.textContent = earlier && earlier.title ? `Compacted from “${isolate(earlier.title)}”` : 'Compacted from an earlier conversation';
  }

  if (pins.convId !== conv.id || pins.editable === archived) pins.load(conv.id, !archived);
  carryRecords.show(conv);

  byId('archived-notice').hidden = !archived;
  const into = byId('compacted-into-link');
  into.hidden = conv.compacted_into_id == null;
  if (conv.compacted_into_id != null) setConvLink(into, conv.compacted_into_id);

  backups.renderHeader(conv);
  renderResume(conv);

  byId('pending-summary').hidden = archived || !conv.pending_summary;
  byId('pending-summary-text').textContent = conv.pending_summary || '';
  byId('pending-summary-label').textContent = pendingLabel(conv.pending_summary);

  // Archived in another tab while something was typed: the composer stays, read-only, so
  // that the text can still be copied (nothing typed is lost).
  byId('composer').hidden = archived && !input.value;
  input.readOnly = archived;
  modeControl.show(conv);
  modelControl.show(conv);
  const provider = state.providers.find((p) => p.id === conv.provider);
  attachments.show(conv.id, !archived && Boolean(provider && provider.images));
  byId('timeline').classList.toggle('readonly', archived);
  updateComposer();
}

function setConvLink(link, id) {
  link.href = `/c/${id}`;
  link.dataset.id = id;
}

function setTurn(turn) {
  const cur = state.current;
  if (!cur) return;
  const was = isBusy(cur.turn);
  cur.turn = turn || IDLE;
  if (was && !isBusy(cur.turn)) changes.turnEnded(cur.id); // what the turn changed shows
  const stop = byId('stop-button');
  stop.hidden = !isBusy(cur.turn);
  stop.disabled = false;
  timeline.setTurn(cur.turn);
  showAgent(cur);
  updateComposer();
}

/** The agent's process state, quietly in the header: asleep, starting, ready. */
function setAgent(agent) {
  const cur = state.current;
  if (!cur) return;
  cur.agent = agent || 'asleep';
  showAgent(cur);
}

/** The header's words for it: a ready agent running a turn (or compacting) says "working". */
function showAgent(cur) {
  const el = byId('agent-state');
  el.dataset.state = cur.agent || 'asleep';
  const busy = cur.agent === 'ready' && isBusy(cur.turn);
  el.textContent = cur.agent === 'starting' ? 'starting…' : busy ? 'working' : el.dataset.state;
}

// Start an asleep agent while the user writes, so that it is ready when they press Enter
// (at most one warm-up request per conversation every 5 s).
const warmedAt = new Map();
let warmPending = null; // typed before the socket was open: warmed once it is
function warmAgent() {
  const cur = state.current;
  if (!cur || !cur.loaded || isArchived(cur.conv) || cur.agent !== 'asleep') return;
  if (Date.now() - (warmedAt.get(cur.id) || 0) < 5000) return;
  if (send({ type: 'warm', conversation_id: cur.id })) warmedAt.set(cur.id, Date.now());
  else warmPending = cur.id;
}

async function interrupt() {
  const cur = state.current;
  if (!cur) return;
  const stop = byId('stop-button');
  stop.disabled = true;
  try {
    await api(`/api/conversations/${cur.id}/interrupt`, { method: 'POST', body: {} });
  } catch (err) {
    toast(err.message);
    stop.disabled = false;
  }
}

// Click the title to rename it: Enter or leaving the field saves, Escape cancels.
let renaming = null;
function startRename() {
  const cur = state.current;
  if (!cur || !cur.conv || isArchived(cur.conv) || renaming) return;
  const title = byId('title');
  const field = h('input', {
    class: 'title-input', testid: 'title-input', dir: 'auto', maxlength: 200, 'aria-label': 'Conversation title',
  });
  field.value = cur.conv.title || '';
  renaming = { field, id: cur.id };
  title.hidden = true;
  title.after(field);
  field.focus();
  field.select();
  field.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); stopRename(true); }
    if (e.key === 'Escape') { e.preventDefault(); stopRename(false); }
  });
  field.addEventListener('blur', () => stopRename(true));
}

async function stopRename(save) {
  if (!renaming) return;
  const { field, id } = renaming;
  renaming = null;
  const value = field.value.trim();
  const hadFocus = document.activeElement === field;
  field.remove();
  const title = byId('title');
  title.hidden = false;
  if (hadFocus) title.focus();
  const conv = state.convs.get(id);
  if (!save || !value || !conv || value === conv.title) return;
  title.textContent = value;
  try {
    const asked = feed.clock;
    const { data } = await api(`/api/conversations/${id}`, { method: 'PATCH', body: { title: value } });
    onConversation(data, asked);
  } catch (err) {
    toast(`The title was not saved: ${err.message}`);
    renderChrome();
    // What was typed comes back in the field, to save again or Esc (nothing typed is lost).
    if (state.current && state.current.id === id && !renaming) {
      startRename();
      if (renaming) renaming.field.value = value;
    }
  }
}

// ---- composer ----------------------------------------------------------------------------------

const input = byId('message-input');
// Messages taken from the composer, posted one at a time in order: the first is on its way.
const outbox = [];

function autosize() {
  input.style.height = 'auto';
  input.style.height = `${input.scrollHeight + 2}px`; // CSS max-height caps it
}

/** Go on in the conversation this one was compacted into, with what was typed in it; someone
 * typing keeps typing there (the composer keeps the keyboard). */
function followCompaction(intoId) {
  const cur = state.current;
  const text = input.value;
  const typing = document.activeElement === input;
  if (cur && text) {
    if (!/^\s*\/(compact|clear)\s*$/.test(text)) { // (not the command that did it: done)
      const waiting = state.drafts.get(intoId);
      state.drafts.set(intoId, waiting ? `${waiting}\n${text}` : text);
    }
    state.drafts.delete(cur.id);
    input.value = ''; // (leaving saves no draft for the old one)
  }
  navigate(intoId, { focus: typing });
}

// Unsent text survives this tab's own navigations (a reload; the login form when a log out in
// another tab or an expired session sent it there), in this tab's sessionStorage until read
// back; a log out from this tab takes it away.
const DRAFTS_KEY = 'oarlock-drafts';

function keepDrafts() {
  saveDraft();
  try {
    if (socket.leaving || !state.drafts.size) sessionStorage.removeItem(DRAFTS_KEY);
    else sessionStorage.setItem(DRAFTS_KEY, JSON.stringify([...state.drafts]));
  } catch { /* storage full or off: nothing more can be done as the page goes */ }
}

function restoreDrafts() {
  try {
    const kept = JSON.parse(sessionStorage.getItem(DRAFTS_KEY) || '[]');
    sessionStorage.removeItem(DRAFTS_KEY);
    for (const [id, text] of Array.isArray(kept) ? kept : []) {
      if (Number.isInteger(id) && typeof text === 'string' && text) state.drafts.set(id, text);
    }
  } catch { /* a value this page did not write: ignored */ }
}

function saveDraft() {
  const cur = state.current;
  if (!cur || !cur.loaded) return;
  if (input.value) state.drafts.set(cur.id, input.value);
  else state.drafts.delete(cur.id);
}

function updateComposer() {
  const cur = state.current;
  const busy = Boolean(cur) && isBusy(cur.turn);
  const send = byId('send-button');
  const label = busy ? 'Queue' : 'Send';
  if (send.textContent !== label) send.textContent = label;
  send.title = busy ? 'The agent is busy: the message waits its turn' : '';
  send.disabled = !cur || !cur.loaded || isArchived(cur.conv) || !input.value.trim() || attachments.uploading > 0;
  // Only for what may become /compact (the one command that should wait for an idle agent).
  const typed = input.value.trim();
  byId('compact-hint').hidden = !(busy && typed.startsWith('/') && '/compact'.startsWith(typed));
  // Kept only to be copied (archived in another tab): said, and no "Enter to send".
  const kept = Boolean(cur) && isArchived(cur.conv) && Boolean(input.value);
  byId('archived-hint').hidden = !kept;
  document.querySelector('.composer-keys').hidden = kept;
}

function showComposerError(message, offline = false) {
  const el = byId('composer-error');
  el.textContent = message;
  el.dataset.offline = String(offline); // cleared by the next reconnection
  el.hidden = false;
}

function hideComposerError() {
  byId('composer-error').hidden = true;
}

function trySend() {
  const cur = state.current;
  const text = input.value;
  if (!cur || !cur.loaded || isArchived(cur.conv)) return;
  if (attachments.uploading) return showComposerError('Wait a moment: an image is still uploading.');
  if (!text.trim()) {
    if (attachments.enabled && attachments.waiting.length) showComposerError('Add a few words to go with the images.');
    return;
  }
  closeMenu();
  // With images, /compact and /clear are text for the agent (only alone are they commands).
  const images = attachments.take();
  const left = attachments.waiting.length;
  if (left) toast(`${images.length} images go with this message; ${left} more wait for the next one.`);
  if (images.length) {
    input.value = '';
    state.drafts.delete(cur.id);
    autosize();
    updateComposer();
    enqueue(cur.id, text, true, images);
    return;
  }
  if (text.trim() === '/compact') {
    compactPreview.open(cur.id); // the preview: the exact carry-over, editable (steer.js)
    return;
  }
  if (text.trim() === '/clear') {
    openClear(cur.id);
    return;
  }
  // The composer empties at once: what is typed next is a new message. One the relay does not
  // take is given back (giveBack); one sent while another is on its way waits for it.
  input.value = '';
  state.drafts.delete(cur.id);
  autosize();
  updateComposer();
  enqueue(cur.id, text, true);
}

/** Send a message after those on their way (fromComposer: taken from the composer, with
 * images: the attachments it goes with). */
function enqueue(id, text, fromComposer = false, images = []) {
  outbox.push({ id, text, fromComposer, images });
  if (outbox.length === 1) sendOutbox(); // else the loop below is at work
}

async function sendOutbox() {
  while (outbox.length) {
    const { id, text, fromComposer, images } = outbox[0];
    const taken = await postMessage(text, id, fromComposer, images);
    outbox.shift();
    if (taken) continue;
    // Not taken: it and the ones after it go back to their composers, in order, unsent (a
    // button's /clear or /handoff goes nowhere: the button is still there).
    const back = new Map();
    for (const message of [{ id, text, fromComposer, images }, ...outbox.splice(0)]) {
      if (!message.fromComposer) continue;
      back.set(message.id, [...(back.get(message.id) || []), message.text]);
      attachments.giveBack(successorOf(message.id), message.images);
    }
    for (const [where, texts] of back) giveBack(where, texts.join('\n'));
  }
}

// True once the relay took the message. fromComposer: the composer gave it (and was emptied;
// sendOutbox gives it back if it was not taken).
async function postMessage(text, id, fromComposer, images = []) {
  hideComposerError();
  try {
    const body = images.length ? { text, attachments: images.map((image) => image.id) } : { text };
    const { data } = await api(`/api/conversations/${id}/messages`, { method: 'POST', body });
    if (!fromComposer) state.drafts.delete(id); // (the composer's was emptied as it was sent)
    if (state.current && state.current.id === id) {
      if (!fromComposer && input.value === text) input.value = '';
      autosize();
      // The socket usually brings the entry first; if not, show it now (it is queued).
      if (data && data.id != null && data.kind && !timeline.has(data.id)) timeline.upsert(data);
      timeline.scrollToBottom();
    }
    if (data && data.compacted_into) {
      onConversation(data.compacted_into);
      navigate(data.compacted_into.id, { focus: true });
    }
    return true;
  } catch (err) {
    let message = err.message;
    if (err.status === 409 && await compactedSince(id)) {
      message = 'The conversation was compacted before your message reached it: the message is back in the new one\'s composer, to send again.';
    }
    // (giveBack puts the text where the conversation went on: the same conversation, or this one)
    const where = successorOf(id);
    const cur = state.current; // (one still loading resets its composer's error once loaded)
    if (cur && cur.id === where && cur.loaded) showComposerError(message, err.status === 0);
    else toast(message);
    return false;
  } finally {
    updateComposer();
  }
}

/** True when the conversation was compacted into another (this tab may not have heard yet). */
async function compactedSince(id) {
  const known = state.convs.get(id);
  if (!known) return false;
  if (known.compacted_into_id != null) return true;
  try {
    const asked = feed.clock;
    const { data } = await api(`/api/conversations/${id}?limit=1`);
    const { status, compacted_into_id: into } = data; // successorOf knows it from here
    onConversation({ ...state.convs.get(id) || known, status, compacted_into_id: into }, asked);
    return into != null;
  } catch {
    return false;
  }
}

// A message the relay did not take goes back where it was written, after what went back before
// it and before anything typed since.
function giveBack(written, text) {
  const id = successorOf(written); // compacted meanwhile: into the conversation it went on in
  const cur = state.current;
  if (cur && cur.id === id && cur.loaded) { // (still loading: its draft is read once loaded)
    input.value = input.value ? `${text}\n${input.value}` : text;
    autosize();
    updateComposer();
    return;
  }
  const draft = state.drafts.get(id);
  state.drafts.set(id, draft ? `${text}\n${draft}` : text);
}

// Edit on a queued message, or ↑ in an empty box: the relay takes the message out of the queue
// and its text goes back into the box, before anything typed there. Too late (it went out
// meanwhile): a toast says so, and the bubble shows it sent.
const withdrawing = new Set(); // ids asked for and not answered yet (↑ twice asks once)
async function withdraw(entry) {
  const cur = state.current;
  if (withdrawing.has(entry.id)) return;
  withdrawing.add(entry.id);
  try {
    const { data } = await api(`/api/conversations/${cur.id}/messages/${entry.id}`, { method: 'DELETE' });
    attachments.giveBack(cur.id, data.data && data.data.attachments);
    if (state.current !== cur) return giveBack(cur.id, data.text);
    timeline.remove(entry.id); // (its entry_removed may come after the answer)
    giveBack(cur.id, data.text);
    input.focus();
    input.setSelectionRange(data.text.length, data.text.length);
  } catch (err) {
    // 404: taken back in another tab, or moved on by /compact (its bubble goes with its event).
    toast(err.status === 404 ? 'This message is no longer in this queue: taken back in another tab, or moved by /compact.' : err.message);
    throw err;
  } finally {
    withdrawing.delete(entry.id);
  }
}

// The composer's menu: "/" commands, and "@" files of the conversation's working directory
// (Claude Code attaches a file a message names as @path).
const menu = { el: byId('command-menu'), items: [], index: 0, kind: 'command', mention: null };
const menuOpen = () => !menu.el.hidden;
const MENTION = /(^|\s)@("[^"]*|[^\s"]*)$/; // "@" then a path being typed, before the caret
let mentionAsked = 0; // the last file request: an older answer is not shown
let mentionTimer = null;

function updateMenu() {
  const value = input.value;
  const cur = state.current;
  const open = cur && !isArchived(cur.conv);
  const candidates = open && value.startsWith('/') && !/\s/.test(value)
    ? COMMANDS.filter((c) => c.name.startsWith(value))
    : [];
  const at = !candidates.length && open ? mentionAt() : null;
  if (at && menu.kind === 'file' && menuOpen() && sameMention(at, menu.mention)) return;
  // Anything else typed: the menu shown (and any answer on its way) no longer fits the text.
  showMenu('command', candidates.map((c) => ({ name: c.name, description: described(c) })));
  if (at) mentionTimer = setTimeout(askFiles, 80); // one request for a burst of keystrokes
}

/** With images waiting, /compact and /clear go to the agent as text (commands only alone). */
function described(command) {
  const asText = ['/compact', '/clear'].includes(command.name)
    && attachments.enabled && attachments.waiting.length > 0;
  return asText ? IMAGES_MAKE_TEXT : command.description;
}

const sameMention = (a, b) => Boolean(a && b) && a.start === b.start && a.end === b.end && a.query === b.query;

/** The "@path" being typed where the caret is: where it starts, the path so far (query) and
 *  where the path ends (the rest of the word after the caret goes with it when picked). */
function mentionAt() {
  const caret = input.selectionStart;
  if (caret !== input.selectionEnd) return null;
  const found = MENTION.exec(input.value.slice(0, caret));
  if (!found) return null;
  const rest = /^[^\s"]*"?/.exec(input.value.slice(caret))[0];
  return { start: caret - found[2].length - 1, end: caret + rest.length, query: found[2].replace(/^"/, '') };
}

async function askFiles() {
  const cur = state.current;
  const at = mentionAt();
  const asked = ++mentionAsked;
  if (!cur || !at) return;
  let found;
  try {
    ({ data: found } = await api(`/api/conversations/${cur.id}/files?q=${encodeURIComponent(at.query)}`));
  } catch {
    return; // (the directory is gone, or not on this node: no menu)
  }
  // Shown only for the text it was asked for, where the caret still is.
  if (asked !== mentionAsked || state.current !== cur || !sameMention(at, mentionAt())) return;
  showMenu('file', found.files.map((path) => ({ name: path, description: '' })), at);
}

function showMenu(kind, items, mention = null) {
  if (!items.length) {
    closeMenu();
    return;
  }
  const same = kind === menu.kind && items.map((i) => i.name).join('\0') === menu.items.map((i) => i.name).join('\0');
  if (!same) menu.index = 0; // a new list: its best first
  menu.kind = kind;
  menu.items = items;
  menu.mention = mention;
  drawMenu();
}

function drawMenu() {
  menu.el.setAttribute('aria-label', menu.kind === 'file' ? 'Files' : 'Commands');
  menu.el.replaceChildren(...menu.items.map((item, i) => {
    const li = h('li', {
      id: `command-${i}`,
      role: 'option',
      class: i === menu.index ? 'command-item active' : 'command-item',
      testid: menu.kind === 'file' ? 'file-item' : 'command-item',
      'aria-selected': String(i === menu.index),
    }, menu.kind === 'file' // a bidi control in a name shown as its code, as the Changes view does
      ? h('span', { class: 'command-name path', title: visible(item.name).shown },
        h('bdi', { dir: 'ltr', text: visible(item.name).shown }))
      : h('span', { class: 'command-name', text: item.name }),
    item.description ? h('span', { class: 'command-desc', text: item.description }) : null);
    li.addEventListener('mousedown', (e) => e.preventDefault()); // keep the focus in the box
    li.addEventListener('click', () => pickItem(i));
    return li;
  }));
  menu.el.hidden = false;
  menu.el.children[menu.index]?.scrollIntoView({ block: 'nearest' });
  input.setAttribute('aria-expanded', 'true');
  input.setAttribute('aria-activedescendant', `command-${menu.index}`);
}

function closeMenu() {
  clearTimeout(mentionTimer);
  mentionAsked += 1; // a file answer still on its way opens nothing
  menu.el.hidden = true;
  menu.el.replaceChildren();
  menu.items = [];
  menu.mention = null;
  input.setAttribute('aria-expanded', 'false');
  input.removeAttribute('aria-activedescendant');
}

function pickItem(index) {
  const item = menu.items[index];
  if (!item) return;
  if (menu.kind === 'file' && menu.mention) {
    const { start, end } = menu.mention;
    const path = /[\s"]/.test(item.name) ? `"${item.name}"` : item.name; // Claude Code's @"a b"
    const text = `@${path} `;
    input.value = input.value.slice(0, start) + text + input.value.slice(end);
    input.setSelectionRange(start + text.length, start + text.length);
  } else {
    input.value = item.name;
  }
  closeMenu();
  input.focus();
  autosize();
  updateComposer();
}

input.addEventListener('keydown', (e) => {
  const composing = e.isComposing || e.keyCode === 229;
  if (menuOpen() && !composing) {
    if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
      e.preventDefault();
      const step = e.key === 'ArrowDown' ? 1 : -1;
      menu.index = (menu.index + step + menu.items.length) % menu.items.length;
      drawMenu();
      return;
    }
    if (e.key === 'Tab' || (e.key === 'Enter' && !e.shiftKey)) {
      e.preventDefault();
      const item = menu.items[menu.index];
      // Enter on a command already typed in full sends it; otherwise it completes it.
      if (e.key === 'Enter' && menu.kind === 'command' && item && input.value === item.name) trySend();
      else pickItem(menu.index);
      return;
    }
    if (e.key === 'Escape') {
      e.preventDefault();
      closeMenu();
      return;
    }
  }
  if (e.key === 'Enter' && !e.shiftKey && !composing) {
    e.preventDefault();
    trySend();
  }
  const plain = !e.shiftKey && !e.ctrlKey && !e.altKey && !e.metaKey;
  // ↑ in an empty box takes the last queued message back to edit (as Claude Code's prompt does).
  const last = e.key === 'ArrowUp' && !composing && plain && !input.value && timeline.lastQueued();
  if (last) {
    e.preventDefault();
    withdraw(last).catch(() => {});
  }
  // Page Up / Page Down scroll the timeline from the composer (a keyboard had no way through
  // the history but tabbing over every message's Pin).
  // (a draft taller than the box keeps them: they move its caret)
  if ((e.key === 'PageUp' || e.key === 'PageDown') && !composing && plain && input.scrollHeight <= input.clientHeight + 1) {
    e.preventDefault();
    const timeline = byId('timeline');
    const page = Math.max(40, timeline.clientHeight - 60);
    timeline.scrollBy({ top: e.key === 'PageUp' ? -page : page });
  }
});
// A click or a keystroke in the composer warms, and so does reaching it with the Tab key;
// the focus given by opening a conversation does not (browsing would start every agent).
input.addEventListener('pointerdown', warmAgent);
input.addEventListener('keydown', warmAgent);
let tabbedAt = 0; // when the Tab key last moved the focus
document.addEventListener('keydown', (e) => { if (e.key === 'Tab') tabbedAt = Date.now(); }, true);
input.addEventListener('focus', () => { if (Date.now() - tabbedAt < 1000) warmAgent(); });
input.addEventListener('input', () => {
  autosize();
  hideComposerError();
  updateMenu();
  updateComposer();
});
input.addEventListener('blur', closeMenu);
// An image pasted alone (a screenshot, a copied image) is attached; a paste that has text too
// (cells of a spreadsheet, a selection of a document, which also offer a picture of it) pastes
// its text, as everywhere else.
input.addEventListener('paste', (e) => {
  const data = e.clipboardData;
  const files = imageFiles(data);
  if (!files.length || !attachments.enabled || [...(data.types || [])].includes('text/plain')) return;
  e.preventDefault();
  attachments.add(files);
});
// Files dropped anywhere on the page never replace it (a browser opens a dropped file in the
// tab): dropped on the conversation they are attached, where images can go.
document.addEventListener('dragover', (e) => {
  if (hasFiles(e.dataTransfer)) e.preventDefault();
});
document.addEventListener('drop', (e) => {
  if (!hasFiles(e.dataTransfer)) return;
  e.preventDefault();
  if (!attachments.enabled || !state.current || !e.target.closest('.main')) return;
  attachments.add(imageFiles(e.dataTransfer));
});
// The caret moved without typing (a click, ← →, Home, End): the menu follows it.
input.addEventListener('click', updateMenu);
input.addEventListener('keyup', (e) => {
  if (['ArrowLeft', 'ArrowRight', 'Home', 'End'].includes(e.key)) updateMenu();
});
byId('composer').addEventListener('submit', (e) => {
  e.preventDefault();
  // A click on Send leaves the focus in the box: the button is disabled once the box empties,
  // and the focus fell to the page (what was typed next went nowhere; a phone's keyboard closed).
  if (e.submitter && !isArchived(state.current?.conv)) input.focus();
  trySend();
});

// ---- dialogs: /compact confirmation, new conversation ------------------------------------------

dialogs.register(byId('compact-dialog'));
// Confirmed for the conversation it was asked about (another tab may have moved it on: 409).
const compactPreview = new CompactPreview(dialogs, {
  compacted: (convId, into) => {
    state.drafts.delete(convId);
    if (state.current && state.current.id === convId && input.value.trim() === '/compact') {
      input.value = '';
      autosize();
    }
    onConversation(into);
    navigate(into.id, { focus: true });
  },
});

// /clear (typed, or the bar's Start fresh): confirmed, for the conversation it was asked about.
const clearDialog = new ClearDialog(dialogs, (convId) => {
  const cur = state.current;
  if (!cur || !cur.loaded || cur.id !== convId) return;
  if (input.value.trim() === '/clear') input.value = '/clear';
  enqueue(convId, '/clear');
});
/** Ask the /clear question, saying which pinned messages go along (SPEC §8). */
function openClear(convId) {
  clearDialog.open(convId);
  pins.describe(byId('clear-pins'));
}
const handoffSection = new HandoffSection();
byId('context-button').addEventListener('click', () => {
  const cur = state.current;
  if (cur && cur.loaded) handoffSection.load(cur.id, { readOnly: isArchived(cur.conv) });
});
// The context-watch bar: Save a handoff sends /handoff, Start fresh asks the /clear question.
byId('watch-handoff').addEventListener('click', () => {
  const cur = state.current;
  if (cur && cur.loaded && !isArchived(cur.conv)) enqueue(cur.id, '/handoff');
});
byId('watch-fresh').addEventListener('click', () => {
  const cur = state.current;
  if (cur && cur.loaded && !isArchived(cur.conv)) openClear(cur.id);
});

const newDialog = byId('new-dialog');
dialogs.register(newDialog);

/** A provider's reason as an option's plain text: `code` marks become quotes. */
const plainReason = (reason) => (reason || 'not available here').replace(/`([^`]*)`/g, '“$1”');

function fillProviders() {
  const select = byId('new-provider');
  select.replaceChildren(...state.providers.map((p) => h('option', {
    value: p.id,
    disabled: !p.available,
    text: p.available ? p.name : `${p.name} — ${plainReason(p.reason)}`,
  })));
  const pick = state.providers.find((p) => p.id === state.defaultProvider && p.available)
    || state.providers.find((p) => p.available);
  if (pick) select.value = pick.id;
  markNewModes();
}

/** The new conversation's permission modes, as its provider's agent would take them here. */
function markNewModes() {
  const modes = byId('new-permission');
  const refused = refusedModes(byId('new-provider').value);
  if (refused[modes.value]) modes.value = 'default';
  markRefusedModes(modes, refused);
  const note = byId('new-permission-note');
  note.textContent = [...new Set(Object.values(refused))].join(' ');
  note.hidden = !note.textContent;
}
byId('new-provider').addEventListener('change', markNewModes);

function showNewError(message) {
  const el = byId('new-error');
  el.textContent = message;
  el.hidden = !message;
}

async function openNewDialog() {
  byId('new-form').reset();
  byId('new-trust-field').hidden = true;
  imports.reset();
  showNewError('');
  byId('new-create').disabled = false;
  fillProviders();
  dialogs.open(newDialog, byId('new-title'));
  setDrawer(false);
  if (!state.providersLoaded) {
    try {
      await loadProviders();
      fillProviders();
    } catch (err) {
      showNewError(err.message);
    }
  }
}

byId('new-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const body = { permission_mode: byId('new-permission').value };
  const title = byId('new-title').value.trim();
  const provider = byId('new-provider').value;
  const cwd = byId('new-cwd').value.trim();
  if (title) body.title = title;
  if (provider) body.provider = provider;
  if (cwd) body.cwd = cwd;
  if (byId('new-trust').checked) body.trust_project = true;
  const create = byId('new-create');
  create.disabled = true;
  showNewError('');
  try {
    const { data } = await api('/api/conversations', { method: 'POST', body });
    onConversation(data);
    newDialog.returnFocus = null; // the focus goes to the new conversation's composer instead
    dialogs.close(newDialog);
    navigate(data.id, { focus: true });
  } catch (err) {
    showNewError(err.message);
    // The folder's own Claude Code settings: created only once the user trusts them.
    if (err.status === 409 && err.message.startsWith('This folder has Claude Code settings')) {
      byId('new-trust-field').hidden = false;
    }
  } finally {
    create.disabled = false;
  }
});
byId('new-cancel').addEventListener('click', () => dialogs.close(newDialog));
// Sessions started in a terminal: an imported one opens like a new conversation.
const imports = new Imports({
  onImported(data) {
    onConversation(data);
    newDialog.returnFocus = null;
    dialogs.close(newDialog);
    navigate(data.id, { focus: true });
  },
});

// ---- the sidebar drawer (phones) ---------------------------------------------------------------

// A narrow screen's sidebar is a drawer (app.css's phone rule, the same query); closed, it is
// only moved out of sight, so it is made inert: out of Tab's reach and of screen readers'.
const drawerMedia = window.matchMedia('(max-width: 640px), (max-height: 500px) and (pointer: coarse)');

function syncDrawer() {
  byId('sidebar').inert = drawerMedia.matches && !document.body.classList.contains('drawer-open');
}

/** Open or close the drawer. Back closes an open one (a phone's way): opening it adds a step
 *  to the history, which closing it otherwise takes back (fromHistory: Back did). */
function setDrawer(open, { fromHistory = false } = {}) {
  const was = document.body.classList.contains('drawer-open');
  const sidebar = byId('sidebar');
  const hadFocus = sidebar.contains(document.activeElement);
  document.body.classList.toggle('drawer-open', open);
  syncDrawer();
  byId('scrim').hidden = !open;
  byId('menu-button').setAttribute('aria-expanded', String(open));
  if (drawerMedia.matches && open && !was) {
    // The keyboard goes in with it: to the open conversation, else to its ✕.
    (sidebar.querySelector('.conv-link.current') || byId('drawer-close')).focus({ preventScroll: true });
  } else if (drawerMedia.matches && !open && was && hadFocus) {
    byId('menu-button').focus({ preventScroll: true }); // back where it was opened from
  }
  if (open && !was) history.pushState({ drawer: true }, '', location.href);
  else if (!open && was && !fromHistory && history.state?.drawer) history.back();
}

// ---- wiring and start --------------------------------------------------------------------------

/** Whether a popover (the ⋯ menu) is open; false in a browser without popovers. */
function popoverOpen() {
  try {
    return document.querySelector(':popover-open') !== null;
  } catch {
    return false;
  }
}

function wire() {
  // Log out ends this tab's socket before the answer's redirect is read: nothing to do on it.
  document.querySelector('.logout-form').addEventListener('submit', () => { socket.leaving = true; });
  byId('new-conversation').addEventListener('click', openNewDialog);
  byId('empty-new-conversation').addEventListener('click', openNewDialog);
  byId('menu-button').addEventListener('click', () => setDrawer(!document.body.classList.contains('drawer-open')));
  byId('scrim').addEventListener('click', () => setDrawer(false));
  drawerMedia.addEventListener('change', syncDrawer);
  syncDrawer();
  byId('drawer-close').addEventListener('click', () => {
    setDrawer(false);
    byId('menu-button').focus(); // where the drawer was opened from
  });
  // Esc stops a running turn, as in Claude Code; the draft stays in the composer. Not when
  // Esc does something else: closes the command menu, a ⋯ menu (a popover: the browser closes
  // it after this), cancels a rename, a dialog, the drawer.
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || e.defaultPrevented || e.isComposing || document.querySelector('dialog[open]')) return;
    if (popoverOpen()) return;
    if (document.body.classList.contains('drawer-open')) return;
    const stop = byId('stop-button');
    if (!stop.hidden && !stop.disabled) {
      e.preventDefault();
      interrupt();
    }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && document.body.classList.contains('drawer-open') && !document.querySelector('dialog[open]')) {
      setDrawer(false);
    }
  });
  byId('archive-search').addEventListener('input', (e) => searchArchive(e.target.value));
  byId('archive-search').addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || !e.target.value) return; // (empty: Esc stops a turn, as anywhere)
    e.preventDefault(); // clears it here, and it is not a Stop
    e.target.value = '';
    searchArchive('');
  });
  byId('title').addEventListener('click', startRename);
  byId('stop-button').addEventListener('click', interrupt);
  byId('changes-button').addEventListener('click', () => {
    const cur = state.current;
    if (cur && cur.loaded) changes.open(cur.id);
  });
  byId('context-button').addEventListener('click', () => {
    const cur = state.current;
    if (cur && cur.loaded) {
      contextModal.open(cur.id, { readOnly: isArchived(cur.conv) });
      backups.loadList(cur.id);
    }
  });
  for (const link of [byId('compacted-from-link'), byId('compacted-into-link')]) {
    link.addEventListener('click', (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      navigate(Number(link.dataset.id));
    });
  }
  byId('pending-summary-toggle').addEventListener('click', (e) => {
    const text = byId('pending-summary-text');
    text.hidden = !text.hidden;
    e.currentTarget.textContent = text.hidden ? 'Show summary' : 'Hide summary';
    e.currentTarget.setAttribute('aria-expanded', String(!text.hidden));
  });
  setInterval(renderLists, 60 * 1000); // "5 min ago" moves on
  window.addEventListener('popstate', () => {
    if (document.body.classList.contains('drawer-open') && !history.state?.drawer) {
      setDrawer(false, { fromHistory: true });
    }
    route();
  });
  window.addEventListener('online', () => { if (!socket.ws) connect(); });
}

async function boot() {
  restoreDrafts();
  window.addEventListener('pagehide', keepDrafts);
  wire();
  notify.start();
  connect();
  loadProviders().catch(() => {});
  try {
    gap.lists = await loadLists();
    checkGap();
  } catch (err) {
    if (err.status !== 401) toast(err.message);
  }
  route();
}

boot();

// search.js — the box above the sidebar: every conversation's messages, archived ones too,
// results as you type. Snippets arrive as text spans; matches become <mark>s built with
// textContent, never HTML.
import { h, api, byId } from './util.js';

const DEBOUNCE_MS = 150;
const LIMIT = 20;

export class Search {
  /** hooks: onOpen(hit) — open the hit's conversation at its message. */
  constructor(hooks) {
    this.hooks = hooks;
    this.input = byId('search-input');
    this.results = byId('search-results');
    this.status = byId('search-status');
    this.timer = 0;
    this.asked = 0; // bumps on every request: an older answer arriving late is dropped
    this.input.addEventListener('input', () => this.schedule());
    this.input.addEventListener('keydown', (e) => {
      if (e.key === 'Escape' && this.input.value) {
        e.preventDefault();
        e.stopPropagation();
        this.clear();
      } else if (e.key === 'ArrowDown') {
        const first = this.results.querySelector('.search-hit');
        if (first) { e.preventDefault(); first.focus(); }
      }
    });
    this.results.addEventListener('keydown', (e) => {
      if (e.key === 'Escape') { // as in the box: the results go, the box empty, its focus back
        e.preventDefault();
        e.stopPropagation();
        this.clear();
        this.input.focus();
        return;
      }
      if (e.key !== 'ArrowDown' && e.key !== 'ArrowUp') return;
      const hits = [...this.results.querySelectorAll('.search-hit')];
      const at = hits.indexOf(document.activeElement);
      if (at < 0) return;
      e.preventDefault();
      const next = e.key === 'ArrowDown' ? hits[at + 1] : hits[at - 1];
      (next || (e.key === 'ArrowUp' ? this.input : hits[at])).focus();
    });
  }

  clear() {
    this.input.value = '';
    this.asked += 1;
    clearTimeout(this.timer);
    this.show(null);
  }

  schedule() {
    clearTimeout(this.timer);
    const query = this.input.value.trim();
    if (!query) {
      this.asked += 1;
      this.show(null);
      return;
    }
    this.timer = setTimeout(() => this.run(query), DEBOUNCE_MS);
  }

  async run(query) {
    const token = ++this.asked;
    let hits;
    try {
      const { data } = await api(`/api/search?q=${encodeURIComponent(query)}&limit=${LIMIT}`);
      hits = data.hits || [];
    } catch (err) {
      if (token === this.asked) this.showStatus(err.message);
      return;
    }
    if (token === this.asked) this.show(hits);
  }

  showStatus(text) {
    this.results.replaceChildren();
    this.results.hidden = true;
    this.status.textContent = text;
    this.status.hidden = !text;
    document.body.classList.toggle('searching', Boolean(text));
  }

  /** Draw the hits (null: no search, the lists come back). */
  show(hits) {
    if (hits == null) {
      this.showStatus('');
      return;
    }
    if (!hits.length) {
      this.showStatus('No message matches.');
      return;
    }
    this.status.hidden = true;
    this.results.replaceChildren(...hits.map((hit) => this.item(hit)));
    this.results.hidden = false;
    document.body.classList.add('searching');
  }

  item(hit) {
    const snippet = h('span', { class: 'search-snippet', dir: 'auto' },
      (hit.snippet || []).map((span) => (span.match ? h('mark', { text: span.text }) : span.text)));
    const head = h('span', { class: 'search-head' },
      h('span', { class: 'search-title', dir: 'auto', text: hit.title || 'Untitled' }),
      hit.status === 'archived' ? h('span', { class: 'search-badge', text: 'archived' }) : null,
      h('span', { class: 'search-kind', text: hit.kind === 'user' ? 'You' : 'Agent' }));
    const link = h('a', {
      href: `/c/${hit.conversation_id}`,
      class: 'search-hit',
      testid: 'search-hit',
      'data-conversation-id': hit.conversation_id,
      'data-entry-id': hit.entry_id,
    }, head, snippet);
    link.addEventListener('click', (e) => {
      if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
      e.preventDefault();
      this.hooks.onOpen(hit);
    });
    return h('li', {}, link);
  }
}

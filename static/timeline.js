// timeline.js — one conversation's timeline: entries rendered by kind, kept in order,
// the "working" bubble, scrolling that follows new content, and the compaction pills.
import { h, byId, fmtExact, fmtResult, isBusy } from './util.js';
import { handoffCard, withContextNote } from './handoff.js';
import { withDetails } from './compaction.js';
import { sentImages } from './attach.js';

const NEAR_BOTTOM = 80; // px from the bottom that still count as "at the bottom"
const USER_SCROLL_MS = 1000; // a scroll this soon after the user's wheel, key or drag is theirs

const isQueued = (entry) => entry.kind === 'user' && entry.state === 'queued';
// Agent messages made only of tool calls have no text: they are not shown.
const isShown = (entry) => entry.kind !== 'agent' || Boolean(entry.text) || Boolean(entry.html);

// User and agent text is isolated (dir="auto"): a bidi control in it (U+202E) cannot
// reorder anything outside its element, and right-to-left text gets its own direction.

// ---- rendering per kind ------------------------------------------------------------------------

// A direction override or embedding (U+202A–E, U+2066–9) reverses the rest of its line: a file
// name picked from the @ menu (rtl\u202etxt.exe), or repeated by the agent, made the words after
// it read backwards. In shown text each word holding one is isolated (<bdi>): it reverses that
// word at most.
const CONTROL = /[\u202a-\u202e\u2066-\u2069]/;
const CONTROL_WORD = /(\S*[\u202a-\u202e\u2066-\u2069]\S*)/; // split() keeps each at an odd index

/** root with every word that holds a direction control isolated; root itself. */
function isolateControls(root) {
  if (!CONTROL.test(root.textContent)) return root;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const found = [];
  while (walker.nextNode()) if (CONTROL.test(walker.currentNode.data)) found.push(walker.currentNode);
  for (const node of found) {
    const parts = node.data.split(CONTROL_WORD);
    node.replaceWith(...parts.map((part, i) => (i % 2 ? h('bdi', { text: part }) : part)));
  }
  return root;
}

function userText(text) {
  return isolateControls(h('div', { class: 'plain', dir: 'auto', text }));
}

function userEntry(entry, old, timeline) {
  const queued = isQueued(entry);
  // Named for screen readers: the timeline's messages read "You" and "Agent" (no visible label).
  return h('div', { class: queued ? 'msg user queued' : 'msg user', testid: 'entry-user', role: 'article', 'aria-label': queued ? 'You (queued)' : 'You' },
    h('div', { class: 'bubble' }, sentImages(entry.data && entry.data.attachments),
      userText(entry.text)),
    queued ? h('div', { class: 'queued-foot' },
      timeline ? withdrawControl(entry, timeline) : null,
      h('span', { class: 'queued-badge', testid: 'queued-badge', text: 'Queued' })) : null);
}

/** Edit on a queued message: out of the queue and back into the message box, before the agent
 * gets it. Too late (it went out meanwhile) says so in a toast; the bubble's event follows. */
function withdrawControl(entry, timeline) {
  const button = h('button', {
    type: 'button', class: 'withdraw-btn', testid: 'withdraw', text: 'Edit',
    title: 'Take this message out of the queue and back into the message box',
    onclick: () => {
      button.disabled = true;
      timeline.hooks.onWithdraw(entry).catch(() => { button.disabled = false; });
    },
  });
  return button;
}

/** Make sanitized HTML (a message, a backup) nicer to use: links open in a new tab, code blocks
 * get a copy button. */
export function enhance(body) {
  for (const link of body.querySelectorAll('a[href]')) {
    link.target = '_blank';
    link.rel = 'noopener noreferrer nofollow';
  }
  for (const pre of body.querySelectorAll('pre')) {
    // A word, not a symbol: every font has it (U+29C9 showed as a box on a stock Debian).
    const copy = h('button', { type: 'button', class: 'copy-btn', title: 'Copy', 'aria-label': 'Copy code', testid: 'copy-code', text: 'Copy' });
    copy.addEventListener('click', () => {
      const code = pre.querySelector('code');
      navigator.clipboard?.writeText((code || pre).innerText).then(() => {
        copy.classList.add('copied');
        copy.textContent = 'Copied';
        setTimeout(() => { copy.classList.remove('copied'); copy.textContent = 'Copy'; }, 1200);
      }, () => {});
    });
    pre.classList.add('has-copy');
    pre.append(copy);
  }
}

// Blocks the streamed tail may go into (not links or emphasis: it would take their look).
const TAIL_BLOCKS = new Set(['P', 'LI', 'UL', 'OL', 'BLOCKQUOTE', 'PRE', 'TABLE', 'THEAD', 'TBODY', 'TR', 'TD', 'TH', 'H1', 'H2', 'H3', 'H4', 'H5', 'H6']);

/** Where the streamed text not yet rendered goes: the end of the rendered text's last block.
 * gap: the rendered part ended with white space, which the rendering drops at a paragraph's end
 * (a space, or a newline inside it): the tail starts with a space there ("permission" + "or"
 * ran together), never in code, whose newline is kept. */
function streamTail(body, tail, gap) {
  let target = body;
  for (let last = target.lastElementChild; last; last = target.lastElementChild) {
    if (!TAIL_BLOCKS.has(last.tagName) && !(last.tagName === 'CODE' && target.tagName === 'PRE')) break;
    target = last;
  }
  const code = target.tagName === 'CODE' || target.tagName === 'PRE';
  const lead = gap && !code && !/^\s/.test(tail || '') ? ' ' : '';
  const span = h('span', { class: 'stream-tail streaming', text: lead + (tail || '') }); // text only, never HTML
  target.append(span);
}

function agentEntry(entry) {
  const bubble = h('div', { class: 'bubble' });
  if (entry.state === 'streaming' && entry.html != null) {
    // Rendered while it streams: the server's sanitized HTML of the text so far (sent at
    // most every ~0.1 s), then the newer text as plain text until the next rendering.
    const body = h('div', { class: 'md', dir: 'auto', testid: 'streaming-md' });
    body.innerHTML = entry.html; // sanitized by the server, like a finished message
    streamTail(body, entry.tail, entry.gap);
    bubble.append(isolateControls(body));
  } else if (entry.state === 'streaming' || entry.html == null) {
    bubble.append(isolateControls(h('div', { class: entry.state === 'streaming' ? 'plain streaming' : 'plain', dir: 'auto', text: entry.text })));
  } else {
    const body = h('div', { class: 'md', dir: 'auto' });
    body.innerHTML = entry.html; // sanitized by the server: the only HTML the UI inserts
    enhance(body);
    bubble.append(isolateControls(body));
  }
  const foot = [];
  if (entry.state === 'interrupted') foot.push('Interrupted');
  const result = fmtResult(entry.data && entry.data.result);
  if (result) foot.push(result);
  return h('div', { class: 'msg agent', testid: 'entry-agent', role: 'article', 'aria-label': 'Agent' }, bubble,
    foot.length ? h('div', { class: 'msg-foot', testid: 'agent-footer', text: foot.join(' · ') }) : null);
}

/** A unified diff (an edit's, app/edits.py; a file's, app/changes.py), each line coloured by
 * its first character; text only. A bare "@@" (an edit's break) shows as "…". */
export function diffBlock(edit) {
  const pre = h('pre', { class: 'diff', testid: 'diff', dir: 'ltr' });
  const kinds = { '+': 'add', '-': 'del', '@': 'hunk' };
  for (const line of Array.isArray(edit.diff) ? edit.diff : []) {
    const kind = kinds[String(line)[0]] || 'ctx';
    const text = String(line) === '@@' ? '…' : visible(String(line)).shown;
    pre.append(h('span', { class: `diff-line ${kind}`, text }));
  }
  if (edit.more > 0) pre.append(h('span', { class: 'diff-line hunk', text: `… ${edit.more} more lines` }));
  return pre;
}

function toolEntry(entry, old) {
  const data = entry.data || {};
  const failed = entry.state === 'error' || data.is_error === true;
  let status;
  const cut = entry.state === 'interrupted'; // the turn ended (the agent or the relay stopped) first
  if (entry.state === 'running') status = h('span', { class: 'spinner', role: 'img', 'aria-label': 'running' });
  else if (cut) status = h('span', { class: 'tool-status cut', role: 'img', 'aria-label': 'interrupted', text: '–' });
  else if (failed) status = h('span', { class: 'tool-status err', role: 'img', 'aria-label': 'failed', text: '✗' });
  else status = h('span', { class: 'tool-status ok', role: 'img', 'aria-label': 'done', text: '✓' });
  const output = data.output ? String(data.output)
    : entry.state === 'running' ? 'Running…' : cut ? '(no result: the turn ended first)' : '(no output)';
  const details = h('details', { class: `activity tool${failed ? ' failed' : ''}`, testid: 'entry-activity' },
    h('summary', {},
      h('span', { class: 'tool-icon', 'aria-hidden': 'true', text: '🔧' }), ' ',
      h('span', { class: 'tool-name', dir: 'auto', text: data.tool || 'Tool' }),
      entry.text ? ' · ' : '',
      entry.text ? h('span', { class: 'tool-summary', dir: 'auto', text: visible(entry.text).shown }) : null,
      status),
    data.edit ? diffBlock(data.edit) : null,
    h('pre', { class: 'tool-output', dir: 'auto', text: output }));
  if (old && old.open) details.open = true;
  return details;
}

// Invisible characters (Unicode format: bidi controls, zero-width ones) in what a permission
// card approves. A U+202E in a command reverses how the rest of it reads: "touch PWNED"
// could show as a harmless echo. In a card each is shown as its code, ⟨U+202E⟩.
const INVISIBLE = /\p{Cf}/gu;

/** text with every invisible character shown as ⟨U+XXXX⟩ (and whether it held any). */
export function visible(text) {
  let found = false;
  const shown = String(text).replace(INVISIBLE, (c) => {
    found = true;
    return `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}⟩`;
  });
  return { shown, found };
}

/** The input field a permission card shows in its box: the command, else the path. */
function mainField(input) {
  if (input == null || typeof input !== 'object') return null;
  return ['command', 'file_path'].find((key) => typeof input[key] === 'string') || null;
}

/** What a permission asks to run, in one readable block. */
function inputSummary(input) {
  if (input == null) return '';
  if (typeof input === 'string') return input;
  const main = mainField(input);
  return main ? input[main] : JSON.stringify(input, null, 2);
}

// Shown otherwise when the card has a diff: an edit's strings, a write's content. The
// description is the model's own words about the call.
const DIFF_FIELDS = new Set(['old_string', 'new_string', 'content', 'edits']);

/** Every other field of a call's input, one row each under the box: what else is approved
 * (a timeout, run_in_background, replace_all, dangerouslyDisableSandbox...). */
function otherFields(input, main, hasDiff) {
  if (input == null || typeof input !== 'object' || main == null) return null;
  const shown = (key) => key === main || key === 'description' || (hasDiff && DIFF_FIELDS.has(key));
  const rows = Object.entries(input)
    .filter(([key, value]) => !shown(key) && value !== false) // (false: an option left off)
    .map(([key, value]) => h('div', { class: 'perm-field', testid: 'permission-field' },
      h('span', { class: 'perm-field-name', text: `${visible(key).shown}:` }), ' ',
      h('code', { dir: 'auto', text: visible(typeof value === 'string' ? value : JSON.stringify(value)).shown })));
  return rows.length ? h('div', { class: 'perm-fields' }, ...rows) : null;
}

const ANSWERS = { allowed: 'Allowed', denied: 'Denied', expired: 'Expired' };
const QUESTION_ANSWERS = { allowed: 'Answered', denied: 'Skipped', expired: 'Expired' };

/** A question's outcome as its card says it: "Expired: the turn was stopped" (why, when the
 * relay said: app/questions.py's EXPIRED_*), "Allowed", "Skipped"… */
function outcome(entry, labels) {
  const label = labels[entry.state] || entry.state;
  const why = entry.state === 'expired' && entry.data && entry.data.expired;
  return typeof why === 'string' && why ? `${label}: ${why}` : label;
}

const MAX_ANSWER = 5000; // characters per answer (PermissionAnswer in app/models.py)

/** The questions an AskUserQuestion call asks (each with its text), as the agent sent them. */
function askedQuestions(input) {
  const questions = input && Array.isArray(input.questions) ? input.questions : [];
  return questions.filter((q) => q && typeof q.question === 'string');
}

/** One question's fieldset: its options (radio buttons, or checkboxes for a multi-select),
 * each with its description, and a field for the user's own words. */
function questionGroup(entryId, question, index) {
  const multi = question.multiSelect === true;
  const name = `question-${entryId}-${index}`;
  const options = (Array.isArray(question.options) ? question.options : [])
    .filter((o) => o && typeof o.label === 'string');
  const inputs = options.map((o) => h('input', { type: multi ? 'checkbox' : 'radio', name, value: o.label }));
  const own = h('input', {
    type: 'text', class: 'question-own', maxlength: 5000, dir: 'auto', testid: 'question-own',
    placeholder: options.length ? 'Or your own answer' : 'Your answer', 'aria-label': `Your own answer to: ${question.question}`,
  });
  if (!multi) { // one answer: a choice or the user's own words
    own.addEventListener('input', () => { if (own.value.trim()) inputs.forEach((i) => { i.checked = false; }); });
    inputs.forEach((i) => i.addEventListener('change', () => { own.value = ''; }));
  }
  const fieldset = h('fieldset', { class: 'question-group', testid: 'question' },
    h('legend', {},
      question.header ? h('span', { class: 'question-header', dir: 'auto', text: visible(question.header).shown }) : null,
      h('span', { class: 'question-text', dir: 'auto', text: visible(question.question).shown })),
    ...options.map((o, i) => h('label', { class: 'question-option', testid: 'question-option' }, inputs[i],
      h('span', { class: 'question-option-text' }, // the label above its description
        h('span', { class: 'question-label', dir: 'auto', text: visible(o.label).shown }),
        typeof o.description === 'string' && o.description
          ? h('span', { class: 'question-desc', dir: 'auto', text: visible(o.description).shown }) : null))),
    own);
  // The answer as the agent takes it: the chosen labels, then the user's words, joined.
  const value = () => [...inputs.filter((i) => i.checked).map((i) => i.value), own.value.trim()]
    .filter(Boolean).join(', ');
  return { question: question.question, fieldset, value };
}

/** Where pills of this height go on a rail this high, each as near its line's place as it can
 *  be without covering another (close lines, or several pushed to an end, overlapped: a phone
 *  with its keyboard up). Only when they cannot all fit do they overlap, at the top. */
function spacedTops(wanted, height, railHeight) {
  const edge = Math.max(1, (24 - height) / 2 + 1); // the target's margin stays on the rail
  const lowest = railHeight - height - edge;
  const gap = Math.max(height, 24) + 2;
  const tops = wanted.map((top) => Math.max(edge, Math.min(top, lowest)));
  for (let i = 1; i < tops.length; i += 1) tops[i] = Math.max(tops[i], tops[i - 1] + gap);
  if (tops.length && tops[tops.length - 1] > lowest) tops[tops.length - 1] = lowest;
  for (let i = tops.length - 2; i >= 0; i -= 1) tops[i] = Math.min(tops[i], tops[i + 1] - gap);
  return tops.map((top) => Math.max(edge, top));
}

// Whether the last input was a key (not a pointer): an answer given by keyboard gives the
// keyboard back; a tap must not focus the composer (a phone would raise its keyboard).
let byKeyboard = false;
document.addEventListener('keydown', () => { byKeyboard = true; }, true);
document.addEventListener('pointerdown', () => { byKeyboard = false; }, true);

/** Called before a card's buttons are disabled (a disabled button drops the focus to the
 *  page): once answered by keyboard, the keyboard goes on in the composer if the card had the
 *  focus and nothing has it now (a keyboard user was left at the page's top). */
function keyboardBack(card) {
  const focused = byKeyboard && card.contains(document.activeElement);
  return () => {
    const now = document.activeElement;
    if (focused && (!now || now === document.body || !now.isConnected)) byId('message-input').focus();
  };
}

/** The agent's own questions (Claude Code's AskUserQuestion): a form whose answers go back
 * to it as the tool's result; Skip tells it the user declined. */
function questionEntry(entry, timeline) {
  const data = entry.data || {};
  const questions = askedQuestions(data.input);
  const card = h('div', { class: `activity permission question state-${entry.state}`, testid: 'entry-activity' },
    h('div', { class: 'perm-title' }, h('strong', { text: 'The agent asks' })));
  if (entry.state !== 'pending') {
    const answers = data.answers && typeof data.answers === 'object' ? data.answers : {};
    for (const q of questions) {
      const answer = typeof answers[q.question] === 'string' ? answers[q.question] : null;
      card.append(h('div', { class: 'question-done', testid: 'question-answered' },
        h('div', { class: 'question-text', dir: 'auto', text: visible(q.question).shown }),
        answer != null ? h('div', { class: 'question-answer', dir: 'auto', text: visible(answer).shown }) : null));
    }
    card.append(h('div', { class: `perm-answer ${entry.state}`, testid: 'permission-answer', text: outcome(entry, QUESTION_ANSWERS) }));
    return card;
  }
  const groups = questions.map((q, i) => questionGroup(entry.id, q, i));
  const error = h('span', { class: 'perm-error', role: 'alert', hidden: true });
  const submit = h('button', { type: 'submit', class: 'btn btn-primary btn-small', testid: 'question-submit', text: 'Answer' });
  const skip = h('button', { type: 'button', class: 'btn btn-small', testid: 'question-skip', text: 'Skip' });
  const send = (allow) => {
    let answers;
    if (allow) {
      answers = Object.fromEntries(groups.map((g) => [g.question, g.value()]));
      const wrong = Object.values(answers).some((a) => !a) ? 'Answer every question (or skip them all).'
        : Object.values(answers).some((a) => a.length > MAX_ANSWER) ? `An answer is over ${MAX_ANSWER.toLocaleString('en')} characters; shorten it.` : null;
      if (wrong) {
        error.textContent = wrong;
        error.hidden = false;
        return;
      }
    }
    const back = keyboardBack(card);
    submit.disabled = true;
    skip.disabled = true;
    error.hidden = true;
    timeline.hooks.onPermission(entry, allow, answers).then(back, (err) => {
      if (err.status === 409) return; // answered elsewhere first: the entry event will follow
      error.textContent = err.message;
      error.hidden = false;
      submit.disabled = false;
      skip.disabled = false;
    });
  };
  skip.addEventListener('click', () => send(false));
  // Esc in the form is not a Stop (it would expire the question and what was typed): it
  // clears the field it is in.
  const keep = (event) => {
    if (event.key !== 'Escape') return;
    event.preventDefault();
    if (event.target.type === 'text') event.target.value = '';
  };
  const form = h('form', { class: 'question-form', onkeydown: keep, onsubmit: (event) => { event.preventDefault(); send(true); } },
    ...groups.map((g) => g.fieldset),
    h('div', { class: 'perm-actions' }, submit, skip, error));
  card.append(form);
  return card;
}

// How a plan's approval goes on (ExitPlanMode): the mode it is approved with, or kept in planning.
const PLAN_CHOICES = [
  { text: 'Approve, accept edits', testid: 'plan-accept-edits', allow: true, more: { mode: 'acceptEdits' } },
  { text: 'Approve, ask before edits', testid: 'plan-ask', allow: true, more: { mode: 'default' } },
  { text: 'Keep planning', testid: 'plan-keep', allow: false, more: { message: 'The user wants to keep planning: the plan is not approved yet.' } },
];
const PLAN_ANSWERS = { allowed: 'Approved', denied: 'Kept in planning', expired: 'Expired' };
const PLAN_MODE_NAMES = { acceptEdits: 'edits accepted', default: 'asking before edits' };

/** Claude Code's plan, asked to be approved (plan mode ends with it): the plan as plain text,
 * then how the work goes on, as in Claude Code's own prompt. */
function planEntry(entry, timeline) {
  const data = entry.data || {};
  const plan = data.input && typeof data.input.plan === 'string' ? data.input.plan : '';
  const card = h('div', { class: `activity permission plan state-${entry.state}`, testid: 'entry-activity' },
    h('div', { class: 'perm-title' }, h('strong', { text: 'The agent’s plan' }),
      plan ? ': approve it and the agent starts the work.' : ' is ready (its text did not come with the question).'),
    plan ? h('div', { class: 'plan-text', dir: 'auto', testid: 'plan-text', text: visible(plan).shown }) : null);
  if (entry.state !== 'pending') {
    const how = entry.state === 'allowed' && PLAN_MODE_NAMES[data.approved_mode];
    const text = how ? `${PLAN_ANSWERS.allowed}, ${how}` : outcome(entry, PLAN_ANSWERS);
    card.append(h('div', { class: `perm-answer ${entry.state}`, testid: 'permission-answer', text }));
    return card;
  }
  const error = h('span', { class: 'perm-error', role: 'alert', hidden: true });
  const buttons = PLAN_CHOICES.map((choice, i) => h('button', {
    type: 'button', class: i === 0 ? 'btn btn-primary btn-small' : 'btn btn-small', testid: choice.testid, text: choice.text,
    onclick: () => {
      const back = keyboardBack(card);
      buttons.forEach((b) => { b.disabled = true; });
      error.hidden = true;
      timeline.hooks.onPermission(entry, choice.allow, null, choice.more).then(() => {
        // Kept in planning: what should change is typed next.
        if (!choice.allow) byId('message-input').focus();
        else back();
      }, (err) => {
        if (err.status === 409) return; // answered elsewhere first: the entry event will follow
        error.textContent = err.message;
        error.hidden = false;
        buttons.forEach((b) => { b.disabled = false; });
      });
    },
  }));
  card.append(h('div', { class: 'perm-actions' }, ...buttons, error));
  return card;
}

// A whole-file write over a file that is there says so (its old lines are in the diff).
const WANTS = { write: ' wants to write:', overwrite: ' wants to overwrite:' };

function permissionEntry(entry, timeline) {
  const data = entry.data || {};
  if (data.tool === 'AskUserQuestion') return questionEntry(entry, timeline);
  if (data.tool === 'ExitPlanMode') return planEntry(entry, timeline);
  const edit = data.edit && typeof data.edit === 'object' ? data.edit : null;
  const wants = !edit ? ' wants to run:' : WANTS[edit.kind] || ' wants to edit:';
  const main = visible(edit ? String(edit.file || '') : inputSummary(data.input));
  const hidden = main.found || visible(JSON.stringify(data.input ?? null)).found;
  const card = h('div', { class: `activity permission state-${entry.state}`, testid: 'entry-activity' },
    h('div', { class: 'perm-title' }, h('strong', { dir: 'auto', text: visible(data.tool || 'The agent').shown }), wants),
    h('pre', { class: 'perm-input', dir: 'auto', testid: 'permission-input', text: main.shown }),
    hidden ? h('div', { class: 'perm-warn', role: 'note', testid: 'permission-hidden',
      text: '⚠ It holds invisible characters (direction or zero-width), each shown as ⟨U+…⟩: read it as it will run.' }) : null,
    otherFields(data.input, mainField(data.input), Boolean(edit)),
    edit ? diffBlock(edit) : null);
  if (entry.state !== 'pending') {
    card.append(h('div', { class: `perm-answer ${entry.state}`, testid: 'permission-answer', text: outcome(entry, ANSWERS) }));
    return card;
  }
  const error = h('span', { class: 'perm-error', role: 'alert', hidden: true });
  const answer = (allow) => {
    const back = keyboardBack(card);
    allow_.disabled = true;
    deny.disabled = true;
    error.hidden = true;
    timeline.hooks.onPermission(entry, allow).then(back, (err) => {
      if (err.status === 409) return; // someone else answered first: the entry event will follow
      error.textContent = err.message;
      error.hidden = false;
      allow_.disabled = false;
      deny.disabled = false;
    });
  };
  const allow_ = h('button', { type: 'button', class: 'btn btn-primary btn-small', testid: 'permission-allow', text: 'Allow', onclick: () => answer(true) });
  const deny = h('button', { type: 'button', class: 'btn btn-small', testid: 'permission-deny', text: 'Deny', onclick: () => answer(false) });
  card.append(h('div', { class: 'perm-actions' }, allow_, deny, error));
  return card;
}

function activityEntry(entry, old, timeline) {
  const type = entry.data && entry.data.type;
  if (type === 'tool') return toolEntry(entry, old);
  if (type === 'permission') return permissionEntry(entry, timeline);
  if (type === 'handoff') return handoffCard(entry);
  // SDK compaction and anything newer: a quiet row with its text (a compaction's opens its details).
  const compaction = type === 'compaction';
  const text = h(compaction ? 'button' : 'span', { type: compaction ? 'button' : null, class: 'note-text', dir: 'auto', text: entry.text });
  const row = h('div', { class: `activity note${compaction ? ' compaction' : ''}`, testid: 'entry-activity' }, text, backupRef(entry));
  if (compaction) text.dataset.testid = 'compaction-note';
  return compaction ? withDetails(row, text, entry, old) : row;
}

/** A compaction's link to the backup written just before it (opened by backups.js). */
function backupRef(entry) {
  const name = entry.data && entry.data.type === 'compaction' && entry.data.backup;
  if (typeof name !== 'string') return null;
  return h('a', { class: 'backup-ref', href: '#', 'data-backup': name, title: name, testid: 'compaction-backup', text: `↳ ${name}` });
}

/** The tooltip of a compaction line: "auto compaction · 150,046 → 3,012 tokens". */
function compactionTitle(entry) {
  const data = entry.data || {};
  const head = `${data.trigger || 'auto'} compaction`;
  if (entry.state === 'running') return `${head} · in progress`;
  if (data.pre_tokens != null && data.post_tokens != null) {
    return `${head} · ${fmtExact(data.pre_tokens)} → ${fmtExact(data.post_tokens)} tokens`;
  }
  if (data.pre_tokens != null) return `${head} · was ${fmtExact(data.pre_tokens)} tokens`;
  return head;
}

/** A line's button that sends its message again, once (data.resent: "Resent"): Resend on a
 * cut turn's line (data.resend), Trust and resend on a start refused for new settings
 * (data.trust). */
function resendControl(entry, timeline, { text, title, testid, hook, done = 'Resent' }) {
  if (entry.data.resent) return h('span', { class: 'resend-done', testid: `${testid}-done`, text: done });
  const error = h('span', { class: 'perm-error', role: 'alert', hidden: true });
  const button = h('button', {
    type: 'button', class: 'btn btn-small', testid, text, title,
    onclick: () => {
      button.disabled = true;
      error.hidden = true;
      hook(entry).catch((err) => {
        error.textContent = err.message;
        error.hidden = false;
        // 409: done elsewhere already (the line's event follows and redraws it) or the
        // conversation archived or being deleted meanwhile: said, never pressed again.
        button.disabled = err.status === 409;
      });
    },
  });
  return h('span', { class: 'resend' }, button, error);
}

function lineEntry(entry, old, timeline) {
  const data = entry.data || {};
  const level = ['warning', 'error'].includes(data.level) ? data.level : 'info';
  const compaction = data.type === 'compaction'; // its text is a button: it opens the details
  const text = h(compaction ? 'button' : 'span', { type: compaction ? 'button' : null, class: 'line-text', dir: 'auto', text: entry.text });
  const line = h('div', { class: `line level-${level}`, testid: 'entry-line', role: level === 'error' ? 'alert' : null }, text);
  if (compaction) {
    line.classList.add('compaction');
    if (entry.state === 'running') line.classList.add('running');
    text.dataset.testid = 'compaction-line';
    text.title = compactionTitle(entry);
    const ref = backupRef(entry);
    if (ref) text.after(ref);
    return withDetails(line, text, entry, old);
  }
  if (data.type === 'cut' && data.resend && timeline) {
    line.append(resendControl(entry, timeline, {
      text: 'Resend', title: 'Send this message to the agent again', testid: 'resend', hook: timeline.hooks.onResend,
    }));
  }
  if (Array.isArray(data.trust) && timeline) {
    const files = data.trust.join(', ');
    // again false: a live agent was stopped (its turn over): trusted, nothing sent again.
    line.append(resendControl(entry, timeline, data.again === false ? {
      text: 'Trust these settings', title: `Let ${files} act in this conversation's agent`,
      testid: 'trust-resend', hook: timeline.hooks.onTrust, done: 'Trusted',
    } : {
      text: 'Trust and resend', title: `Let ${files} act when the agent starts, and send the message again`,
      testid: 'trust-resend', hook: timeline.hooks.onTrust,
    }));
  }
  return line;
}

/** The first words of a message, for its Pin button's name. */
function pinWords(text) {
  const line = String(text || '').slice(0, 300).split(/\s+/).join(' ').trim();
  return line.length > 60 ? `${line.slice(0, 59)}…` : line;
}

/** A message's pin: a button in an active conversation, a mark in an archived one (SPEC §8). */
function pinControl(entry, timeline) {
  if (!timeline || (entry.kind !== 'user' && entry.kind !== 'agent')) return null;
  if (isQueued(entry) || entry.state === 'streaming' || !String(entry.text || '').trim()) return null;
  const pinned = timeline.pinned.has(entry.id);
  // The words are drawn by CSS (::after): the message's textContent stays its text alone.
  if (!timeline.pinEditable) {
    return pinned ? h('span', { class: 'pin-mark', testid: 'pinned-mark', role: 'img', 'aria-label': 'Pinned' }) : null;
  }
  return h('button', {
    type: 'button', class: `pin-btn${pinned ? ' pinned' : ''}`, testid: 'pin-toggle',
    // Named with the message's first words: a list of buttons all called "Pin" told a screen
    // reader's user nothing of which message each pins.
    'aria-pressed': String(pinned), 'aria-label': `Pin: ${pinWords(entry.text)}`,
    title: pinned ? 'Unpin: stop carrying this message into compactions' : 'Pin: carry this message into every compaction',
    onclick: () => timeline.hooks.onPin(entry, !pinned),
  });
}

const RENDER = { user: withContextNote(userEntry), agent: agentEntry, activity: activityEntry, line: lineEntry };

// ---- the timeline ------------------------------------------------------------------------------

export class Timeline {
  /** hooks: onPermission(entry, allow) → Promise, onResend(line) → Promise, onTrust(line) → Promise, onWithdraw(entry) → Promise,
   *  onLoadEarlier(), onPin(entry, on) */
  constructor(hooks) {
    this.hooks = hooks;
    this.scroller = byId('timeline');
    this.inner = byId('timeline-inner');
    this.list = byId('entries'); // sent entries, by seq
    this.queuedList = byId('queued-entries'); // queued user messages, by seq, always last
    this.queuedMore = byId('queued-more'); // how many more wait (a read shows the next 100)
    this.rail = byId('pill-rail');
    this.newPill = byId('new-messages');
    this.earlier = byId('load-earlier');
    this.cursor = null; // the relay's "earlier": where the page before the loaded ones ends
    this.emptyHint = byId('timeline-empty');
    this.items = new Map(); // entry id → { entry, el } (el is null for entries not shown)
    this.askedFor = new Map(); // tool id → seq of its permission question
    this.turn = { state: 'idle', queued: 0 };
    this.pinned = new Set(); // ids of the pinned messages (steer.js)
    this.pinEditable = false;
    this.stick = true; // follow new content (the user is at the bottom)
    this.fresh = false; // new content arrived since the last frame
    this.frame = 0;

    this.indicator = h('div', { class: 'msg agent thinking', testid: 'turn-indicator', hidden: true },
      h('div', { class: 'bubble' },
        h('span', { class: 'dots', 'aria-hidden': 'true' }, h('i'), h('i'), h('i')),
        h('span', { class: 'thinking-label', text: 'Working…' })));
    byId('timeline-end').append(this.indicator);

    // Only the user's own scrolling lets go of the bottom. A scroll event the content caused
    // (a card replaced by a taller one: the browser clamps, the content grows again before
    // the event is handled) read as "away from the bottom", and the timeline stopped following.
    this.userScrolled = -Infinity; // when the user last did something that scrolls
    const intent = () => { this.userScrolled = performance.now(); };
    this.scroller.addEventListener('wheel', intent, { passive: true });
    this.scroller.addEventListener('touchmove', intent, { passive: true });
    this.scroller.addEventListener('pointerdown', (e) => { // its scrollbar, not what it holds
      if (e.target === this.scroller) intent();
    }, { passive: true });
    window.addEventListener('keydown', (e) => {
      const typing = e.target.closest?.('input, textarea, [contenteditable]');
      if (['PageUp', 'PageDown'].includes(e.key)
        || (!typing && ['Home', 'End', 'ArrowUp', 'ArrowDown', ' '].includes(e.key))) intent();
    }, { capture: true, passive: true });
    this.scroller.addEventListener('scroll', () => {
      if (this.nearBottom()) {
        this.stick = true;
        this.newPill.hidden = true;
      } else if (performance.now() - this.userScrolled < USER_SCROLL_MS) {
        this.stick = false;
      }
    }, { passive: true });
    this.newPill.addEventListener('click', () => this.scrollToBottom());
    this.earlier.addEventListener('click', () => this.hooks.onLoadEarlier());
    const resize = new ResizeObserver(() => this.schedule(false));
    resize.observe(this.scroller);
    resize.observe(this.inner);
  }

  nearBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < NEAR_BOTTOM;
  }

  scrollToBottom() {
    this.stick = true;
    this.newPill.hidden = true;
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  /** Replace everything (a conversation opened, or a snapshot). */
  reset(entries, hasMore, { keepScroll = false, earlier = null } = {}) {
    const top = this.scroller.scrollTop;
    this.items.clear();
    this.askedFor.clear();
    this.list.replaceChildren();
    this.queuedList.replaceChildren();
    for (const entry of entries) this.add(entry);
    this.setHasMore(hasMore, earlier);
    if (keepScroll && !this.stick) {
      this.scroller.scrollTop = top;
    } else {
      this.stick = true;
      this.newPill.hidden = true;
      this.scroller.scrollTop = this.scroller.scrollHeight;
    }
    this.changed(false);
  }

  setHasMore(hasMore, earlier = null) {
    this.earlier.hidden = !hasMore;
    this.earlier.disabled = false;
    this.cursor = hasMore ? earlier ?? null : null;
  }

  /** Where "Load earlier messages" continues from: the relay's cursor (the lowest seq its
   *  last page read, which may have shown nothing of its own when it held only queued
   *  messages), else (a relay without one) the lowest seq loaded. */
  pageBefore() {
    return this.cursor ?? this.lowestSeq();
  }

  /** Lowest seq loaded: where "Load earlier messages" continues from (not a queued message's:
   *  the next ones to run are always shown, whatever page was read, and may be older). */
  lowestSeq() {
    let low = Infinity;
    let lowQueued = Infinity; // (when only queued messages are loaded: from the oldest of them)
    for (const { entry } of this.items.values()) {
      if (isQueued(entry)) lowQueued = Math.min(lowQueued, entry.seq);
      else low = Math.min(low, entry.seq);
    }
    if (!Number.isFinite(low)) low = lowQueued;
    return Number.isFinite(low) ? low : null;
  }

  /** Add older entries above the ones shown without moving what the user is looking at. */
  prepend(entries, hasMore, earlier = null) {
    const before = this.scroller.scrollHeight;
    const top = this.scroller.scrollTop;
    for (const entry of entries) if (!this.items.has(entry.id)) this.add(entry);
    this.setHasMore(hasMore, earlier);
    this.scroller.scrollTop = top + (this.scroller.scrollHeight - before);
    this.changed(false);
  }

  has(id) {
    return this.items.has(id);
  }

  /** The state of an entry as shown now (undefined: not in the timeline). */
  stateOf(id) {
    return this.items.get(id)?.entry.state;
  }

  upsert(entry) {
    const item = this.items.get(entry.id);
    if (item) {
      item.entry = entry;
      this.draw(item);
    } else {
      this.add(entry);
    }
    this.changed(true);
  }

  /** The last queued message shown (the next to edit with ↑), or null. */
  lastQueued() {
    const el = this.queuedList.lastElementChild;
    const item = el && this.items.get(Number(el.dataset.entryId));
    return item && isQueued(item.entry) ? item.entry : null;
  }

  remove(id) {
    const item = this.items.get(id);
    if (!item) return;
    if (item.el) item.el.remove();
    this.items.delete(id);
    this.changed(false);
  }

  /** More streamed text, or (html) the server's rendering of the text's first `rendered`
   *  UTF-16 units: what follows them stays plain text until the next rendering. */
  delta(id, text, html, rendered) {
    const item = this.items.get(id);
    if (!item) return;
    const was = item.entry;
    if (was.state !== 'streaming') return; // late: the finished message is shown whole
    const full = was.text + text;
    const cut = rendered ?? full.length;
    const update = html != null
      ? { html, tail: full.slice(cut), gap: cut > 0 && /\s/.test(full[cut - 1]) }
      : { tail: (was.tail || '') + text };
    item.entry = { ...was, text: full, ...update };
    const streaming = item.el && was.state === 'streaming';
    const plain = streaming && html == null ? item.el.querySelector('.stream-tail, .plain') : null;
    if (plain && !CONTROL.test(text)) plain.append(text); // (one holding a control: redrawn isolated)
    else this.draw(item);
    this.changed(true);
  }

  /** The pinned messages changed (or whether they can change): redraw the messages concerned. */
  setPins(ids, editable) {
    const all = editable !== this.pinEditable;
    const was = this.pinned;
    this.pinned = ids;
    this.pinEditable = editable;
    for (const item of this.items.values()) {
      const { kind, id } = item.entry;
      if ((kind === 'user' || kind === 'agent') && (all || was.has(id) !== ids.has(id))) this.draw(item);
    }
  }

  setTurn(turn) {
    const wasBusy = isBusy(this.turn);
    this.turn = turn || { state: 'idle', queued: 0 };
    this.changed(!wasBusy && isBusy(this.turn)); // the working bubble appearing is news; its end is not
  }

  add(entry) {
    const item = { entry, el: null };
    this.items.set(entry.id, item);
    this.draw(item);
  }

  /** Where an entry sorts: by seq, but a tool's row just after its own permission question
   *  (Claude Code announces the call, then asks: shown in seq order it read "ran, then asked"). */
  order(entry) {
    const data = entry.data || {};
    const asked = data.type === 'tool' ? this.askedFor.get(data.tool_id) : undefined;
    return asked !== undefined && asked > entry.seq ? asked + 0.5 : entry.seq;
  }

  /** A permission question seen: its tool's row (if shown) moves below it. */
  noteQuestion(entry) {
    const data = entry.data || {};
    if (entry.kind !== 'activity' || data.type !== 'permission' || data.tool_id == null) return;
    if (this.askedFor.has(data.tool_id)) return;
    this.askedFor.set(data.tool_id, entry.seq);
    for (const other of this.items.values()) {
      const od = other.entry.data || {};
      if (other.el && other.entry.kind === 'activity' && od.type === 'tool' && od.tool_id === data.tool_id) {
        other.el.dataset.order = this.order(other.entry);
        this.place(other.el, other.entry);
      }
    }
  }

  /** (Re)build an entry's element and put it in its place. */
  draw(item) {
    const { entry } = item;
    this.noteQuestion(entry);
    const old = item.el;
    const el = isShown(entry) ? this.build(entry, old) : null;
    const hadFocus = old && old.contains(document.activeElement);
    if (old && el) old.replaceWith(el);
    else if (old) old.remove();
    item.el = el;
    if (!el) return;
    this.place(el, entry);
    if (hadFocus) el.querySelector('summary, button:not(:disabled)')?.focus({ preventScroll: true });
  }

  build(entry, old) {
    const render = RENDER[entry.kind] || lineEntry;
    const el = render(entry, old, this);
    const pin = pinControl(entry, this);
    if (pin) el.append(pin);
    el.classList.add('entry');
    el.dataset.entryId = entry.id;
    el.dataset.seq = entry.seq;
    el.dataset.order = this.order(entry);
    el.dataset.kind = entry.kind;
    el.dataset.state = entry.state;
    return el;
  }

  /** Keep each list sorted by seq; queued user messages live in their own list at the end. */
  place(el, entry) {
    const list = isQueued(entry) ? this.queuedList : this.list;
    const seq = +el.dataset.order; // the seq, or just after a tool's permission question
    const prev = el.previousElementSibling;
    const next = el.nextElementSibling;
    if (el.parentNode === list && (!prev || +prev.dataset.order < seq) && (!next || +next.dataset.order > seq)) return;
    let before = null; // most entries arrive last: scan from the end
    for (let child = list.lastElementChild; child; child = child.previousElementSibling) {
      if (child === el) continue;
      if (+child.dataset.order < seq) break;
      before = child;
    }
    list.insertBefore(el, before);
  }

  /** After any change: the working bubble now, scrolling and pills on the next frame. */
  changed(fresh) {
    const busy = isBusy(this.turn);
    const compacting = this.turn.state === 'compacting';
    const last = this.list.lastElementChild;
    const streaming = Boolean(last) && last.dataset.kind === 'agent' && last.dataset.state === 'streaming';
    this.indicator.hidden = !busy || (streaming && !compacting);
    this.emptyHint.hidden = busy || this.list.childElementCount + this.queuedList.childElementCount > 0;
    const more = this.turn.queued - this.queuedList.childElementCount;
    this.queuedMore.hidden = more <= 0;
    const moreText = more > 0 ? `…and ${more} more queued (each shows here as its turn comes)` : '';
    if (this.queuedMore.textContent !== moreText) this.queuedMore.textContent = moreText;
    // A question of the agent's waits: the turn is held by the user, not working.
    const asking = !compacting && this.list.querySelector('[data-state="pending"]') !== null;
    const label = compacting ? 'Compacting the conversation…' : asking ? 'Waiting for your answer…' : 'Working…';
    const labelEl = this.indicator.querySelector('.thinking-label');
    if (labelEl.textContent !== label) labelEl.textContent = label;
    this.indicator.classList.toggle('asking', asking);
    this.schedule(fresh);
  }

  schedule(fresh) {
    this.fresh = this.fresh || fresh;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = 0;
    if (this.stick) this.scroller.scrollTop = this.scroller.scrollHeight;
    else if (this.fresh && this.items.size) this.newPill.hidden = false;
    this.fresh = false;
    this.drawPills();
  }

  // ---- compaction pills ------------------------------------------------------------------------

  /** One pill per compaction line, at the line's height in the timeline, mapped onto the rail. */
  drawPills() {
    const lines = [...this.list.querySelectorAll('.line.compaction')];
    const total = this.scroller.scrollHeight;
    const railHeight = this.rail.clientHeight;
    const pills = [...this.rail.children];
    const drawn = lines.map((line, index) => {
      let pill = pills[index];
      if (!pill) {
        pill = h('button', { type: 'button', class: 'compaction-pill', testid: 'compaction-pill' },
          h('span', { class: 'pill-tip', testid: 'compaction-pill-label', 'aria-hidden': 'true' }));
        pill.addEventListener('click', () => this.reveal(this.pillLines[+pill.dataset.index]));
        this.rail.append(pill);
      }
      return pill;
    });
    const tops = spacedTops(lines.map((line) => (total > 0 ? (line.offsetTop / total) * railHeight : 0)),
      drawn[0] ? drawn[0].offsetHeight : 0, railHeight);
    lines.forEach((line, index) => {
      const pill = drawn[index];
      const text = line.querySelector('.line-text');
      pill.dataset.index = index;
      pill.style.top = `${tops[index]}px`;
      // Labelled with the line's numbers: shown beside the pill, and read out.
      const label = text.title ? `${text.textContent} (${text.title})` : text.textContent;
      if (pill.firstChild.textContent !== text.textContent) pill.firstChild.textContent = text.textContent;
      pill.setAttribute('aria-label', `Go to: ${label}`);
      pill.classList.toggle('running', line.classList.contains('running'));
    });
    for (const extra of pills.slice(lines.length)) extra.remove();
    this.pillLines = lines;
    this.rail.classList.toggle('empty', lines.length === 0);
  }

  reveal(line) {
    if (!line || !line.isConnected) return;
    this.stick = false; // stay on the line (its scroll event sticks again if it is at the end)
    line.scrollIntoView({ block: 'center' });
    line.classList.remove('flash');
    void line.offsetWidth; // restart the animation
    line.classList.add('flash');
    setTimeout(() => line.classList.remove('flash'), 1800);
  }
}

"""Agent Markdown to safe HTML: raw HTML is escaped by the parser, then sanitized."""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence

import nh3
from linkify_it import LinkifyIt
from linkify_it.main import Match
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.rules_core import StateCore
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

HIGHLIGHT_CLASSES = frozenset(name for name in STANDARD_TYPES.values() if name)  # "k", "nf", …
_FORMATTER = HtmlFormatter(nowrap=True)  # spans with Pygments' short class names, no inline style


@functools.lru_cache(maxsize=64)
def _lexer(language: str) -> Lexer | None:
    """The lexer for a language name (looking one up scans every lexer: ~2 ms)."""
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _highlight(code: str, language: str, _attrs: str) -> str:
    """Code in a fenced block with a known language as highlighted HTML; "" leaves it plain."""
    lexer = _lexer(language.lower()) if language else None  # no guessing: slow, often wrong
    if lexer is None:
        return ""
    key = f"{language}\0{code}"  # a streaming message re-renders its blocks many times
    html = _blocks.get(key)
    if html is None:
        html = highlight(code, lexer, _FORMATTER)
        _blocks.put(key, html)
    return html


# Without fuzzy matching every link linkify-it finds holds one of these: its schemes are http:,
# https: and ftp: (each followed by //), // and mailto:.
_SCHEME_MARK = re.compile(r"//|mailto:", re.IGNORECASE)
# Closing quotation marks, never a link's end: Unicode's final punctuation (category Pf, as
# tests/test_render.py checks) and the CJK ones.
CLOSING_QUOTES = "»’”›⸃⸅⸊⸍⸝⸡」』〉》"


class _SchemeLinks(LinkifyIt):
    """linkify-it finding only links written with their scheme, and quicker to say "none".

    Its own pretest (one large regex, case-insensitive) took more than half of rendering a
    paragraph of 60,000 characters; a paragraph with neither mark cannot hold such a link.
    """

    def __init__(self) -> None:
        super().__init__()
        # Fuzzy matching would make "app.py" a link (.py is a TLD), and any word@host a mail.
        self.set({"fuzzy_link": False, "fuzzy_email": False})

    def pretest(self, text: str) -> bool:
        """False when text can hold no link; else linkify-it's own (quick, inexact) test."""
        return _SCHEME_MARK.search(text) is not None and super().pretest(text)

    def match(self, text: str) -> list[Match] | None:
        """linkify-it's links (markdown-it's core rule), each without closing quotes."""
        found = super().match(text)
        for link in found or ():
            _without_closing_quotes(link)
        return found

    def match_at_start(self, text: str) -> Match | None:
        """linkify-it's link at text's start (markdown-it's inline rule), without them."""
        link = super().match_at_start(text)
        return None if link is None else _without_closing_quotes(link)


def _without_closing_quotes(link: Match) -> Match:
    """A link without the closing quotation marks it ends with (changed in place).

    linkify-it keeps a `”`, `’` or `»` written right after a link (“https://x.org/a”) as part
    of its path; agents quote links that way.
    """
    body = link.raw.rstrip("*")  # "**“https://x.org/a”**": emphasis closes after the quote
    kept = body
    while (shorter := kept.rstrip(CLOSING_QUOTES)) != kept:
        # and the punctuation inside the quote: “https://x.org/a,” he said (as linkify-it
        # leaves out a link's last comma or period when nothing follows it)
        kept = shorter.rstrip(".,;:!?")
    cut = len(link.raw) - len(kept)
    if kept != body and kept:
        link.last_index -= cut
        link.raw, link.text, link.url = link.raw[:-cut], link.text[:-cut], link.url[:-cut]
    return link


_ALIGN = re.compile(r"^text-align:(left|center|right)$")
ALIGN_CLASSES = {"align-left", "align-center", "align-right"}


def _alignment_as_class(state: StateCore) -> None:
    """Table column alignment as a class: the CSP forbids the inline style markdown-it writes."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and token.attrs:
            style = token.attrs.pop("style", None)
            match = _ALIGN.match(str(style or ""))
            if match:
                token.attrSet("class", f"align-{match.group(1)}")


def _image_as_link(
    renderer: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    """An image as a link to it, its alt text the link's words: the relay shows no image
    (nothing is fetched unasked), and before this nothing at all showed, not even the alt."""
    token = tokens[idx]
    words = renderer.renderInlineAsText(token.children or [], options, env) or "image"
    return f'<a href="{escapeHtml(token.attrGet("src") or "")}">{escapeHtml(words)}</a>'


def _parser(*, breaks: bool = False) -> MarkdownIt:
    """The relay's Markdown: CommonMark, tables, strikethrough, links found by scheme, no raw
    HTML; breaks: a newline inside a paragraph is a line break (a backup's header lines)."""
    md = MarkdownIt(
        "commonmark",
        {"html": False, "linkify": True, "highlight": _highlight, "breaks": breaks},
    ).enable(["table", "strikethrough", "linkify"])
    md.linkify = _SchemeLinks()
    md.core.ruler.push("alignment_as_class", _alignment_as_class)
    md.add_render_rule("image", _image_as_link)
    return md


_markdown = _parser()
_backup_markdown = _parser(breaks=True)


def _cut_marks(state: StateInline) -> None:
    """In a text cut out of a longer one, drop the emphasis marks whose pair was cut away: a
    mark that could only open (`*ask` before the cut's end) or only close (after its start).

    After the emphasis rules, a mark they paired is a tag token; one left unpaired is still
    the text token holding its character. `state.env`: {"cut_start", "cut_end"} (booleans).
    """
    start, end = state.env.get("cut_start", False), state.env.get("cut_end", False)
    runs = [state.delimiters] + [meta["delimiters"] for meta in state.tokens_meta if meta]
    for delimiters in runs:
        for mark in delimiters:
            token = state.tokens[mark.token]
            if token.type != "text" or token.content.strip(chr(mark.marker)):
                continue  # paired (now a tag)
            if (end and mark.open and not mark.close) or (start and mark.close and not mark.open):
                token.content = ""


_words_markdown = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
_words_markdown.inline.ruler2.after("emphasis", "cut_marks", _cut_marks)


def markdown_words(text: str, *, cut_start: bool = False, cut_end: bool = False) -> str:
    """Markdown as the words its rendering shows, in one line: no emphasis or heading marks,
    a link as its words, an image as its alt text, code as written (search snippets).

    cut_start, cut_end: the text was cut out of a longer one there (a snippet): an emphasis
    mark whose pair lay beyond the cut is dropped, as the whole text's rendering hides it.
    """
    parts: list[str] = []
    env = {"cut_start": cut_start, "cut_end": cut_end}
    for token in _words_markdown.parse(text, env):
        if token.type == "inline":
            parts += _inline_words(token.children or [])
        elif token.type in ("fence", "code_block"):
            parts.append(token.content)
        elif token.block and token.nesting == -1:  # a block, a list item or a cell ends
            parts.append(" ")
    return " ".join("".join(parts).split())


def _inline_words(tokens: Sequence[Token]) -> list[str]:
    words: list[str] = []
    for token in tokens:
        if token.type in ("text", "code_inline"):
            words.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            words.append(" ")
        elif token.type == "image":
            words += _inline_words(token.children or [])
    return words


_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a",
    "table", "thead", "tbody", "tr", "th", "td", "span",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "ol": {"start"},
}
_ATTRIBUTE_VALUES = {
    "th": {"class": ALIGN_CLASSES},
    "td": {"class": ALIGN_CLASSES},
    "span": {"class": HIGHLIGHT_CLASSES},  # highlighted code: Pygments' classes and no other
}


CACHE_BYTES = 8 * 1024 * 1024  # memory the cache's Markdown and HTML texts take at most


class TextCache:
    """A least-recently-used cache of texts, bounded by the bytes its texts take."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes (sys.getsizeof) of the keys and values kept
        self._items: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()  # routes render in the loop and in worker threads

    def get(self, key: str) -> str | None:
        """The cached value, now the most recently used; None when absent."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: str) -> None:
        """Keep a value, forgetting the least recently used beyond the bound."""
        size = sys.getsizeof(key) + sys.getsizeof(value)
        if size > self.limit // 16:  # a huge text would push out hundreds of ordinary ones
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.held -= sys.getsizeof(key) + sys.getsizeof(old)
            self._items[key] = value
            self.held += size
            while self.held > self.limit:
                first, dropped = self._items.popitem(last=False)
                self.held -= sys.getsizeof(first) + sys.getsizeof(dropped)

    def __len__(self) -> int:
        return len(self._items)


_cache = TextCache(CACHE_BYTES)
_blocks = TextCache(CACHE_BYTES // 4)  # highlighted code blocks, by language and code


def render_markdown(text: str) -> str:
    """Render agent Markdown as sanitized HTML (no script, no images, no raw HTML)."""
    cached = _cache.get(text)
    if cached is None:
        cached = _render(text)
        _cache.put(text, cached)
    return cached


def render_partial(text: str) -> str:
    """Render a message still being written (uncached: each partial text is seen once)."""
    return _render(text)


def render_backup(text: str) -> str:
    """Render a backup file: its consecutive `**Field:** value` lines each on a line (SPEC §6)."""
    return _sanitized(_backup_markdown.render(text))


def _render(text: str) -> str:
    return _sanitized(_markdown.render(text))


def _sanitized(html: str) -> str:
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        tag_attribute_values=_ATTRIBUTE_VALUES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )

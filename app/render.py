"""Agent Markdown to safe HTML: raw HTML is escaped by the parser, then sanitized."""

from __future__ import annotations

import re
from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_markdown.enable("strikethrough")

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


_markdown.core.ruler.push("alignment_as_class", _alignment_as_class)

_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "ol": {"start"},
}
_ATTRIBUTE_VALUES = {"th": {"class": ALIGN_CLASSES}, "td": {"class": ALIGN_CLASSES}}


@lru_cache(maxsize=4096)
def render_markdown(text: str) -> str:
    """Render agent Markdown as sanitized HTML (no script, no images, no raw HTML)."""
    html = _markdown.render(text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        tag_attribute_values=_ATTRIBUTE_VALUES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )

"""Agent Markdown to safe HTML: raw HTML is escaped by the parser, then sanitized."""

from __future__ import annotations

from functools import lru_cache

import nh3
from markdown_it import MarkdownIt

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_markdown.enable("strikethrough")

_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6", "a",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
_ATTRIBUTES = {
    "a": {"href", "title"},
    "code": {"class"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
}


@lru_cache(maxsize=4096)
def render_markdown(text: str) -> str:
    """Render agent Markdown as sanitized HTML (no script, no images, no raw HTML)."""
    html = _markdown.render(text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )

"""Agent Markdown becomes sanitized HTML: formatting stays, nothing executable survives."""

from __future__ import annotations

import re

import pytest

from app.render import render_markdown
from tests.xss_corpus import PAYLOADS

EXECUTABLE = re.compile(
    r"<\s*(script|iframe|object|embed|svg|math|img|style|link|meta|base|form|input|button|"
    r"select|textarea|video|audio|details|marquee|template|body|isindex|xss)\b"
    r"|\son\w+\s*=|javascript:|data:text|formaction|srcdoc",
    re.IGNORECASE,
)


def test_render_markdown_keeps_formatting() -> None:
    html = render_markdown("# Title\n\n**bold** `code`\n\n- a\n- b\n\n[link](https://example.com)")
    assert html == (
        "<h1>Title</h1>\n<p><strong>bold</strong> <code>code</code></p>\n"
        "<ul>\n<li>a</li>\n<li>b</li>\n</ul>\n"
        '<p><a href="https://example.com" rel="noopener noreferrer nofollow">link</a></p>\n'
    )


def test_render_markdown_keeps_code_blocks_as_text() -> None:
    html = render_markdown("```py\nif a < b:\n    print('<b>')\n```")
    html = re.sub(r'<span class="[a-z0-9]+">|</span>', "", html)  # Pygments' highlighting
    assert html == (
        "<pre><code class=\"language-py\">if a &lt; b:\n    print('&lt;b&gt;')\n</code></pre>\n"
    )


@pytest.mark.parametrize("payload", PAYLOADS)
def test_render_markdown_neutralizes_payload(payload: str) -> None:
    html = render_markdown(payload)
    # Whatever survives is text: no executable tag, handler or script URL is left as markup.
    markup = re.sub(r">[^<]*<", "><", f">{html}<")
    assert not EXECUTABLE.search(markup), html

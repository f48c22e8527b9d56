"""Issue 17's rough edges, the pure parts: rendering of code, links and partial text."""

from __future__ import annotations

import nh3

from app.render import HIGHLIGHT_CLASSES, render_markdown, render_partial


def test_fenced_code_with_a_language_is_highlighted_with_classes_only() -> None:
    html = render_markdown("```python\ndef f():\n    return '<b>'\n```")
    assert '<span class="k">def</span>' in html
    assert "&lt;b&gt;" in html and "<b>" not in html
    assert "style=" not in html


def test_code_without_a_known_language_stays_plain() -> None:
    assert "<span" not in render_markdown("```\ndef f(): pass\n```")
    assert "<span" not in render_markdown("```no-such-language\ndef f(): pass\n```")


def test_bare_urls_become_links_but_file_names_do_not() -> None:
    html = render_markdown("see https://example.com/x?a=1 and app.py and me@example.com")
    assert '<a href="https://example.com/x?a=1"' in html
    assert html.count("<a ") == 1


def test_only_pygments_class_names_survive_on_spans() -> None:
    assert {"k", "nf", "s1", "c1"} <= HIGHLIGHT_CLASSES
    # The sanitizer itself, as render.py configures it, on hostile spans.
    from app.render import _ATTRIBUTE_VALUES, _ATTRIBUTES, _TAGS

    dirty = '<span class="k" style="color:red" onclick="x()">a</span><span class="evil">b</span>'
    clean = nh3.clean(
        dirty, tags=_TAGS, attributes=_ATTRIBUTES, tag_attribute_values=_ATTRIBUTE_VALUES
    )
    assert clean == '<span class="k">a</span><span>b</span>'


def test_a_partial_message_renders_like_a_whole_one() -> None:
    assert render_partial("I am **demo") == "<p>I am **demo</p>\n"
    assert render_partial("<script>x</script> **b**") == render_markdown("<script>x</script> **b**")

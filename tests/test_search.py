"""Find and keep (SPEC §9): search, export, archive and delete, through the store and the API."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from sqlalchemy.engine import Engine

from app import store
from app.db import get_session, make_engine
from app.export import closed_fences
from app.migrate import alembic_config, upgrade
from app.models import Conversation
from app.render import markdown_words
from app.search import _MARKDOWN_SIGNS, _search_like, fts_query, search, snippet_spans
from tests.postgres import sqlite_only
from tests.relay import LiveRelay, receive_until


def conversation_with(engine: Engine, title: str, *messages: tuple[str, str]) -> Conversation:
    """A conversation holding (kind, text) entries in order."""
    with get_session(engine) as session:
        conversation = store.create_conversation(
            session=session, title=title, provider="demo", cwd="/w", permission_mode="default"
        )
        for seq, (kind, text) in enumerate(messages, start=1):
            store.add_entry(
                session=session, conversation=conversation, seq=seq, kind=kind, text=text
            )
        return conversation


def find(engine: Engine, query: str, limit: int = 20, **options: Any) -> list[dict[str, Any]]:
    with get_session(engine) as session:
        return search(session, query, limit, **options)


def marked(hit: dict[str, Any]) -> list[str]:
    return [span["text"] for span in hit["snippet"] if span["match"]]


# -- pure functions -----------------------------------------------------------------------------


def test_fts_query_quotes_every_word_and_prefixes_the_last() -> None:
    assert fts_query('deploy AND( "x" NEAR*') == (
        '"deploy" AND "AND(" AND """x""" AND ("NEAR*" OR "NEAR*"*)'
    )
    assert fts_query("   \t\n ") is None
    assert fts_query("a\x00b") == '"a" AND ("b" OR "b"*)'


def test_snippet_spans_split_on_the_marks() -> None:
    assert snippet_spans("…the \ufdd0fox\ufdd1 ran \ufdd0far\ufdd1") == [
        {"text": "…the ", "match": False},
        {"text": "fox", "match": True},
        {"text": " ran ", "match": False},
        {"text": "far", "match": True},
    ]
    assert snippet_spans("no marks <b>") == [{"text": "no marks <b>", "match": False}]


# -- the index ---------------------------------------------------------------------------------


def test_search_ranks_the_best_match_first(engine: Engine) -> None:
    conversation_with(engine, "one", ("user", "a long message about many things, once: kestrel"))
    best = conversation_with(engine, "two", ("agent", "kestrel kestrel kestrel"))
    hits = find(engine, "kestrel")
    assert [hit["conversation_id"] for hit in hits] == [best.id, best.id - 1]
    assert hits[0]["title"] == "two"
    assert hits[0]["kind"] == "agent"
    assert marked(hits[0]) == ["kestrel", "kestrel", "kestrel"]


def test_search_needs_every_word_and_matches_the_prefix_being_typed(engine: Engine) -> None:
    both = conversation_with(engine, "t", ("user", "the migration of the database"))
    conversation_with(engine, "u", ("user", "the migration alone"))
    hits = find(engine, "migration datab")
    assert [hit["conversation_id"] for hit in hits] == [both.id]
    assert marked(hits[0]) == ["migration", "database"]


def test_the_word_itself_ranks_before_longer_words_it_begins(engine: Engine) -> None:
    # A finished word is not only a prefix: "kestrel3" first, then kestrel30 … kestrel39.
    longer = [conversation_with(engine, f"c{i}", ("user", f"kestrel3{i}")) for i in range(10)]
    itself = conversation_with(engine, "itself", ("user", "kestrel3"))
    newer = conversation_with(engine, "newer", ("user", "kestrel35 again"))
    hits = find(engine, "kestrel3")
    assert hits[0]["conversation_id"] == itself.id
    assert {hit["conversation_id"] for hit in hits} == {c.id for c in [*longer, itself, newer]}
    # With another word before it (the word itself in the older message).
    both = conversation_with(engine, "x", ("user", "flush kestrel3 and more"))
    conversation_with(engine, "y", ("user", "flush kestrel35 and more"))
    hits = find(engine, "flush kestrel3")
    assert [hit["conversation_id"] for hit in hits] == [both.id, both.id + 1]


def test_search_indexes_user_and_agent_text_only(engine: Engine) -> None:
    conversation_with(
        engine,
        "t",
        ("activity", "grep zebra"),
        ("line", "zebra notice"),
        ("user", "quagga"),
    )
    assert find(engine, "zebra") == []
    assert len(find(engine, "quagga")) == 1


def test_common_words_narrow_and_rare_ones_rank(engine: Engine) -> None:
    # "flush" is in 4 messages: past a limit of 3 it filters without ranking.
    conversation_with(engine, "a", ("user", "flush the buffer"), ("user", "flush it now"))
    once = conversation_with(engine, "b", ("user", "flush the gannet and the rest of it all"))
    twice = conversation_with(engine, "c", ("agent", "flush gannet gannet"))
    conversation_with(engine, "d", ("user", "a gannet alone"))
    hits = find(engine, "flush ganne", ranked_word_limit=3)
    assert [hit["conversation_id"] for hit in hits] == [twice.id, once.id]
    assert marked(hits[0]) == ["flush", "gannet", "gannet"]  # every word is marked
    assert hits == find(engine, "flush ganne")  # the same answer when every word ranks


def test_only_common_words_give_the_newest_first(engine: Engine) -> None:
    for name in ("a", "b", "c"):
        conversation_with(engine, name, ("user", f"flush {name}"), ("agent", "flush flush flush"))
    hits = find(engine, "flush", ranked_word_limit=3)
    assert [hit["entry_id"] for hit in hits] == [6, 5, 4, 3, 2, 1]
    assert marked(hits[0]) == ["flush", "flush", "flush"]


@pytest.mark.parametrize("query", ['"', "AND(", "NEAR(a b", "*", "-x", "a OR", "^", "col:x"])
def test_search_takes_any_query_as_plain_words(engine: Engine, query: str) -> None:
    conversation_with(engine, "t", ("user", "say AND( and NEAR(a b and col:x here"))
    find(engine, query)  # no FTS5 syntax error, whatever the user typed


def test_search_follows_edits_and_deletes(engine: Engine) -> None:
    conversation = conversation_with(engine, "t", ("agent", "first draft"))
    with get_session(engine) as session:
        entry = store.last_entries(session=session, conversation_id=conversation.id, limit=1)[0]
        store.save_entry(
            session=session,
            entry=entry,
            conversation=conversation,
            event_seq=2,
            text="final answer",
        )
    assert find(engine, "draft") == []
    assert [hit["entry_id"] for hit in find(engine, "final")] == [entry.id]
    if engine.dialect.name == "sqlite":
        with engine.begin() as connection:  # the index matches the table row for row
            connection.exec_driver_sql(
                "INSERT INTO entry_fts(entry_fts) VALUES ('integrity-check')"
            )
    with get_session(engine) as session:
        store.delete_conversation(
            session=session, conversation=session.get(Conversation, conversation.id)
        )
    assert find(engine, "final") == []


def test_snippets_are_text_never_markup(engine: Engine) -> None:
    body = "<img src=x onerror=alert(1)> payload"
    conversation_with(engine, "t", ("user", body))
    hit = find(engine, "payload")[0]
    assert "".join(span["text"] for span in hit["snippet"]) == body
    assert marked(hit) == ["payload"]


def test_a_message_cannot_fake_a_highlight(engine: Engine) -> None:
    # Found by a hostile review: the marks were \x02 and \x03, which a message may hold.
    body = "alpha \x02spoofed\x03 beta \ufdd0forged\ufdd1 gamma quokka"
    conversation_with(engine, "t", ("user", body))
    hit = find(engine, "quokka")[0]
    assert marked(hit) == ["quokka"]
    shown = "".join(span["text"] for span in hit["snippet"])
    assert shown == "alpha \x02spoofed\x03 beta \ufffdforged\ufffd gamma quokka"


# PostgreSQL's ts_headline starts its window at the match (a `**` before it is cut off) and
# reads a URL as one word: these two look at SQLite's snippets; the LIKE test below runs on both.
@sqlite_only
def test_an_agent_snippet_reads_as_rendered_and_a_user_snippet_as_typed(engine: Engine) -> None:
    agent = "the **demo** agent, [docs](https://x.org/a) and `run_all`"  # short: one window
    user = "I typed **demo** myself"
    conversation_with(engine, "t", ("agent", agent), ("user", user))
    hits = {hit["kind"]: hit for hit in find(engine, "demo")}
    shown = {kind: "".join(span["text"] for span in hit["snippet"]) for kind, hit in hits.items()}
    assert shown == {
        "agent": "the demo agent, docs and run_all",
        "user": user,  # shown as typed in the timeline: no Markdown is read in it
    }
    assert marked(hits["agent"]) == marked(hits["user"]) == ["demo"]


@sqlite_only
def test_a_match_the_markdown_hides_keeps_the_raw_snippet(engine: Engine) -> None:
    body = "the link [here](https://x.org/wombat) is all"
    conversation_with(engine, "t", ("agent", body))
    hit = find(engine, "wombat")[0]
    assert marked(hit) == ["wombat"]  # in the address: rendered, it would not be seen
    assert "".join(span["text"] for span in hit["snippet"]) == body


@sqlite_only
def test_a_snippet_cut_inside_an_emphasis_shows_no_stray_mark(engine: Engine) -> None:
    # A dogfood run saw "…use a tool, *ask…": the window ended between the two `*`.
    shown = []
    for words in range(12):
        body = "alpha " * 30 + "wombat " + "beta " * words + "*ask permission now* " + "gamma " * 30
        body += "\n\nand __bold words__ in " + "delta " * words + "wombat too"
        conversation_with(engine, f"t{words}", ("agent", body))
    for hit in find(engine, "wombat"):
        shown.append("".join(span["text"] for span in hit["snippet"]))
    assert len(shown) == 12
    assert [text for text in shown if "*" in text or "_" in text] == []
    assert any("ask" in text for text in shown)  # (the window did reach the emphasis)


@settings(max_examples=300, deadline=None)
@given(  # stored text: no NUL, no lone surrogate (store.storable)
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"], exclude_characters="\x00"))
)
@example("0\r=")  # a carriage return starts a line too: a heading's underline (found in CI)
def test_a_snippet_without_markdown_signs_is_already_its_words(text: str) -> None:
    # as_shown skips the parse when no sign of Markdown is found: then the rendering would
    # show the same words (white space aside), so the skip changes nothing the user reads.
    if _MARKDOWN_SIGNS.search(text) is None:
        assert markdown_words(text) == " ".join(text.split())


def test_like_fallback_reads_agent_markdown_too(engine: Engine) -> None:
    conversation_with(engine, "t", ("agent", "# Plan\n\n1. **ship** it"))
    with get_session(engine) as session:
        hit = _search_like(session, "ship", 10)[0]
    assert "".join(span["text"] for span in hit["snippet"]) == "Plan ship it"
    assert marked(hit) == ["ship"]


def test_like_fallback_finds_every_word_with_a_snippet(engine: Engine) -> None:
    conversation_with(engine, "t", ("user", "100% of the_files moved"), ("user", "nothing here"))
    with get_session(engine) as session:
        hits = _search_like(session, "100% the_f", 10)
        assert [hit["seq"] for hit in hits] == [1]
        assert marked(hits[0]) == ["100%"]
        assert _search_like(session, "1_0", 10) == []  # _ and % are not wildcards


def test_upgrade_indexes_messages_stored_before_it(url: str) -> None:
    command.upgrade(alembic_config(url), "0003")
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(
                "INSERT INTO conversation (title, provider, status, cwd, permission_mode,"
                " turn_active, last_seq, created_at, updated_at)"
                " VALUES ('Old', 'demo', 'archived', '/w', 'default', FALSE, 2,"
                " '2026-01-01', '2026-01-01')"
            )
            connection.exec_driver_sql(
                "INSERT INTO entry (conversation_id, seq, kind, text, state, data, created_at)"
                " VALUES (1, 1, 'user', 'ancient pelican', 'sent', '{}', '2026-01-01'),"
                " (1, 2, 'activity', 'pelican tool', 'done', '{}', '2026-01-01')"
            )
        upgrade(url)
        assert [(hit["seq"], hit["title"]) for hit in find(engine, "pelican")] == [(1, "Old")]
    finally:
        engine.dispose()


# -- the API -----------------------------------------------------------------------------------


def wait_idle_reply(relay: LiveRelay, cid: int, text: str) -> dict[str, Any]:
    assert relay.send(cid, text).status_code == 202
    return relay.wait_for(
        cid, lambda v: v["turn"]["state"] == "idle" and v["timeline"][-1]["kind"] == "agent"
    )


def api_search(relay: LiveRelay, q: str, **params: Any) -> list[dict[str, Any]]:
    response = relay.http.get("/api/search", params={"q": q, **params})
    assert response.status_code == 200, response.text
    return list(response.json()["hits"])


def test_api_search_covers_archived_conversations(relay: LiveRelay) -> None:
    cid = relay.create(title="Birds")["id"]
    wait_idle_reply(relay, cid, "where do ospreys nest")
    response = relay.http.post(f"/api/conversations/{cid}/archive")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "archived"
    hits = api_search(relay, "ospreys")
    assert {(hit["conversation_id"], hit["status"], hit["title"]) for hit in hits} == {
        (cid, "archived", "Birds")
    }
    assert sorted(hit["kind"] for hit in hits) == ["agent", "user"]
    user = next(hit for hit in hits if hit["kind"] == "user")
    timeline = relay.get(cid)["timeline"]
    assert (user["entry_id"], user["seq"]) == next(
        (e["id"], e["seq"]) for e in timeline if e["kind"] == "user"
    )


@pytest.mark.parametrize("query", ['"', "AND(", "((", "NEAR(", '"unterminated'])
def test_api_search_never_fails_on_syntax(relay: LiveRelay, query: str) -> None:
    api_search(relay, query)


def test_api_search_refuses_bad_parameters(relay: LiveRelay) -> None:
    assert relay.http.get("/api/search").status_code == 422
    assert relay.http.get("/api/search", params={"q": ""}).status_code == 422
    assert relay.http.get("/api/search", params={"q": "x", "limit": 0}).status_code == 422
    assert relay.http.get("/api/search", params={"q": "x" * 501}).status_code == 422


def test_archive_refused_twice(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    assert relay.http.post(f"/api/conversations/{cid}/archive").status_code == 200
    response = relay.http.post(f"/api/conversations/{cid}/archive")
    assert response.status_code == 409
    assert response.json() == {"detail": "This conversation is already archived."}
    assert relay.http.post("/api/conversations/999/archive").status_code == 404


def hold_a_turn(relay: LiveRelay, cid: int) -> dict[str, Any]:
    """A turn that waits on a permission question until it is answered."""
    assert relay.send(cid, "ask permission please").status_code == 202
    view = relay.wait_for(cid, lambda v: any(e["state"] == "pending" for e in v["timeline"]))
    return next(e for e in view["timeline"] if e["state"] == "pending")


@pytest.mark.parametrize("action", ["delete", "archive"])
def test_delete_and_archive_refused_while_a_turn_runs(relay: LiveRelay, action: str) -> None:
    cid = relay.create()["id"]
    question = hold_a_turn(relay, cid)
    if action == "delete":
        response = relay.http.delete(f"/api/conversations/{cid}")
    else:
        response = relay.http.post(f"/api/conversations/{cid}/archive")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"A turn is running in this conversation; stop it before you {action} it."
    }
    view = relay.get(cid)
    assert view["status"] == "active" and view["running"] is True
    answer = relay.http.post(
        f"/api/conversations/{cid}/permissions/{question['id']}", json={"allow": False}
    )
    assert answer.status_code == 200
    view = relay.wait_idle(cid)
    assert view["running"] is False


def backup_folder(relay: LiveRelay, cid: int) -> Path:
    return relay.settings.resolved_data_dir / "backups" / str(cid)


def test_delete_removes_entries_index_backups_and_links(relay: LiveRelay) -> None:
    cid = relay.create(title="Old")["id"]
    wait_idle_reply(relay, cid, "remember the heron")
    compacted = relay.send(cid, "/compact")
    assert compacted.status_code == 201, compacted.text
    new_id = compacted.json()["compacted_into"]["id"]
    deadline = time.monotonic() + 30
    while not any(backup_folder(relay, cid).glob("1-backup-*.md")):  # written off the turn path
        assert time.monotonic() < deadline, "no backup written"
        time.sleep(0.05)
    assert api_search(relay, "heron")

    with relay.socket() as socket:
        receive_until(socket, lambda e: e.get("type") == "hello")
        response = relay.http.delete(f"/api/conversations/{cid}")
        assert response.status_code == 204, response.text
        events = receive_until(socket, lambda e: e.get("type") == "conversation_removed")
    assert events[-1] == {"type": "conversation_removed", "conversation_id": cid}
    assert relay.http.get(f"/api/conversations/{cid}").status_code == 404
    assert api_search(relay, "heron") == []
    assert not backup_folder(relay, cid).exists()
    successor = relay.get(new_id)
    assert successor["compacted_from_id"] is None
    assert successor["pending_summary"]  # the carry-over stays
    assert relay.http.delete(f"/api/conversations/{cid}").status_code == 404


def test_export_markdown_exactly(relay: LiveRelay) -> None:
    created = relay.create(title="Export me")
    cid = created["id"]
    wait_idle_reply(relay, cid, "hello there")
    response = relay.http.get(f"/api/conversations/{cid}/export", params={"format": "md"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="oarlock-conversation-{cid}.md"'
    )
    timeline = relay.get(cid)["timeline"]
    reply = next(e["text"] for e in timeline if e["kind"] == "agent")
    view = relay.get(cid)
    assert response.text == (
        f"# Export me\n\nConversation #{cid} · demo · active · created "
        f"{view['created_at'].replace('Z', '+00:00')}\n\n"
        f"## You\n\nhello there\n\n## Agent\n\n{reply}\n"
    )


def test_closed_fences_closes_only_a_fence_left_open() -> None:
    assert closed_fences("```python\nprint(1)") == "```python\nprint(1)\n```"
    assert closed_fences("~~~~\ncode\n~~~") == "~~~~\ncode\n~~~\n~~~~"  # too short to close
    for whole in ("```\na\n```", "text ``` inline", "```\na\n`````", "~~~\n```\n~~~", "plain"):
        assert closed_fences(whole) == whole
    assert closed_fences("``` not `a` fence\nx") == "``` not `a` fence\nx"  # backtick in info
    assert closed_fences("    ```\nindented code") == "    ```\nindented code"


def test_an_unclosed_fence_keeps_to_its_message_in_the_markdown_export(
    relay: LiveRelay,
) -> None:
    # Found by a hostile review: a message ending inside a code fence turned the rest of the
    # export, every later "## You" / "## Agent", into code.
    cid = relay.create(title="Half a snippet")["id"]
    wait_idle_reply(relay, cid, "look:\n```python\ndef f():")
    wait_idle_reply(relay, cid, "and then")
    text = relay.http.get(f"/api/conversations/{cid}/export", params={"format": "md"}).text
    tokens = MarkdownIt("commonmark").parse(text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["Half a snippet", "You", "Agent", "You", "Agent"]


def test_export_json_lines_with_ancestors(relay: LiveRelay) -> None:
    cid = relay.create(title="First")["id"]
    wait_idle_reply(relay, cid, "one")
    new_id = relay.send(cid, "/compact").json()["compacted_into"]["id"]
    wait_idle_reply(relay, new_id, "two")
    alone = relay.http.get(f"/api/conversations/{new_id}/export", params={"format": "jsonl"})
    both = relay.http.get(
        f"/api/conversations/{new_id}/export", params={"format": "jsonl", "ancestors": "true"}
    )
    assert alone.headers["content-type"] == "application/x-ndjson"
    assert alone.headers["content-disposition"] == (
        f'attachment; filename="oarlock-conversation-{new_id}.jsonl"'
    )
    assert both.headers["content-disposition"] == (
        f'attachment; filename="oarlock-conversation-{new_id}-with-earlier.jsonl"'
    )
    lines = [json.loads(line) for line in both.text.splitlines()]
    heads = [line["conversation"]["id"] for line in lines if line["type"] == "conversation"]
    assert heads == [cid, new_id]
    assert both.text.endswith(alone.text)
    old_entries = relay.get(cid)["timeline"]
    exported = [
        line for line in lines if line["type"] == "entry" and line["conversation_id"] == cid
    ]
    # (created_at as the API gives it, ending in Z: the export's said "+00:00")
    assert [(e["id"], e["seq"], e["kind"], e["text"], e["created_at"]) for e in exported] == [
        (e["id"], e["seq"], e["kind"], e["text"], e["created_at"]) for e in old_entries
    ]


def test_export_refuses_an_unknown_format(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    response = relay.http.get(f"/api/conversations/{cid}/export", params={"format": "html"})
    assert response.status_code == 422
    assert relay.http.get("/api/conversations/999/export").status_code == 404


def test_api_search_fuzzed_queries_answer_json(relay: LiveRelay) -> None:
    cid = relay.create(title="Fuzz")["id"]
    wait_idle_reply(relay, cid, 'quote " paren ( star * NEAR AND OR NOT col:x ^ - +')
    problems: list[str] = []

    @given(query=st.text(min_size=1, max_size=40))
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(query: str) -> None:
        response = relay.http.get("/api/search", params={"q": query})
        if response.status_code != 200 and response.status_code != 422:
            problems.append(f"{query!r}: {response.status_code} {response.text}")
        elif "hits" not in response.json() and response.status_code == 200:
            problems.append(f"{query!r}: {response.text}")

    fuzz()
    assert problems == []

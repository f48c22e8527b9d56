"""The archive, for the agent (SPEC §8): search_archive and read_archive over a conversation's
ancestors only, on SQLite and (OARLOCK_TEST_DB=postgres) PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app import archive, store
from app.db import get_session
from app.models import Conversation
from app.search import PG_KINDS, PG_VECTOR, pg_snippet, pg_terms, search
from tests import postgres


def create(engine: Engine, title: str, *texts: str) -> int:
    """A conversation of alternating user and agent messages; its id."""
    with get_session(engine) as session:
        conversation = store.create_conversation(
            session=session, title=title, provider="demo", cwd="/w", permission_mode="default"
        )
        add(engine, conversation.id or 0, *texts)
        return conversation.id or 0


def add(engine: Engine, cid: int, *texts: str) -> None:
    with get_session(engine) as session:
        conversation = session.get(Conversation, cid)
        assert conversation is not None
        for text in texts:
            seq = conversation.last_seq + 1
            kind = "user" if seq % 2 else "agent"
            store.add_entry(
                session=session, conversation=conversation, seq=seq, kind=kind, text=text
            )


def compact(engine: Engine, cid: int, *texts: str) -> int:
    """Compact a conversation; its successor (holding texts); the successor's id."""
    with get_session(engine) as session:
        old = session.get(Conversation, cid)
        assert old is not None
        new = store.compact_conversation(
            session=session, old=old, summary="carry", title=f"{old.title} (compacted)"
        )
        new_id = new.id or 0
    add(engine, new_id, *texts)
    return new_id


def search_archive(engine: Engine, cid: int, query: str) -> str:
    with get_session(engine) as session:
        return archive.search_archive(session, cid, {"query": query})


def read_archive(engine: Engine, cid: int, **arguments: Any) -> str:
    with get_session(engine) as session:
        return archive.read_archive(session, cid, arguments)


@pytest.fixture
def family(engine: Engine) -> dict[str, int]:
    """Grandparent → parent → child by two compactions, and an unrelated archived conversation."""
    grand = create(engine, "Grand", "the osprey nests by the river", "noted: osprey")
    parent = compact(engine, grand, "an osprey osprey osprey again", "fine")
    child = compact(engine, parent, "child mentions osprey too")
    other = create(engine, "Other", "a stranger's osprey secret")
    with get_session(engine) as session:
        stranger = session.get(Conversation, other)
        assert stranger is not None
        store.compact_conversation(session=session, old=stranger, summary=None, title="x")
    return {"grand": grand, "parent": parent, "child": child, "other": other}


def test_ancestors_two_compactions_deep_nearest_first(
    engine: Engine, family: dict[str, int]
) -> None:
    with get_session(engine) as session:
        assert archive.ancestor_ids(session, family["child"]) == [family["parent"], family["grand"]]
        assert archive.ancestor_ids(session, family["grand"]) == []
        assert archive.ancestor_ids(session, 999_999) == []


def test_ancestors_end_at_a_loop_and_at_the_limit(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [create(engine, f"c{i}") for i in range(4)]
    with engine.begin() as connection:  # 3 → 2 → 1 → 0 → 2 (a loop no relay makes)
        for child, parent in ((3, 2), (2, 1), (1, 0), (0, 2)):
            connection.exec_driver_sql(
                f"UPDATE conversation SET compacted_from_id = {ids[parent]} WHERE id = {ids[child]}"
            )
    with get_session(engine) as session:
        assert archive.ancestor_ids(session, ids[3]) == [ids[2], ids[1], ids[0]]
        monkeypatch.setattr(archive, "MAX_ANCESTORS", 2)
        assert archive.ancestor_ids(session, ids[3]) == [ids[2], ids[1]]


def test_search_archive_lists_only_ancestors_best_first(
    engine: Engine, family: dict[str, int]
) -> None:
    answer = search_archive(engine, family["child"], "osprey")
    parent, grand = family["parent"], family["grand"]
    assert answer.splitlines() == [
        "3 matching messages in the archived conversations this one was compacted from, best "
        "first (at most 20; read_archive gives the full texts):",
        f"conversation {parent}, seq 1, user: an osprey osprey osprey again",
        f"conversation {grand}, seq 2, agent: noted: osprey",
        f"conversation {grand}, seq 1, user: the osprey nests by the river",
    ]
    assert "stranger" not in answer and "child mentions" not in answer
    # From the parent, only the grandparent; the stranger's own successor sees only it.
    assert f"conversation {parent}," not in search_archive(engine, parent, "osprey")
    with get_session(engine) as session:
        stranger_child = session.get(Conversation, family["other"])
        assert stranger_child is not None and stranger_child.compacted_into_id is not None
        into = stranger_child.compacted_into_id
    assert search_archive(engine, into, "osprey").splitlines()[1:] == [
        f"conversation {family['other']}, seq 1, user: a stranger's osprey secret"
    ]


def test_search_archive_without_ancestors_or_match(engine: Engine, family: dict[str, int]) -> None:
    assert search_archive(engine, family["grand"], "osprey") == archive.NO_ANCESTORS
    assert search_archive(engine, family["child"], "pelican") == (
        "No message of the archived conversations this one was compacted from "
        f"({family['parent']}, {family['grand']}) matches 'pelican'."
    )
    for bad in ({}, {"query": "  "}, {"query": 3}, {"query": "x" * 501}):
        with get_session(engine) as session, pytest.raises(ValueError):
            archive.search_archive(session, family["child"], bad)


def test_search_archive_caps_results_and_line_length(engine: Engine) -> None:
    old = create(engine, "Many", *[f"heron {i}" for i in range(30)])
    new = compact(engine, old)
    lines = search_archive(engine, new, "heron").splitlines()
    assert lines[0].startswith("20 matching messages") and len(lines) == 21
    wide = create(engine, "Wide", "heron\n\n" + "x" * 1_000)  # one long word
    after = compact(engine, wide)
    (line,) = search_archive(engine, after, "heron").splitlines()[1:]
    excerpt = line.split(": ", 1)[1]
    assert len(excerpt) == archive.LINE_CHARS and excerpt.endswith("…")
    assert excerpt.startswith("heron xxx")  # one line


def test_read_archive_gives_full_texts_from_a_seq(engine: Engine, family: dict[str, int]) -> None:
    grand = family["grand"]
    assert read_archive(engine, family["child"], conversation_id=grand) == (
        f'Conversation {grand} "Grand" (archived), messages from seq 1:\n'
        "\n[seq 1] User:\nthe osprey nests by the river\n"
        "\n[seq 2] Agent:\nnoted: osprey\n"
        f"\nEnd of conversation {grand}."
    )
    assert read_archive(engine, family["child"], conversation_id=grand, from_seq=2) == (
        f'Conversation {grand} "Grand" (archived), messages from seq 2:\n'
        "\n[seq 2] Agent:\nnoted: osprey\n"
        f"\nEnd of conversation {grand}."
    )
    assert read_archive(engine, family["child"], conversation_id=grand, from_seq=9).endswith(
        "\nNo message from seq 9."
    )


@pytest.mark.parametrize("who", ["other", "child", "missing"])
def test_read_archive_refuses_a_conversation_that_is_not_an_ancestor(
    engine: Engine, family: dict[str, int], who: str
) -> None:
    wanted = 999_999 if who == "missing" else family[who]
    with pytest.raises(ValueError) as refused:
        read_archive(engine, family["child"], conversation_id=wanted)
    assert str(refused.value) == (
        f"Conversation {wanted} is not one this conversation was compacted from; read_archive "
        f"reads only these: {family['parent']}, {family['grand']}."
    )
    assert "stranger" not in str(refused.value)
    with pytest.raises(ValueError, match="not compacted from another one"):
        read_archive(engine, family["grand"], conversation_id=family["other"])


GRAND = -1  # stands for the grandparent's id in parameters


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"conversation_id": "1"},
        {"conversation_id": True},
        {"conversation_id": GRAND, "limit": 51},
        {"conversation_id": GRAND, "limit": 0},
        {"conversation_id": GRAND, "from_seq": 0},
        {"conversation_id": GRAND, "from_seq": 2**63},
        {"conversation_id": GRAND, "from_seq": 1.5},
    ],
)
def test_read_archive_refuses_bad_arguments(
    engine: Engine, family: dict[str, int], arguments: dict[str, Any]
) -> None:
    if arguments.get("conversation_id") == GRAND:  # an ancestor: only the other argument is bad
        arguments = {**arguments, "conversation_id": family["grand"]}
    with pytest.raises(ValueError):
        read_archive(engine, family["child"], **arguments)


def test_read_archive_caps_messages_and_characters(engine: Engine) -> None:
    old = create(engine, "Long", *[f"message {i}" for i in range(1, 61)])
    new = compact(engine, old)
    answer = read_archive(engine, new, conversation_id=old)
    assert answer.count("\n[seq ") == 50
    assert answer.endswith("\nMore follows: call read_archive with from_seq 51.")
    rest = read_archive(engine, new, conversation_id=old, from_seq=51, limit=5)
    seqs = [line for line in rest.splitlines() if line.startswith("[seq")]
    assert seqs == [f"[seq {n}] {'User' if n % 2 else 'Agent'}:" for n in range(51, 56)]
    assert rest.endswith("\nMore follows: call read_archive with from_seq 56.")

    big = create(engine, "Big", "a" * 30_000, "b" * 30_000, "c" * 50_000)
    after = compact(engine, big)
    first = read_archive(engine, after, conversation_id=big)
    assert "a" * 30_000 in first and "b" not in first.split("archived)", 1)[1]
    assert first.endswith("\nMore follows: call read_archive with from_seq 2.")
    huge = read_archive(engine, after, conversation_id=big, from_seq=3)
    assert "c" * archive.READ_CHARS + "\n[cut: 10,000 more characters not shown]" in huge
    assert huge.endswith(f"\nEnd of conversation {big}.")


def test_search_limited_to_conversations(engine: Engine) -> None:
    one = create(engine, "one", "lark lark")
    two = create(engine, "two", "lark")
    with get_session(engine) as session:
        assert [h["conversation_id"] for h in search(session, "lark", 10)] == [one, two]
        hits = search(session, "lark", 10, conversation_ids=[two])
        assert [h["conversation_id"] for h in hits] == [two]
        assert search(session, "lark", 10, conversation_ids=[]) == []
        for limit in (1, 3):  # the rare/common paths too
            hits = search(session, "lark", 10, ranked_word_limit=limit, conversation_ids=[one])
            assert [h["conversation_id"] for h in hits] == [one]


# -- PostgreSQL's full text ---------------------------------------------------------------------


def test_pg_terms_quote_every_word_and_prefix_the_last() -> None:
    assert pg_terms("it's a\\b ok") == ["'it''s'", "'a\\\\b'", "'ok':*"]
    assert pg_terms(" \t ") == []


def test_pg_snippet_marks_what_it_leaves_out() -> None:
    body = "one two \ufdd0three\ufdd1 four"
    assert pg_snippet("zero one two three four five", body) == [
        {"text": "…one two ", "match": False},
        {"text": "three", "match": True},
        {"text": " four…", "match": False},
    ]


@postgres.postgres_only
def test_postgres_search_uses_the_gin_index(engine: Engine) -> None:
    create(engine, "t", "an egret", "egrets fly")
    with engine.connect() as connection:
        connection.exec_driver_sql("SET enable_seqscan = off")
        plan = connection.exec_driver_sql(
            f"EXPLAIN SELECT e.id FROM entry e WHERE {PG_KINDS}"
            f" AND {PG_VECTOR} @@ to_tsquery('simple', 'egret:*')"
        ).scalars()
        assert "entry_fts_pg" in "\n".join(plan)
    with get_session(engine) as session:
        hits = search(session, "egre", 10)
        assert [h["seq"] for h in hits] == [2, 1]  # equal ranks: the newest first
        assert search(session, "! ( <->", 10) == []  # words without letters: nothing, no error


@pytest.mark.parametrize("query", ["!", "(", "<->", "'", "\\", ":*", "a'b", "x:*", "&|", "it's"])
def test_search_takes_tsquery_syntax_as_plain_words(engine: Engine, query: str) -> None:
    create(engine, "t", "it's a'b x:* here")
    with get_session(engine) as session:
        search(session, query, 10)  # no tsquery (or FTS5) syntax error, whatever was typed
        assert [h["seq"] for h in search(session, "it's", 10)] == [1]

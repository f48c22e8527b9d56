"""Full-text search over every conversation's messages (SQLite FTS5; LIKE elsewhere)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlmodel import Session

# The FTS5 index (migration 0005): user and agent entries' text, kept in sync by triggers.
FTS_TABLE = "entry_fts"
SEARCH_KINDS = ("user", "agent")
# Marks snippet() puts around a match: control characters, which the UI never shows as text.
MARK_START = "\x02"
MARK_END = "\x03"
SNIPPET_TOKENS = 16
LIKE_SNIPPET_CHARS = 60


def is_search_table(name: str | None) -> bool:
    """True for the FTS table and its shadow tables (autogenerate must not drop them)."""
    return bool(name) and str(name).startswith(FTS_TABLE)


def include_object(
    _object: Any, name: str | None, type_: str, reflected: bool, _compare: Any
) -> bool:
    """Alembic's filter: leave the search tables (not in the models) out of autogenerate."""
    return not (type_ == "table" and reflected and is_search_table(name))


def words(query: str) -> list[str]:
    """The words of a user's query (whitespace separated, control characters dropped)."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in query)
    return cleaned.split()


def phrases(query: str) -> list[str]:
    """The query's words as FTS5 phrases: quoted (operators become text), the last a prefix.

    Quoting makes FTS5 syntax (AND, OR, NEAR, parentheses, quotes, *, column:) plain text.
    """
    terms = ['"' + word.replace('"', '""') + '"' for word in words(query)]
    if terms:
        terms[-1] += "*"  # results as you type: the word being typed matches its prefix
    return terms


def fts_query(query: str) -> str | None:
    """A safe FTS5 MATCH expression: every word must be found."""
    return " ".join(phrases(query)) or None


def snippet_spans(snippet: str) -> list[dict[str, Any]]:
    """A marked snippet as spans [{text, match}] for the UI to build with textContent."""
    spans: list[dict[str, Any]] = []
    rest = snippet
    while rest:
        start = rest.find(MARK_START)
        if start < 0:
            spans.append({"text": rest, "match": False})
            break
        if start:
            spans.append({"text": rest[:start], "match": False})
        end = rest.find(MARK_END, start + 1)
        end = len(rest) if end < 0 else end
        if end > start + 1:
            spans.append({"text": rest[start + 1 : end], "match": True})
        rest = rest[end + 1 :]
    return [
        {"text": span["text"].replace(MARK_START, "").replace(MARK_END, ""), "match": span["match"]}
        for span in spans
        if span["text"]
    ]


def like_snippet(body: str, query_words: list[str]) -> list[dict[str, Any]]:
    """A snippet around the first word found (the fallback without FTS5)."""
    lower = body.lower()
    found = [(lower.find(w.lower()), w) for w in query_words if lower.find(w.lower()) >= 0]
    if not found:
        return [{"text": body[: LIKE_SNIPPET_CHARS * 2], "match": False}]
    at, word = min(found)
    start = max(0, at - LIKE_SNIPPET_CHARS)
    end = min(len(body), at + len(word) + LIKE_SNIPPET_CHARS)
    before = ("…" if start else "") + body[start:at]
    after = body[at + len(word) : end] + ("…" if end < len(body) else "")
    spans = [
        {"text": before, "match": False},
        {"text": body[at : at + len(word)], "match": True},
        {"text": after, "match": False},
    ]
    return [span for span in spans if span["text"]]


def _hit(row: Any, spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "conversation_id": row.conversation_id,
        "title": row.title,
        "status": row.status,
        "entry_id": row.entry_id,
        "seq": row.seq,
        "kind": row.kind,
        "snippet": spans,
    }


# A word found in more messages than this narrows the results but does not rank them:
# FTS5's bm25 reads a ranked word's whole list of messages (to weigh it), so a common
# word would cost in proportion to the database. Its weight in bm25 is low anyway.
RANKED_WORD_LIMIT = 200

_COLUMNS = (
    "SELECT e.id AS entry_id, e.seq, e.kind, e.conversation_id, c.title, c.status,"
    " snippet({table}, 0, :start, :end, '…', :tokens) AS snippet"
)
_JOIN = " JOIN entry e ON e.id = {alias}.rowid JOIN conversation c ON c.id = e.conversation_id"


def _found_in(session: Session, phrase: str, cap: int) -> int:
    """In how many messages a phrase is found, counting up to cap + 1 at most."""
    sql = (
        f"SELECT count(*) FROM (SELECT rowid FROM {FTS_TABLE} WHERE {FTS_TABLE} MATCH :p LIMIT :n)"
    )
    return int(session.connection().execute(text(sql), {"p": phrase, "n": cap + 1}).scalar_one())


def search(
    session: Session, query: str, limit: int, *, ranked_word_limit: int = RANKED_WORD_LIMIT
) -> list[dict[str, Any]]:
    """Messages matching every word of the query, best first (bm25), with snippets."""
    if session.get_bind().dialect.name != "sqlite":
        return _search_like(session, query, limit)
    every = phrases(query)
    if not every:
        return []
    cap = ranked_word_limit
    rare = [p for p in every if _found_in(session, p, cap) <= cap]
    params: dict[str, Any] = {
        "start": MARK_START,
        "end": MARK_END,
        "tokens": SNIPPET_TOKENS,
        "match": " ".join(every),
        "ranked": " ".join(rare),
        "limit": limit,
    }
    if len(rare) == len(every):  # every word ranks
        sql = (
            _COLUMNS.format(table=FTS_TABLE)
            + f" FROM {FTS_TABLE}"
            + _JOIN.format(alias=FTS_TABLE)
            + f" WHERE {FTS_TABLE} MATCH :match ORDER BY rank, e.id DESC LIMIT :limit"
        )
    elif rare:  # the rare words rank; all of them must match (and the snippet shows all)
        sql = (
            _COLUMNS.format(table="f.entry_fts")
            + f" FROM {FTS_TABLE} AS r JOIN {FTS_TABLE} AS f ON f.rowid = r.rowid"
            + _JOIN.format(alias="r")
            + f" WHERE r.{FTS_TABLE} MATCH :ranked AND f.{FTS_TABLE} MATCH :match"
            " ORDER BY r.rank, e.id DESC LIMIT :limit"
        )
    else:  # only common words: the newest messages first
        sql = (
            _COLUMNS.format(table=FTS_TABLE)
            + f" FROM {FTS_TABLE}"
            + _JOIN.format(alias=FTS_TABLE)
            + f" WHERE {FTS_TABLE} MATCH :match ORDER BY {FTS_TABLE}.rowid DESC LIMIT :limit"
        )
    rows = session.connection().execute(text(sql), params)
    return [_hit(row, snippet_spans(row.snippet or "")) for row in rows]


def _search_like(session: Session, query: str, limit: int) -> list[dict[str, Any]]:
    """Without FTS5 (PostgreSQL for now): every word as a substring, newest first."""
    query_words = words(query)
    if not query_words:
        return []
    conditions = " AND ".join(
        f"lower(e.text) LIKE :w{i} ESCAPE '\\'" for i in range(len(query_words))
    )
    params: dict[str, Any] = {
        f"w{i}": "%" + _like_escape(word.lower()) + "%" for i, word in enumerate(query_words)
    }
    params["limit"] = limit
    rows = session.connection().execute(
        text(
            "SELECT e.id AS entry_id, e.seq, e.kind, e.conversation_id, c.title, c.status, e.text"
            " FROM entry e JOIN conversation c ON c.id = e.conversation_id"
            f" WHERE e.kind IN ('user', 'agent') AND {conditions}"
            " ORDER BY e.id DESC LIMIT :limit"
        ),
        params,
    )
    return [_hit(row, like_snippet(row.text, query_words)) for row in rows]


def _like_escape(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

"""Full-text search over every conversation's messages.

SQLite: the FTS5 table of migration 0005 (bm25, snippet()). PostgreSQL: tsvector/tsquery over
a GIN expression index (migration 0007; ts_rank, ts_headline). Any other database: LIKE.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy import TextClause, bindparam, text
from sqlmodel import Session

from app.render import markdown_words

# The FTS5 index (migration 0005): user and agent entries' text, kept in sync by triggers.
FTS_TABLE = "entry_fts"
SEARCH_KINDS = ("user", "agent")
# Marks snippet() puts around a match: noncharacters, which stored text never holds (storable
# replaces them). Before, \x02 and \x03, which a message could hold: it faked a highlight.
MARK_START = "\ufdd0"
MARK_END = "\ufdd1"
SNIPPET_TOKENS = 16
LIKE_SNIPPET_CHARS = 60


def is_search_table(name: str | None) -> bool:
    """True for the FTS table, its shadow tables and PostgreSQL's search index (not models)."""
    return bool(name) and str(name).startswith(FTS_TABLE)


def include_object(
    _object: Any, name: str | None, type_: str, reflected: bool, _compare: Any
) -> bool:
    """Alembic's filter: leave the search tables and index (not models) out of autogenerate."""
    return not (type_ in ("table", "index") and reflected and is_search_table(name))


def words(query: str) -> list[str]:
    """The words of a user's query (whitespace separated, control characters dropped)."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in query)
    return cleaned.split()


def phrases(query: str) -> list[str]:
    """The query's words as FTS5 phrases: quoted (operators become text), the last a prefix.

    Quoting makes FTS5 syntax (AND, OR, NEAR, parentheses, quotes, *, column:) plain text.
    The last word, being typed, matches its prefix; as `("word" OR "word"*)` it matches the
    same messages, and bm25 weighs the word itself above longer words that start with it.
    """
    terms = ['"' + word.replace('"', '""') + '"' for word in words(query)]
    if terms:
        terms[-1] = f"({terms[-1]} OR {terms[-1]}*)"
    return terms


def fts_query(query: str) -> str | None:
    """A safe FTS5 MATCH expression: every word must be found."""
    return every_one(phrases(query)) or None


def every_one(terms: list[str]) -> str:
    """FTS5 phrases all required (an explicit AND: FTS5 implies none before a parenthesis)."""
    return " AND ".join(terms)


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


# What may make Markdown of a snippet's text: emphasis, code, links, images, headings, quotes,
# tables, strikes, entities, escapes, autolinks, a line's start (after \n or \r: blocks, lists,
# a heading's underline), four spaces (code), or a list item's mark at the snippet's start.
_MARKDOWN_SIGNS = re.compile(r"[*_`\[\]!#>|~&\\<\n\r]| {4}|^\s*(?:[-+=]|\d+[.)])")


def as_shown(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An agent message's snippet as its rendering reads (`**demo**` is shown as demo): the
    spans as they are when the Markdown hides a match (in a link's address, say)."""
    marked = "".join(
        f"{MARK_START}{span['text']}{MARK_END}" if span["match"] else span["text"] for span in spans
    )
    if _MARKDOWN_SIGNS.search(marked) is None:  # plain words already: no parse
        return spans
    # Cut out of the message at an ellipsis ("…", FTS5's and the fallback's): a mark whose
    # pair lay beyond the cut (`*ask…`) is hidden, as the message's rendering hides it.
    words = markdown_words(marked, cut_start=marked.startswith("…"), cut_end=marked.endswith("…"))
    shown = snippet_spans(words)
    found = [span["text"] for span in spans if span["match"]]
    return shown if [span["text"] for span in shown if span["match"]] == found else spans


def _hit(row: Any, spans: list[dict[str, Any]]) -> dict[str, Any]:
    if row.kind == "agent":  # the timeline renders agent messages' Markdown, not users' text
        spans = as_shown(spans)
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


def _scoped(sql: str, params: dict[str, Any], conversation_ids: Sequence[int] | None) -> TextClause:
    """The statement, limited to some conversations' messages when asked (:ids in sql)."""
    statement = text(sql)
    if conversation_ids is None:
        return statement
    params["ids"] = list(conversation_ids)
    return statement.bindparams(bindparam("ids", expanding=True))


def _scope(conversation_ids: Sequence[int] | None) -> str:
    return "" if conversation_ids is None else " AND e.conversation_id IN :ids"


def search(
    session: Session,
    query: str,
    limit: int,
    *,
    ranked_word_limit: int = RANKED_WORD_LIMIT,
    conversation_ids: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Messages matching every word of the query, best first, with snippets.

    conversation_ids limits the search to those conversations' messages (None: every one).
    """
    if conversation_ids is not None and not conversation_ids:
        return []
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return _search_postgres(session, query, limit, ranked_word_limit, conversation_ids)
    if dialect != "sqlite":
        return _search_like(session, query, limit, conversation_ids)
    every = phrases(query)
    if not every:
        return []
    cap = ranked_word_limit
    rare = [p for p in every if _found_in(session, p, cap) <= cap]
    params: dict[str, Any] = {
        "start": MARK_START,
        "end": MARK_END,
        "tokens": SNIPPET_TOKENS,
        "match": every_one(every),
        "ranked": every_one(rare),
        "limit": limit,
    }
    scope = _scope(conversation_ids)
    if len(rare) == len(every):  # every word ranks
        sql = (
            _COLUMNS.format(table=FTS_TABLE)
            + f" FROM {FTS_TABLE}"
            + _JOIN.format(alias=FTS_TABLE)
            + f" WHERE {FTS_TABLE} MATCH :match{scope} ORDER BY rank, e.id DESC LIMIT :limit"
        )
    elif rare:  # the rare words rank; all of them must match (and the snippet shows all)
        sql = (
            _COLUMNS.format(table="f.entry_fts")
            + f" FROM {FTS_TABLE} AS r JOIN {FTS_TABLE} AS f ON f.rowid = r.rowid"
            + _JOIN.format(alias="r")
            + f" WHERE r.{FTS_TABLE} MATCH :ranked AND f.{FTS_TABLE} MATCH :match{scope}"
            " ORDER BY r.rank, e.id DESC LIMIT :limit"
        )
    else:  # only common words: the newest messages first
        sql = (
            _COLUMNS.format(table=FTS_TABLE)
            + f" FROM {FTS_TABLE}"
            + _JOIN.format(alias=FTS_TABLE)
            + f" WHERE {FTS_TABLE} MATCH :match{scope}"
            f" ORDER BY {FTS_TABLE}.rowid DESC LIMIT :limit"
        )
    rows = session.connection().execute(_scoped(sql, params, conversation_ids), params)
    return [_hit(row, snippet_spans(row.snippet or "")) for row in rows]


# PostgreSQL: the 'simple' configuration (lower case, no stemming, no stop words) as SQLite's
# unicode61 tokenizer, for text in any language. PG_VECTOR and PG_KINDS are the expression and
# the predicate of the GIN index of migration 0007: the planner uses it only for these.
PG_VECTOR = "to_tsvector('simple'::regconfig, e.text)"
PG_KINDS = "e.kind IN ('user', 'agent')"
PG_HEADLINE = f'StartSel="{MARK_START}", StopSel="{MARK_END}", MaxWords=20, MinWords=8, ShortWord=0'


def pg_terms(query: str) -> list[str]:
    """The query's words as to_tsquery input: quoted (operators become text), the last a prefix."""
    terms = ["'" + w.replace("\\", "\\\\").replace("'", "''") + "'" for w in words(query)]
    if terms:
        terms[-1] += ":*"  # results as you type, as on SQLite
    return terms


def _pg_query(names: list[str]) -> str:
    """A tsquery expression: every named term must match."""
    return "(" + " && ".join(f"to_tsquery('simple', :{name})" for name in names) + ")"


def _pg_found_in(session: Session, term: str, cap: int) -> int:
    """In how many messages a term is found, counting up to cap + 1 at most (the GIN index)."""
    sql = (
        f"SELECT count(*) FROM (SELECT 1 FROM entry e WHERE {PG_KINDS}"
        f" AND {PG_VECTOR} @@ to_tsquery('simple', :t) LIMIT :n) AS found"
    )
    return int(session.connection().execute(text(sql), {"t": term, "n": cap + 1}).scalar_one())


def pg_snippet(body: str, headline: str) -> list[dict[str, Any]]:
    """ts_headline's marked excerpt as spans, with … where it leaves text out."""
    plain = headline.replace(MARK_START, "").replace(MARK_END, "")
    at = body.find(plain)
    before = "…" if at > 0 else ""
    after = "…" if at >= 0 and at + len(plain) < len(body) else ""
    return snippet_spans(before + headline + after)


def _search_postgres(
    session: Session,
    query: str,
    limit: int,
    cap: int,
    conversation_ids: Sequence[int] | None,
) -> list[dict[str, Any]]:
    """PostgreSQL full text: the same rules as FTS5 (every word, rare words rank, prefix)."""
    every = pg_terms(query)
    if not every:
        return []
    names = [f"t{i}" for i in range(len(every))]
    params: dict[str, Any] = dict(zip(names, every, strict=True))
    params |= {"limit": limit, "headline": PG_HEADLINE}
    match = _pg_query(names)
    rare = [name for name in names if _pg_found_in(session, params[name], cap) <= cap]
    # Only common words: the newest messages first (ranking would read every match).
    score = f"ts_rank({PG_VECTOR}, {_pg_query(rare)})" if rare else "0"
    if names[-1] in rare:  # as on SQLite, the word itself ranks above longer words it begins
        params["exact"] = params[names[-1]].removesuffix(":*")
        score += f" + ts_rank({PG_VECTOR}, to_tsquery('simple', :exact))"
    # Ranked and cut in the inner query; ts_headline runs on the kept rows only.
    sql = (
        "SELECT e.id AS entry_id, e.seq, e.kind, e.conversation_id, c.title, c.status, e.text,"
        f" ts_headline('simple', e.text, {match}, :headline) AS snippet"
        f" FROM (SELECT e.id, {score} AS score FROM entry e"
        f" WHERE {PG_KINDS} AND {PG_VECTOR} @@ {match}{_scope(conversation_ids)}"
        " ORDER BY score DESC, e.id DESC LIMIT :limit) AS found"
        " JOIN entry e ON e.id = found.id JOIN conversation c ON c.id = e.conversation_id"
        " ORDER BY found.score DESC, e.id DESC"
    )
    rows = session.connection().execute(_scoped(sql, params, conversation_ids), params)
    return [_hit(row, pg_snippet(row.text, row.snippet or "")) for row in rows]


def _search_like(
    session: Session, query: str, limit: int, conversation_ids: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Without full text (another database): every word as a substring, newest first."""
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
    sql = (
        "SELECT e.id AS entry_id, e.seq, e.kind, e.conversation_id, c.title, c.status, e.text"
        " FROM entry e JOIN conversation c ON c.id = e.conversation_id"
        f" WHERE e.kind IN ('user', 'agent') AND {conditions}{_scope(conversation_ids)}"
        " ORDER BY e.id DESC LIMIT :limit"
    )
    rows = session.connection().execute(_scoped(sql, params, conversation_ids), params)
    return [_hit(row, like_snippet(row.text, query_words)) for row in rows]


def _like_escape(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

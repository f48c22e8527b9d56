"""Bad input through the real relay: every refusal is a JSON 4xx, stores nothing, breaks nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.agents.base import AgentEvent, AgentSpec, MessageDone, TextDelta, TurnDone
from app.api_docs import Field, operations
from app.render import render_markdown
from app.unicode_text import has_visible_character, is_valid_unicode, isolate
from tests.relay import TOKEN, LiveRelay, make_settings, receive, receive_until
from tests.stand_in import StandIn

JSON_HEADERS = {"content-type": "application/json"}


def conversations(relay: LiveRelay) -> list[dict[str, Any]]:
    response = relay.http.get("/api/conversations")
    assert response.status_code == 200, response.text
    return list(response.json()["conversations"])


def fresh_client(relay: LiveRelay) -> httpx.Client:
    """A client on a new connection (after a crash the server drops the kept-alive one)."""
    return httpx.Client(base_url=relay.base, headers={"Authorization": f"Bearer {TOKEN}"})


def assert_json_error(response: httpx.Response, status: int) -> Any:
    """The answer is the given status, as JSON with a detail."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    detail = response.json()["detail"]
    assert detail
    return detail


# ---- 7. working directories the file system cannot take -----------------------------------------


def bad_cwds(data_dir: Path) -> dict[str, tuple[str, str]]:
    """Each bad working directory, with the message the relay answers."""
    loop = data_dir / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)  # a link to itself
    return {
        "unknown user": ("~nosuchuser/x", "The working directory '~nosuchuser/x' names an unknown"),
        "NUL byte": (f"{data_dir}/a\0b", "The working directory cannot contain a NUL character."),
        "long component": (
            f"{data_dir}/{'a' * 3000}",
            "The working directory cannot be used: File name too long.",
        ),
        "symlink loop": (str(loop), "The working directory goes through a symlink loop."),
        "below a loop": (f"{loop}/x", "The working directory goes through a symlink loop."),
    }


@pytest.mark.parametrize(
    "case", ["unknown user", "NUL byte", "long component", "symlink loop", "below a loop"]
)
def test_bad_working_directory_is_a_400_and_stores_nothing(relay: LiveRelay, case: str) -> None:
    cwd, message = bad_cwds(relay.settings.resolved_data_dir)[case]
    with fresh_client(relay) as client:
        response = client.post("/api/conversations", json={"provider": "demo", "cwd": cwd})
    assert assert_json_error(response, 400).startswith(message)
    assert conversations(relay) == []
    assert relay.http.get("/healthz").json() == {"status": "ok"}
    assert relay.create(title="still fine")["title"] == "still fine"


# ---- 7. lone surrogates -------------------------------------------------------------------------

SURROGATE_MESSAGE = "The text is not valid Unicode (it holds a lone surrogate such as \\ud800)."


def post_raw(client: httpx.Client, method: str, path: str, body: str | bytes) -> httpx.Response:
    """Send a JSON body as written (json.dumps would escape what we want to send)."""
    content = body.encode() if isinstance(body, str) else body
    return client.request(method, path, content=content, headers=JSON_HEADERS)


HANDOFF_FILE = '{"done": "a", "next": "b", "files": ["ok.py", "\\ud800.py"]}'


def test_lone_surrogates_are_a_422_and_store_nothing(relay: LiveRelay) -> None:
    cid = relay.create(title="kept")["id"]
    attempts = [
        ("POST", "/api/conversations", '{"provider": "demo", "title": "a\\ud800b"}', "title"),
        ("POST", "/api/conversations", '{"provider": "\\ud800"}', "provider"),
        ("POST", "/api/conversations", '{"cwd": "/tmp/\\udc80"}', "cwd"),
        ("PATCH", f"/api/conversations/{cid}", '{"title": "\\ud800"}', "title"),
        ("POST", f"/api/conversations/{cid}/messages", '{"text": "hi \\ud800"}', "text"),
        ("POST", f"/api/conversations/{cid}/messages", '{"text": "hi", "x": "\\ud800"}', "x"),
        # (a handoff's texts and files: a 500 before, found by a hostile review)
        ("PUT", f"/api/conversations/{cid}/handoff", '{"done": "a\\ud800", "next": "b"}', "done"),
        ("PUT", f"/api/conversations/{cid}/handoff", '{"done": "a", "next": "\\udfff"}', "next"),
        ("PUT", f"/api/conversations/{cid}/handoff", HANDOFF_FILE, "files"),
        ("POST", f"/api/conversations/{cid}/compact", '{"revision": "\\ud800"}', "revision"),
    ]
    for method, path, body, field in attempts:
        with fresh_client(relay) as client:
            detail = assert_json_error(post_raw(client, method, path, body), 422)
        assert detail[0]["loc"][:2] == ["body", field]
        if field != "x":
            assert detail[0]["msg"] == SURROGATE_MESSAGE
    assert [c["title"] for c in conversations(relay)] == ["kept"]
    assert relay.get(cid)["timeline"] == []
    assert relay.http.get(f"/api/conversations/{cid}/handoff").json()["handoff"] is None
    assert relay.send(cid, "valid now").status_code == 202
    relay.wait_idle(cid)


def test_permission_answer_with_a_lone_surrogate_is_a_422(relay: LiveRelay) -> None:
    cid = relay.create(title="perm")["id"]
    assert relay.send(cid, "ask permission").status_code == 202
    view = relay.wait_for(
        cid, lambda v: any(e["data"].get("type") == "permission" for e in v["timeline"])
    )
    entry = next(e for e in view["timeline"] if e["data"].get("type") == "permission")
    path = f"/api/conversations/{cid}/permissions/{entry['id']}"
    with fresh_client(relay) as client:
        body = '{"allow": false, "message": "no \\ud800"}'
        detail = assert_json_error(post_raw(client, "POST", path, body), 422)
    assert detail[0]["msg"] == SURROGATE_MESSAGE
    answered = relay.http.post(path, json={"allow": True})
    assert answered.status_code == 200, answered.text
    assert answered.json()["state"] == "allowed"
    relay.wait_idle(cid)


# ---- 11. titles that look empty -----------------------------------------------------------------

INVISIBLE_TITLES = ["\u200b", "\u200b\u200c\u200d", "\u2060\ufeff", "\u3164", " \u2800 ", "\u202e"]


@pytest.mark.parametrize("title", INVISIBLE_TITLES)
def test_title_without_a_visible_character_is_refused(relay: LiveRelay, title: str) -> None:
    cid = relay.create(title="visible")["id"]
    created = relay.http.post("/api/conversations", json={"provider": "demo", "title": title})
    renamed = relay.http.patch(f"/api/conversations/{cid}", json={"title": title})
    for response in (created, renamed):
        detail = assert_json_error(response, 422)
        assert detail[0]["msg"] == "The title has no visible character."
    assert [c["title"] for c in conversations(relay)] == ["visible"]


def test_a_message_without_a_visible_character_is_empty(relay: LiveRelay) -> None:
    # It was taken (and sent to the agent, a paid turn of nothing); it left the title alone.
    cid = relay.create()["id"]
    response = relay.send(cid, "\u200b\u2060")
    assert (response.status_code, response.json()) == (422, {"detail": "The message is empty."})
    assert relay.get(cid)["title"] == "New conversation"


def test_titles_with_a_visible_character_are_kept(relay: LiveRelay) -> None:
    assert relay.create(title="\u200bzero-width then text")["title"] == "\u200bzero-width then text"
    assert relay.create(title="   ")["title"] == "New conversation"  # blank: the default, as before


def test_visible_characters() -> None:
    assert has_visible_character("a")
    assert has_visible_character("\u05d0")  # Hebrew alef
    assert has_visible_character("\u200b🙂")
    for blank in [*INVISIBLE_TITLES, "", " \t\n", "\u0301", "\u00ad", "\x01\x7f \x1f"]:
        assert not has_visible_character(blank), repr(blank)
    # ASCII text is read in one C call (a 256 KB message on the loop): the same answers.
    ascii_texts = ("\x00 ~", "\x7f!", "\x1f\x7f")
    assert [has_visible_character(t) for t in ascii_texts] == [True, True, False]


def test_isolate_wraps_only_bidi_text() -> None:
    assert isolate("plain text") == "plain text"
    assert isolate("a\u202eb") == "\u2068a\u202eb\u2069"
    assert isolate("\u05e9\u05dc\u05d5\u05dd") == "\u2068\u05e9\u05dc\u05d5\u05dd\u2069"


def test_valid_unicode() -> None:
    assert is_valid_unicode("héllo 🙂")
    assert not is_valid_unicode("\ud800")
    assert not is_valid_unicode("a\udfffb")


# ---- 7. anything unforeseen ---------------------------------------------------------------------


def test_unforeseen_error_is_a_json_500_and_the_relay_goes_on(tmp_path: Path) -> None:
    relay = LiveRelay(make_settings(tmp_path / "data"))

    @relay.app.get("/api/broken")
    async def broken() -> None:
        """A route with a bug the relay did not foresee."""
        raise KeyError("a bug")

    relay.start()
    try:
        with fresh_client(relay) as client:
            response = client.get("/api/broken")
            # The connection is closed, and said to be: the next request takes a new one.
            assert response.headers["connection"] == "close"
            assert client.get("/api/conversations").status_code == 200
        detail = assert_json_error(response, 500)
        assert detail == "The relay failed to answer this request (an internal error, logged)."
        assert response.headers["x-content-type-options"] == "nosniff"
        assert relay.create(title="after")["title"] == "after"
    finally:
        relay.stop()


# ---- 8. deeply nested WebSocket frames ----------------------------------------------------------


def test_deeply_nested_frames_get_an_error_and_the_socket_stays(relay: LiveRelay) -> None:
    deep = "[" * 5000 + "]" * 5000  # 10 KB: under the frame limit
    deep_object = '{"":' * 2500 + "1" + "}" * 2500  # 12.5 KB
    deep_type = '{"type": ' + "[" * 900 + "]" * 900 + "}"  # parses, but repr() would recurse
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        for frame in (deep, deep_object):
            ws.send(frame)
            assert receive(ws) == {"type": "error", "detail": "The message is nested too deeply."}
        ws.send(deep_type)
        assert receive(ws) == {
            "type": "error",
            "detail": "Unknown message type (a list or object).",
        }
        # Found by a hostile review: answered "Messages must be JSON objects." (it is one).
        ws.send('{"type": "subscribe", "conversation_id": ' + "9" * 5000 + "}")
        assert receive(ws) == {"type": "error", "detail": "The message holds a number too long."}
        ws.send(json.dumps({"type": "ping"}))
        assert receive(ws) == {"type": "pong"}


def test_deeply_nested_json_body_is_a_4xx(relay: LiveRelay) -> None:
    cid = relay.create(title="deep")["id"]
    body = '{"text": ' + "[" * 5000 + "]" * 5000 + "}"
    long_number = '{"text": "hi", "n": ' + "9" * 5000 + "}"
    # Found by a hostile review: FastAPI's "There was an error parsing the body" said nothing
    # of why; the socket already said it of a message.
    for sent, said in (
        (body, "The request body is nested too deeply."),
        (long_number, "The request body holds a number too long."),
        (b'{"text": "\xff\xfe"}', "The request body is not UTF-8 text."),  # (an API review)
    ):
        with fresh_client(relay) as client:
            response = post_raw(client, "POST", f"/api/conversations/{cid}/messages", sent)
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"detail": said}
    with fresh_client(relay) as client:  # not JSON at all: a problem in the list (docs/api.md)
        broken = post_raw(client, "POST", f"/api/conversations/{cid}/messages", '{"text": ')
    assert broken.status_code == 422
    assert [problem["type"] for problem in broken.json()["detail"]] == ["json_invalid"]
    assert relay.get(cid)["timeline"] == []
    missing = relay.http.get("/api/conversations/999999")  # other HTTP errors: as they were
    assert (missing.status_code, missing.json()) == (404, {"detail": "No conversation 999999."})


# ---- 25. another process holding the SQLite write lock ------------------------------------------

HOLDER = """
import select, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN IMMEDIATE")  # the write lock, as a backup tool or a shell would take it
print("locked", flush=True)
select.select([sys.stdin], [], [], 15)  # until told (at most 15 s)
connection.execute("ROLLBACK")
print("released", flush=True)
"""


@contextmanager
def write_lock(database: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the database's write lock until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(database)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield holder
    finally:
        released, _ = holder.communicate("release\n", timeout=30)
        assert released == "released\n"


def test_locked_database_answers_503_while_sockets_flow(
    relay: LiveRelay, caplog: pytest.LogCaptureFixture
) -> None:
    cid = relay.create(title="locked")["id"]
    database = relay.settings.resolved_data_dir / "oarlock.db"
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        with write_lock(database) as holder:
            response = relay.send(cid, "while locked")
            assert holder.poll() is None  # answered while the other process still holds the lock
            assert response.status_code == 503, response.text
            assert response.json() == {
                "detail": "The database cannot be used right now (database is locked). "
                "Nothing was stored."
            }
            ws.send(json.dumps({"type": "ping"}))
            assert receive(ws) == {"type": "pong"}
            assert relay.get(cid)["timeline"] == []  # reading works; nothing was stored
            assert holder.poll() is None
    # Logged without the statement's values: a user's text is not the log's to keep.
    assert "database error" in caplog.text
    assert "while locked" not in caplog.text
    assert relay.send(cid, "while locked").status_code == 202  # the lock is gone: stored
    user, agent = relay.wait_idle(cid)["timeline"]
    assert (user["text"], agent["text"][:24]) == ("while locked", "You said: “while locked”")


def test_an_answer_refused_while_locked_can_be_given_again(relay: LiveRelay) -> None:
    # A review: the 503 ("Nothing was stored") lost the waiting agent's future; the retry got
    # 409 "no longer asked", Stop could not reach it, and the turn ran for ever.
    cid = relay.create(title="Answered twice")["id"]
    assert relay.send(cid, "ask permission").status_code == 202

    def asked(view: dict[str, Any]) -> bool:
        return any(e["state"] == "pending" for e in view["timeline"])

    question = next(e for e in relay.wait_for(cid, asked)["timeline"] if e["state"] == "pending")
    path = f"/api/conversations/{cid}/permissions/{question['id']}"
    with write_lock(relay.settings.resolved_data_dir / "oarlock.db"):
        refused = relay.http.post(path, json={"allow": True})
    assert refused.status_code == 503, refused.text
    again = relay.http.post(path, json={"allow": True})
    assert again.status_code == 200, again.text
    answered = next(e for e in relay.wait_idle(cid)["timeline"] if e["id"] == question["id"])
    assert answered["state"] == "allowed"


def test_a_resend_refused_while_locked_tells_the_tabs_nothing(relay: LiveRelay) -> None:
    # A review: the carry-over given back to the conversation was published before the write
    # that failed (503): every tab showed a "will be sent" bar the database did not hold.
    old = relay.create(title="Carried")["id"]
    assert relay.send(old, "hello").status_code == 202
    relay.wait_idle(old)
    new = relay.send(old, "/compact").json()["compacted_into"]["id"]
    message = relay.send(new, "first").json()  # it takes the carry-over
    relay.wait_idle(new)
    relay.mark_cut(message["id"])  # as a restart leaves a turn it cut
    url = f"/api/conversations/{new}/messages/{message['id']}/resend"
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        with write_lock(relay.settings.resolved_data_dir / "oarlock.db"):
            refused = relay.http.post(url)
        assert refused.status_code == 503, refused.text
        ws.send(json.dumps({"type": "ping"}))
        told = receive_until(ws, lambda m: m["type"] == "pong")
    assert [m for m in told if m["type"] == "conversation"] == []
    assert relay.get(new)["pending_summary"] is None
    assert relay.http.post(url).status_code == 202  # the lock gone: resent, carrying it
    replies = [e for e in relay.wait_idle(new)["timeline"] if e["kind"] == "agent"]
    assert len(replies) == 2 and "[Carry-over context" in replies[-1]["text"]


def test_a_compact_refused_while_locked_writes_no_backup(relay: LiveRelay) -> None:
    # A review: the precompact_manual backup was written before the compaction's transaction,
    # so a /compact refused 503 left a backup of a compaction that never happened.
    cid = relay.create(title="Not compacted")["id"]
    assert relay.send(cid, "hello").status_code == 202
    relay.wait_idle(cid)
    with write_lock(relay.settings.resolved_data_dir / "oarlock.db"):
        refused = relay.send(cid, "/compact")
    assert refused.status_code == 503, refused.text
    time.sleep(0.5)  # (a backup is written off the request's path)
    assert relay.http.get(f"/api/conversations/{cid}/backups").json()["backups"] == []
    assert relay.send(cid, "/compact").status_code == 201
    deadline = time.monotonic() + 10
    while not (found := relay.http.get(f"/api/conversations/{cid}/backups").json()["backups"]):
        assert time.monotonic() < deadline, "the compaction's backup never came"
        time.sleep(0.05)
    assert [b["trigger"] for b in found] == ["precompact_manual"]


class GatedAgent(StandIn):
    """A stand-in agent: streams a first piece, then finishes its message when the test says."""

    def __init__(self, spec: AgentSpec, go: threading.Event, finishing: threading.Event) -> None:
        super().__init__(spec)
        self.go = go
        self.finishing = finishing

    async def turn(self, prompt: str) -> AsyncIterator[AgentEvent]:
        """A first piece; then, once told, the whole message and the end of the turn."""
        yield TextDelta("m1", "first piece")
        await asyncio.to_thread(self.go.wait, 30)
        self.finishing.set()
        yield MessageDone("m1", f"first piece, then the rest ({prompt})")
        yield TurnDone()


def test_agent_output_waits_for_a_locked_database_while_sockets_flow(relay: LiveRelay) -> None:
    go, finishing = threading.Event(), threading.Event()
    relay.supervisor.agent_factory = lambda _p, spec, _s: GatedAgent(spec, go, finishing)
    cid = relay.create(title="turn")["id"]
    assert relay.send(cid, "go").status_code == 202
    relay.wait_for(cid, lambda v: [e["state"] for e in v["timeline"]] == ["sent", "streaming"])
    database = relay.settings.resolved_data_dir / "oarlock.db"
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        with write_lock(database) as holder:
            go.set()
            assert finishing.wait(10)  # the agent handed over its message while the lock is held
            ws.send(json.dumps({"type": "ping"}))
            assert receive(ws) == {"type": "pong"}  # the loop runs: the write waits, not the loop
            states = [e["state"] for e in relay.get(cid)["timeline"]]
            assert states == ["sent", "streaming"]  # not stored yet, not failed either
            assert holder.poll() is None
    view = relay.wait_idle(cid)
    assert [(e["kind"], e["state"], e["text"]) for e in view["timeline"]] == [
        ("user", "sent", "go"),
        ("agent", "done", "first piece, then the rest (go)"),
    ]


# ---- 20. table alignment without inline styles --------------------------------------------------


def test_table_alignment_is_a_class_not_a_style() -> None:
    html = render_markdown("| a | b | c | d |\n|:--|:-:|--:|---|\n| 1 | 2 | 3 | 4 |")
    assert "style" not in html
    assert '<th class="align-left">a</th>' in html
    assert '<th class="align-center">b</th>' in html
    assert '<td class="align-right">3</td>' in html
    assert "<th>d</th>" in html


def test_code_language_class_is_still_kept() -> None:
    assert '<code class="language-python">' in render_markdown("```python\nx = 1\n```")


# ---- 21. /docs without a CDN --------------------------------------------------------------------


def test_docs_page_lists_routes_without_swagger_or_redoc(relay: LiveRelay) -> None:
    page = relay.http.get("/docs")
    assert page.status_code == 200
    assert "<script" not in page.text
    assert "cdn" not in page.text
    assert "/api/conversations/{conversation_id}/messages" in page.text
    for gone in ("/redoc", "/docs/oauth2-redirect"):
        assert relay.http.get(gone).status_code == 404


def test_docs_rows_come_from_the_schema(relay: LiveRelay) -> None:
    rows = {(op.method, op.path): op for op in operations(relay.app.openapi())}
    create = rows[("POST", "/api/conversations")]
    assert Field("title", "body", "string or null", False) in create.fields
    assert create.statuses == ["201", "422"]
    # (an API review: /compact's 201 was missing)
    assert rows[("POST", "/api/conversations/{conversation_id}/messages")].statuses == [
        "202",
        "201",
        "422",
    ]
    listing = rows[("GET", "/api/conversations")]
    assert Field("status", "query", "active | archived", False) in listing.fields

"""Login and the token: sessions, log out, the limiter, forwarded headers, logs, file modes."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from app.logs import redact
from app.security import FailureLimiter
from app.sessions import CHECK_SECONDS
from tests.relay import TOKEN, LiveRelay, free_port, make_settings

ROOT = Path(__file__).resolve().parents[1]
UNAUTHORIZED = {"detail": "Missing or invalid token."}
TOO_MANY = {"detail": "Too many failed attempts; wait a minute."}
NO_ORIGIN = {"detail": "Cross-origin request refused (no Origin header)."}
CROSS_ORIGIN = {"detail": "Cross-origin request refused."}
SERVE_TOKEN = "serve-token-3q2f9x0b7mZt"


def relay_with(tmp_path: Path, **overrides: object) -> LiveRelay:
    """A relay with other settings than the shared fixture's (stop it in finally)."""
    return LiveRelay(make_settings(tmp_path / "data", **overrides)).start()


def api(relay: LiveRelay, cookie: str) -> int:
    """The status of the conversation list for a browser holding cookie."""
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        return client.get("/api/conversations", headers={"Cookie": cookie}).status_code


def logout(relay: LiveRelay, cookie: str, origin: str | None) -> httpx.Response:
    headers = {"Cookie": cookie} | ({"Origin": origin} if origin else {})
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        return client.post("/logout", headers=headers)


# -- the cookie is a session, not the token ------------------------------------------------


def test_cookie_is_a_session_id_not_the_token(relay: LiveRelay) -> None:
    by_url = relay.login()
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        form = client.post("/login", data={"token": TOKEN}, headers={"Origin": relay.base})
    by_form = form.headers["set-cookie"].split(";")[0]
    values = [cookie.split("=", 1)[1] for cookie in (by_url, by_form)]
    assert [(TOKEN in value, len(value)) for value in values] == [(False, 43)] * 2
    assert values[0] != values[1]
    assert [api(relay, by_url), api(relay, by_form)] == [200, 200]


def test_cookie_holding_the_token_is_refused(relay: LiveRelay) -> None:
    cookies = [f"oarlock_session={TOKEN}", f"oarlock_token={TOKEN}"]
    assert [api(relay, cookie) for cookie in cookies] == [401, 401]


def test_database_stores_no_session_id_nor_token(relay: LiveRelay) -> None:
    session_id = relay.login().split("=", 1)[1]
    db = sqlite3.connect(relay.settings.resolved_data_dir / "oarlock.db")
    rows = db.execute("SELECT key, expires_at - CAST(strftime('%s') AS INTEGER) FROM login_session")
    stored = rows.fetchall()
    db.close()
    [(key, lifetime)] = stored
    assert (session_id in key, TOKEN in key, len(key)) == (False, False, 64)
    assert 30 * 86400 - 60 < lifetime <= 30 * 86400


def test_session_survives_a_restart(tmp_path: Path) -> None:
    first = relay_with(tmp_path)
    try:
        cookie = first.login()
    finally:
        first.stop()
    second = relay_with(tmp_path)
    try:
        assert api(second, cookie) == 200
    finally:
        second.stop()


def test_changing_the_token_ends_every_session(tmp_path: Path) -> None:
    first = relay_with(tmp_path)
    try:
        cookie = first.login()
    finally:
        first.stop()
    second = relay_with(tmp_path, token="a-brand-new-token-after-a-leak")
    try:
        assert api(second, cookie) == 401
    finally:
        second.stop()


def test_login_with_a_read_only_database_answers_503(relay: LiveRelay) -> None:
    engine = relay.app.state.engine

    def read_only(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA query_only = ON")

    event.listen(engine, "connect", read_only)
    engine.dispose()  # every connection from now on refuses writes
    try:
        with httpx.Client(base_url=relay.base, timeout=10) as client:
            answers = [
                client.get(f"/?token={TOKEN}"),
                client.post("/login", data={"token": TOKEN}, headers={"Origin": relay.base}),
            ]
    finally:
        event.remove(engine, "connect", read_only)
        engine.dispose()
    detail = (
        "The database cannot be used right now (attempt to write a readonly database). "
        "Nothing was stored."
    )
    assert [(r.status_code, r.json(), r.headers.get("set-cookie")) for r in answers] == [
        (503, {"detail": detail}, None)
    ] * 2
    assert relay.login().startswith("oarlock_session=")  # writable again: logins work


def test_session_check_on_an_unreadable_database_answers_503(relay: LiveRelay) -> None:
    cookie = relay.login()
    engine = relay.app.state.engine

    def broken(dbapi_connection: Any, _record: Any) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    event.listen(engine, "connect", broken)
    engine.dispose()  # every connection from now on fails to open
    try:
        with httpx.Client(base_url=relay.base, timeout=10) as client:
            answer = client.get("/api/conversations", headers={"Cookie": cookie})
    finally:
        event.remove(engine, "connect", broken)
        engine.dispose()
    assert (answer.status_code, answer.json()) == (
        503,
        {"detail": "The database cannot be used right now; try again shortly."},
    )
    assert api(relay, cookie) == 200  # readable again: the same session works


# -- log out -----------------------------------------------------------------------------


def test_logout_ends_the_session(relay: LiveRelay) -> None:
    cookie, other = relay.login(), relay.login()
    response = logout(relay, cookie, relay.base)
    assert (response.status_code, response.headers["location"]) == (303, "/login")
    assert response.headers["set-cookie"].startswith("oarlock_session=; ")
    assert "Max-Age=0" in response.headers["set-cookie"]
    # The old cookie no longer works anywhere; another browser's session still does.
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        page = client.get("/", headers={"Cookie": cookie})
    assert (api(relay, cookie), page.status_code, page.headers["location"]) == (401, 303, "/login")
    assert api(relay, other) == 200


def test_logout_ended_cookie_cannot_open_a_socket(relay: LiveRelay) -> None:
    cookie = relay.login()
    logout(relay, cookie, relay.base)
    url = f"ws://127.0.0.1:{relay.settings.port}/ws"
    headers = {"Cookie": cookie, "Origin": relay.base}
    with pytest.raises(InvalidStatus) as refused, connect(url, additional_headers=headers):
        pass
    assert refused.value.response.status_code == 401


def test_logout_closes_the_sessions_open_sockets(relay: LiveRelay) -> None:
    cookie, other = relay.login(), relay.login()
    url = f"ws://127.0.0.1:{relay.settings.port}/ws"
    with (
        connect(url, additional_headers={"Cookie": cookie, "Origin": relay.base}) as ended,
        connect(url, additional_headers={"Cookie": other, "Origin": relay.base}) as kept,
    ):
        assert ['"hello"' in str(ws.recv(timeout=10)) for ws in (ended, kept)] == [True, True]
        logout(relay, cookie, relay.base)
        with pytest.raises(ConnectionClosed) as closed:
            ended.recv(timeout=10)
        kept.send('{"type": "ping"}')
        pong = kept.recv(timeout=10)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason, '"pong"' in str(pong)) == (
        4401,
        "Logged out.",
        True,
    )


def test_sockets_of_a_session_ended_elsewhere_are_closed(relay: LiveRelay) -> None:
    """Another node's log out deletes the row in the shared database; expiry passes its time.

    Neither goes through this process's /logout: its periodic look at the sessions with open
    sockets closes them (4401), and only them.
    """
    ended, expired, kept = relay.login(), relay.login(), relay.login()
    sessions = relay.app.state.sessions
    url = f"ws://127.0.0.1:{relay.settings.port}/ws"
    with (
        connect(url, additional_headers={"Cookie": ended, "Origin": relay.base}) as first,
        connect(url, additional_headers={"Cookie": expired, "Origin": relay.base}) as second,
        connect(url, additional_headers={"Cookie": kept, "Origin": relay.base}) as third,
    ):
        sockets = (first, second, third)
        assert ['"hello"' in str(ws.recv(timeout=10)) for ws in sockets] == [True] * 3
        sessions.remove(ended.split("=", 1)[1])  # as another node's /logout does
        with relay.app.state.engine.begin() as db:
            db.execute(
                text("UPDATE login_session SET expires_at = :past WHERE key = :key"),
                {"past": int(time.time()) - 1, "key": sessions.key(expired.split("=", 1)[1])},
            )
        closed = []
        for ws in (first, second):
            with pytest.raises(ConnectionClosed) as caught:
                ws.recv(timeout=CHECK_SECONDS + 10)
            assert caught.value.rcvd is not None
            closed.append((caught.value.rcvd.code, caught.value.rcvd.reason))
        third.send('{"type": "ping"}')
        assert '"pong"' in str(third.recv(timeout=10))
    assert closed == [(4401, "Logged out.")] * 2
    assert api(relay, kept) == 200


def test_logout_needs_the_relays_origin(relay: LiveRelay) -> None:
    cookie = relay.login()
    answers = [logout(relay, cookie, origin) for origin in (None, "http://evil.example", "null")]
    assert [(r.status_code, r.json()) for r in answers] == [
        (403, NO_ORIGIN),
        (403, CROSS_ORIGIN),
        (403, CROSS_ORIGIN),
    ]
    assert api(relay, cookie) == 200


# -- the failure limiter never locks the owner out -----------------------------------------


def test_owner_session_works_while_guesses_are_refused(relay: LiveRelay) -> None:
    cookie = relay.login()
    with httpx.Client(base_url=relay.base, timeout=30) as attacker:
        guesses = [attacker.get(f"/?token=guess{n}").status_code for n in range(12)]
    with httpx.Client(base_url=relay.base, timeout=10) as owner:
        page = owner.get("/", headers={"Cookie": cookie})
        created = owner.post(
            "/api/conversations",
            json={"provider": "demo"},
            headers={"Cookie": cookie, "Origin": relay.base},
        )
    with relay.socket() as ws:
        hello = ws.recv(timeout=10)
    assert guesses == [303] * 10 + [429] * 2
    assert (page.status_code, created.status_code, '"hello"' in str(hello)) == (200, 201, True)


def test_correct_token_gets_in_past_the_limit(relay: LiveRelay) -> None:
    with httpx.Client(base_url=relay.base, timeout=30) as client:
        for n in range(11):
            client.get(f"/?token=guess{n}")
        wrong = client.get("/?token=guess-again")
        right = client.get(f"/?token={TOKEN}")
    assert (wrong.status_code, wrong.json()) == (429, TOO_MANY)
    assert (right.status_code, right.headers["location"]) == (303, "/")
    assert api(relay, right.headers["set-cookie"].split(";")[0]) == 200


def test_guesses_sent_in_parallel_past_the_limit_are_judged_one_at_a_time(
    relay: LiveRelay,
) -> None:
    # Found by a security review: past the limit each failure waited its 1 s pause, but the
    # pauses ran side by side: 100 parallel guesses were all answered within 2 s, a right one
    # among them with 200. Now they wait in turn, the right one too.
    with httpx.Client(base_url=relay.base, timeout=60) as client:
        wrong = {"Authorization": "Bearer nope"}
        assert [client.get("/api/conversations", headers=wrong).status_code for _ in range(10)] == [
            401
        ] * 10

        def guess(token: str) -> tuple[int, float]:
            with httpx.Client(base_url=relay.base, timeout=60) as own:
                headers = {"Authorization": f"Bearer {token}"}
                answer = own.get("/api/conversations", headers=headers)
            return answer.status_code, time.monotonic() - start

        start = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            wrong_ones = [pool.submit(guess, "nope") for _ in range(3)]
            time.sleep(0.3)  # (queued behind them)
            right = pool.submit(guess, TOKEN)
            answers = [f.result() for f in wrong_ones]
            allowed = right.result()
    assert sorted(code for code, _ in answers) == [429] * 3
    assert sorted(took for _, took in answers)[-1] >= 2.9  # three pauses of 1 s, in turn
    assert allowed[0] == 200 and allowed[1] >= 2.9  # known only in its turn


async def test_a_client_s_failures_wait_in_turn_and_a_right_token_skips_no_queue() -> None:
    limiter = FailureLimiter(limit=2, window=60.0, pause=0.1)
    assert [await limiter.guess("a", False) for _ in range(2)] == ["wrong", "wrong"]
    assert await limiter.guess("b", True) == "ok"  # another client: not blocked
    loop = asyncio.get_running_loop()
    start = loop.time()
    results = await asyncio.gather(*(limiter.guess("a", False) for _ in range(5)))
    assert results == ["refused"] * 5 and loop.time() - start >= 0.5  # one pause each, in turn
    assert await limiter.guess("b", True) == "ok"
    assert await limiter.guess("a", True) == "ok"  # nobody of its address waits: at once
    assert not limiter._turns  # nothing kept once nobody waits


# -- forwarded headers are believed only from OARLOCK_TRUSTED_PROXIES ----------------------


def test_rotating_forwarded_for_does_not_reset_the_limit(relay: LiveRelay) -> None:
    with httpx.Client(base_url=relay.base, timeout=30) as client:
        answers = [
            client.get(
                "/api/conversations",
                headers={"Authorization": "Bearer nope", "X-Forwarded-For": f"203.0.113.{n}"},
            )
            for n in range(11)
        ]
    assert [r.status_code for r in answers] == [401] * 10 + [429]


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("//evil.example/x", "/evil.example/x"),  # was //evil.example/x: another site
        ("/%2F%2Fevil.example", "/evil.example"),  # was ///evil.example
        ("/%5Cevil.example", "/evil.example"),  # was /\\evil.example: browsers read evil.example
        ("/a%0d%0aX:%20y", "/a%0D%0AX:%20y"),  # was an empty answer (a header refused)
        ("/c/3", "/c/3"),
    ],
)
def test_a_login_by_url_redirects_only_within_the_relay(
    relay: LiveRelay, path: str, location: str
) -> None:
    """GET <path>?token=… logs in and redirects to the path without the token: always a path
    of this relay (found by a hostile review: an open redirect, with the token)."""
    with httpx.Client(timeout=10) as client:
        response = client.get(f"{relay.base}{path}?token={TOKEN}&view=full")
    assert response.status_code == 303, response.text
    assert response.headers["location"] == f"{location}?view=full"


def test_forwarded_proto_ignored_by_default(relay: LiveRelay) -> None:
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        response = client.get(f"/?token={TOKEN}", headers={"X-Forwarded-Proto": "https"})
    assert (response.status_code, "Secure" in response.headers["set-cookie"]) == (303, False)


def test_trusted_proxy_limits_each_forwarded_client(tmp_path: Path) -> None:
    relay = relay_with(tmp_path, trusted_proxies=["127.0.0.1"])
    try:
        with httpx.Client(base_url=relay.base, timeout=30) as client:

            def attempt(client_address: str) -> int:
                headers = {"Authorization": "Bearer nope", "X-Forwarded-For": client_address}
                return client.get("/api/conversations", headers=headers).status_code

            first = [attempt("203.0.113.7") for _ in range(11)]
            other = attempt("198.51.100.1")
    finally:
        relay.stop()
    assert (first, other) == ([401] * 10 + [429], 401)


# -- the token in no log line ----------------------------------------------------------------


def test_redact_replaces_every_token_parameter() -> None:
    lines = ["GET /?token=abc HTTP/1.1", "/c/3?view=full&token=x-y_z&a=1", "/api?xtoken=keep"]
    lines.append("GET /?%74%6Fken=abc HTTP/1.1")  # the login decodes the name: it logs in too
    assert [redact(line) for line in lines] == [
        "GET /?token=[redacted] HTTP/1.1",
        "/c/3?view=full&token=[redacted]&a=1",
        "/api?xtoken=keep",
        "GET /?%74%6Fken=[redacted] HTTP/1.1",
    ]


@contextmanager
def serve(data_dir: Path, log: Path) -> Iterator[httpx.Client]:
    """`python -m app serve` as a child process (umask 022, like a login shell), output to log."""
    port = free_port()
    env = {
        **os.environ,
        "OARLOCK_TOKEN": SERVE_TOKEN,
        "OARLOCK_WORKSPACE_ROOTS": str(data_dir.parent),
        "OARLOCK_LOG_LEVEL": "debug",  # the access log is on at debug only
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "app", "serve", "--port", str(port)]
    command += ["--data-dir", str(data_dir)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, umask=0o022
        )
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.05)
            yield client
        finally:
            client.close()
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)


def test_access_log_never_holds_the_token(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve(tmp_path / "data", log) as client:
        statuses = [
            client.get(f"/?token={SERVE_TOKEN}").status_code,
            client.get(f"/c/1?view=full&token={SERVE_TOKEN}").status_code,
            client.get(f"/?token={SERVE_TOKEN[:-1]}").status_code,  # a near miss, too
            client.get(f"/?%74oken={SERVE_TOKEN}").status_code,  # found by a hostile review
        ]
    lines = log.read_text().splitlines()
    assert statuses == [303, 303, 303, 303]
    # No line holds it: the URL printed at start carries it only to a terminal, and a log
    # (this file, a service's journal) gets the URL and where the token is kept.
    assert [line.strip() for line in lines if SERVE_TOKEN[:-1] in line] == []
    assert f"http://127.0.0.1:{client.base_url.port}/" in [line.strip() for line in lines]
    assert [line.split('"')[1] for line in lines if "token=[redacted]" in line] == [
        "GET /?token=[redacted] HTTP/1.1",
        "GET /c/1?view=full&token=[redacted] HTTP/1.1",
        "GET /?token=[redacted] HTTP/1.1",
    ]
    assert [line.split('"')[1] for line in lines if "%74oken=" in line] == [
        "GET /?%74oken=[redacted] HTTP/1.1"
    ]


# -- the data directory is private ----------------------------------------------------------


def modes(data_dir: Path) -> dict[str, str]:
    """The permission bits of the data directory and the database files in it."""
    names = ["", "oarlock.db", "oarlock.db-wal", "oarlock.db-shm", "token"]
    return {
        name or ".": oct(stat.S_IMODE((data_dir / name).stat().st_mode))
        for name in names
        if (data_dir / name).exists()
    }


def create_conversation(client: httpx.Client) -> int:
    headers = {"Authorization": f"Bearer {SERVE_TOKEN}"}
    response = client.post("/api/conversations", json={"provider": "demo"}, headers=headers)
    return response.status_code


def test_new_data_dir_and_database_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data, tmp_path / "serve.log") as client:
        assert create_conversation(client) == 201
        seen = modes(data)
    assert seen == {
        ".": "0o700",
        "oarlock.db": "0o600",
        "oarlock.db-wal": "0o600",
        "oarlock.db-shm": "0o600",
    }


def test_existing_data_dir_and_database_are_made_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(data, tmp_path / "first.log") as client:
        assert create_conversation(client) == 201
    # What an earlier version left behind: a world-readable directory and database.
    data.chmod(0o755)
    (data / "oarlock.db").chmod(0o644)
    with serve(data, tmp_path / "second.log") as client:
        assert create_conversation(client) == 201
        seen = modes(data)
    assert seen == {
        ".": "0o700",
        "oarlock.db": "0o600",
        "oarlock.db-wal": "0o600",
        "oarlock.db-shm": "0o600",
    }


def test_a_token_query_beside_the_token_header_is_not_a_guess(relay: LiveRelay) -> None:
    # Found by a hostile review: an API GET with the right bearer token and a wrong token= was
    # sent to the login page as a failed login, and after ten of them refused with 429.
    with httpx.Client(base_url=relay.base, timeout=30) as client:
        answers = [
            client.get(
                "/api/conversations?token=stale", headers={"Authorization": f"Bearer {TOKEN}"}
            ).status_code
            for _ in range(12)
        ]
        page = client.get("/?token=stale", headers={"Authorization": f"Bearer {TOKEN}"})
        anonymous = client.get("/api/conversations?token=stale")
    assert answers == [200] * 12
    assert page.status_code == 200
    assert anonymous.status_code == 401  # an API path: never a login by URL (a redirect)

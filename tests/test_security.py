import hmac
import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from app.security import host_name, is_loopback, load_or_create_token, token_error
from tests.images import png
from tests.relay import TOKEN, LiveRelay, free_port, make_settings

ROOT = Path(__file__).resolve().parents[1]
# A session cookie: a random id (never the token), HttpOnly, SameSite=Lax, 30 days.
SET_COOKIE = re.compile(
    r"oarlock_session=[A-Za-z0-9_-]{43}; Path=/; HttpOnly; SameSite=Lax; Max-Age=2592000"
)
UNAUTHORIZED = {"detail": "Missing or invalid token."}
TOO_MANY = {"detail": "Too many failed attempts; wait a minute."}
CROSS_ORIGIN = {"detail": "Cross-origin request refused."}
NO_ORIGIN = {"detail": "Cross-origin request refused (no Origin header)."}
NOT_JSON = {"detail": "The API accepts application/json only."}
EVIL = "http://evil.example"


@pytest.fixture
def anon(relay: LiveRelay) -> Iterator[httpx.Client]:
    """A client with no credentials."""
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        yield client


def browser(relay: LiveRelay, origin: str | None = None) -> dict[str, str]:
    """Headers of a logged-in browser request (from origin, when given)."""
    headers = {"Cookie": relay.cookie}
    if origin is not None:
        headers["Origin"] = origin
    return headers


def ws_refusal(url: str, headers: dict[str, str], **options: Any) -> tuple[int, Any]:
    """The HTTP status and JSON body a refused WebSocket handshake got."""
    with (
        pytest.raises(InvalidStatus) as refused,
        connect(url, additional_headers=headers, open_timeout=10, **options),
    ):
        pass
    response = refused.value.response
    return response.status_code, json.loads(response.body or b"null")


def cookies_set(response: httpx.Response) -> list[bool]:
    """For each Set-Cookie of a response: is it a fresh session cookie?"""
    return [SET_COOKIE.fullmatch(c) is not None for c in response.headers.get_list("set-cookie")]


def ws_url(relay: LiveRelay) -> str:
    return f"ws://127.0.0.1:{relay.settings.port}/ws"


# -- token -------------------------------------------------------------------------------


def test_api_without_token_401(anon: httpx.Client) -> None:
    routes = [
        ("GET", "/api/conversations"),
        ("GET", "/api/providers"),
        ("GET", "/api/conversations/1"),
        ("GET", "/openapi.json"),  # the schema, as a script reads it (it was sent to /login)
        ("POST", "/api/conversations"),
        ("POST", "/api/conversations/1/messages"),
    ]
    answers = [
        anon.request(method, path, json={"text": "hi"} if method == "POST" else None)
        for method, path in routes
    ]
    assert [(r.status_code, r.json(), r.headers["www-authenticate"]) for r in answers] == [
        (401, UNAUTHORIZED, "Bearer")
    ] * len(routes)


def test_page_without_token_redirects_to_login(anon: httpx.Client) -> None:
    answers = [anon.get(path) for path in ("/", "/c/1", "/c/1x", "/docs")]
    assert [(r.status_code, r.headers["location"]) for r in answers] == [
        (303, "/login"),
        (303, "/login?next=/c/1"),  # a conversation's link comes back after the login
        (303, "/login"),
        (303, "/login"),
    ]


def test_public_paths_without_token_200(anon: httpx.Client) -> None:
    answers = [anon.get(path) for path in ("/login", "/static/app.js", "/healthz")]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert answers[0].headers["content-type"] == "text/html; charset=utf-8"


def test_wrong_token_401(anon: httpx.Client) -> None:
    wrong = [{"Authorization": "Bearer nope"}, {"Cookie": "oarlock_session=nope"}]
    answers = [anon.get("/api/conversations", headers=headers) for headers in wrong]
    assert [(r.status_code, r.json()) for r in answers] == [(401, UNAUTHORIZED)] * 2


def test_valid_token_accepted(anon: httpx.Client, relay: LiveRelay) -> None:
    bearer = anon.get("/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
    cookie = anon.get("/api/conversations", headers=browser(relay))
    page = anon.get("/", headers=browser(relay))
    empty = {"conversations": [], "next": None, "feed": bearer.json()["feed"]}
    assert [(r.status_code, r.json()) for r in (bearer, cookie)] == [(200, empty)] * 2
    assert (page.status_code, page.headers["content-type"]) == (200, "text/html; charset=utf-8")


# -- logging in --------------------------------------------------------------------------


def test_url_token_sets_cookie_and_redirects(anon: httpx.Client) -> None:
    home = anon.get(f"/?token={TOKEN}")
    deep = anon.get(f"/c/3?token={TOKEN}&view=full")
    assert [(r.status_code, r.headers["location"], cookies_set(r)) for r in (home, deep)] == [
        (303, "/", [True]),
        (303, "/c/3?view=full", [True]),
    ]


def test_url_wrong_token_redirects_to_failed_login(anon: httpx.Client) -> None:
    response = anon.get("/?token=nope")
    assert (
        response.status_code,
        response.headers["location"],
        response.headers.get_list("set-cookie"),
    ) == (303, "/login?failed=1", [])
    # A conversation's link with a mistyped token still opens it after the form (a review:
    # the form then went to /).
    linked = anon.get("/c/2?token=nope")
    assert (linked.status_code, linked.headers["location"]) == (303, "/login?failed=1&next=/c/2")


def test_login_form_checks_token(anon: httpx.Client, relay: LiveRelay) -> None:
    answers = [
        anon.post("/login", data={"token": token}, headers={"Origin": relay.base})
        for token in ("nope", TOKEN)
    ]
    assert [(r.status_code, r.headers["location"], cookies_set(r)) for r in answers] == [
        (303, "/login?failed=1", []),
        (303, "/", [True]),
    ]


def test_login_form_foreign_origin_403(anon: httpx.Client) -> None:
    response = anon.post("/login", data={"token": TOKEN}, headers={"Origin": EVIL})
    assert (response.status_code, response.json()) == (403, CROSS_ORIGIN)


def test_repeated_failures_429(anon: httpx.Client) -> None:
    wrong = {"Authorization": "Bearer nope"}
    statuses = [anon.get("/api/conversations", headers=wrong).status_code for _ in range(10)]
    response = anon.get("/api/conversations", headers=wrong)
    assert (statuses, response.status_code, response.json()) == ([401] * 10, 429, TOO_MANY)


def test_repeated_failures_still_let_the_token_in(anon: httpx.Client, relay: LiveRelay) -> None:
    for _ in range(10):
        anon.post("/login", data={"token": "nope"}, headers={"Origin": relay.base})
    bearer = anon.get("/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
    form = anon.post("/login", data={"token": TOKEN}, headers={"Origin": relay.base})
    assert (bearer.status_code, form.status_code, form.headers["location"], cookies_set(form)) == (
        200,
        303,
        "/",
        [True],
    )


def test_nine_failures_still_allowed(anon: httpx.Client) -> None:
    for _ in range(9):
        anon.get("/api/conversations", headers={"Authorization": "Bearer nope"})
    response = anon.get("/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200


def test_repeated_url_token_failures_429(anon: httpx.Client) -> None:
    for _ in range(10):
        anon.get("/?token=nope")
    response = anon.get("/?token=still-nope")
    assert (response.status_code, response.json()) == (429, TOO_MANY)


def test_query_mentioning_token_needs_auth(anon: httpx.Client) -> None:
    answers = [anon.get(f"/api/conversations?{query}") for query in ("xtoken=1", "a=token=")]
    assert [(r.status_code, r.json()) for r in answers] == [(401, UNAUTHORIZED)] * 2


def test_url_empty_token_fails_login(anon: httpx.Client) -> None:
    response = anon.get("/?token=")  # (an API path answers 401: test_auth.py)
    assert (response.status_code, response.headers.get("location")) == (303, "/login?failed=1")


def test_cookie_beside_unusual_cookies_works(anon: httpx.Client, relay: LiveRelay) -> None:
    others = ['prefs={"a":1}', "greeting=hello world"]
    answers = [
        anon.get("/api/conversations", headers={"Cookie": f"{other}; {relay.cookie}"})
        for other in others
    ]
    assert [r.status_code for r in answers] == [200, 200]


# -- origin and content type -------------------------------------------------------------


def test_cookie_post_own_origin_201(anon: httpx.Client, relay: LiveRelay) -> None:
    response = anon.post(
        "/api/conversations", json={"provider": "demo"}, headers=browser(relay, relay.base)
    )
    assert response.status_code == 201


def test_cookie_post_foreign_origin_403(anon: httpx.Client, relay: LiveRelay) -> None:
    answers = [
        anon.post("/api/conversations", json={"provider": "demo"}, headers=browser(relay, origin))
        for origin in (EVIL, "null", f"http://127.0.0.1:{relay.settings.port + 1}")
    ]
    assert [(r.status_code, r.json()) for r in answers] == [(403, CROSS_ORIGIN)] * 3
    listed = relay.http.get("/api/conversations").json()
    assert (listed["conversations"], listed["next"]) == ([], None)


def test_cookie_change_without_origin_403(anon: httpx.Client, relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    created = anon.post("/api/conversations", json={"provider": "demo"}, headers=browser(relay))
    renamed = anon.patch(f"/api/conversations/{cid}", json={"title": "x"}, headers=browser(relay))
    assert [(r.status_code, r.json()) for r in (created, renamed)] == [(403, NO_ORIGIN)] * 2
    assert [c["title"] for c in relay.http.get("/api/conversations").json()["conversations"]] == [
        "New conversation"
    ]


def test_bearer_post_without_origin_201(relay: LiveRelay) -> None:
    plain = relay.http.post("/api/conversations", json={"provider": "demo"})
    charset = relay.http.post(
        "/api/conversations",
        content=b'{"provider": "demo"}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert [plain.status_code, charset.status_code] == [201, 201]


def test_bearer_post_foreign_origin_403(relay: LiveRelay) -> None:
    response = relay.http.post(
        "/api/conversations", json={"provider": "demo"}, headers={"Origin": EVIL}
    )
    assert (response.status_code, response.json()) == (403, CROSS_ORIGIN)


def test_a_refused_origin_is_logged_once_with_what_to_set(
    relay: LiveRelay, caplog: pytest.LogCaptureFixture
) -> None:
    # A self-hoster's review: behind a TLS proxy without OARLOCK_TRUSTED_PROXIES every request
    # was refused and the log said only "403 Forbidden".
    proxied = f"https://127.0.0.1:{relay.settings.port}"  # the page's own host, through TLS
    with caplog.at_level(logging.WARNING, logger="app.security"):
        for _ in range(3):
            refused = relay.http.post("/api/conversations", json={}, headers={"Origin": proxied})
            assert (refused.status_code, refused.json()) == (403, CROSS_ORIGIN)
        relay.http.post("/api/conversations", json={}, headers={"Origin": EVIL})
    told = [r.getMessage() for r in caplog.records if r.name == "app.security"]
    assert len(told) == 2, told  # once per origin
    assert f"{proxied!r} (this relay is 'http://127.0.0.1:{relay.settings.port}')" in told[0]
    assert "set OARLOCK_TRUSTED_PROXIES to the proxy's address" in told[0]
    assert "TRUSTED_PROXIES" not in told[1] and "OARLOCK_ALLOWED_ORIGINS" in told[1]


def test_cookie_get_foreign_origin_allowed(anon: httpx.Client, relay: LiveRelay) -> None:
    response = anon.get("/api/conversations", headers=browser(relay, EVIL))
    assert response.status_code == 200


def test_form_like_post_415(anon: httpx.Client, relay: LiveRelay) -> None:
    types = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
    answers = [
        anon.post(
            "/api/conversations",
            content=b'{"provider": "demo"}',
            headers={**browser(relay, relay.base), "Content-Type": content_type},
        )
        for content_type in types
    ]
    assert [(r.status_code, r.json()) for r in answers] == [(415, NOT_JSON)] * 3


def test_text_plain_post_cross_origin_403(anon: httpx.Client, relay: LiveRelay) -> None:
    headers = {**browser(relay, EVIL), "Content-Type": "text/plain"}
    response = anon.post("/api/conversations", content=b'{"provider": "demo"}', headers=headers)
    assert (response.status_code, response.json()) == (403, CROSS_ORIGIN)


def test_bearer_post_without_content_type_415(relay: LiveRelay) -> None:
    response = relay.http.post(
        "/api/conversations",
        content=b'{"provider": "demo"}',
        headers={"Content-Type": ""},
    )
    assert (response.status_code, response.json()) == (415, NOT_JSON)


# -- WebSocket ---------------------------------------------------------------------------


def test_ws_handshake_refused(relay: LiveRelay) -> None:
    refused = [
        browser(relay, EVIL),  # foreign Origin
        {"Origin": relay.base},  # no token
        {"Origin": relay.base, "Cookie": "oarlock_session=nope"},  # unknown session
        {"Origin": relay.base, "Authorization": "Bearer nope"},  # wrong token
        browser(relay),  # cookie without Origin
    ]
    assert [ws_refusal(ws_url(relay), headers) for headers in refused] == [
        (403, CROSS_ORIGIN),
        (401, UNAUTHORIZED),
        (401, UNAUTHORIZED),
        (401, UNAUTHORIZED),
        (403, NO_ORIGIN),
    ]


# -- Host (DNS rebinding) ----------------------------------------------------------------


def test_rebinding_host_403(relay: LiveRelay) -> None:
    hosts = ["evil.example", f"evil.example:{relay.settings.port}"]
    answers = [
        relay.http.get(path, headers={"Host": host})
        for host in hosts
        for path in ("/api/conversations", "/healthz", "/")
    ]
    assert [(r.status_code, r.json()) for r in answers] == [
        (403, {"detail": f"Host {host!r} is not allowed; add it to OARLOCK_ALLOWED_HOSTS."})
        for host in hosts
        for _ in range(3)
    ]


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("Relay.Example:", "Relay.Example"),
        # Found by a hostile review: these passed as a loopback name (a browser cannot send
        # them; a script or proxy could).
        ("[::1]x:8000", ""),
        ("127.0.0.1:8000, evil.example", ""),
        ("127.0.0.1:80:80", ""),
        ("::1", ""),
        ("", ""),
    ],
)
def test_the_name_of_a_host_header(header: str, name: str) -> None:
    assert host_name(header) == name


def test_a_host_header_that_is_not_one_host_is_refused(relay: LiveRelay) -> None:
    host = f"127.0.0.1:{relay.settings.port}, evil.example"
    status, body = raw_request(relay, ["GET /api/conversations HTTP/1.1", f"Host: {host}"])
    assert (status, body) == (
        403,
        {"detail": f"Host {host!r} is not allowed; add it to OARLOCK_ALLOWED_HOSTS."},
    )


def test_localhost_host_allowed(relay: LiveRelay) -> None:
    host = f"localhost:{relay.settings.port}"
    assert relay.http.get("/api/conversations", headers={"Host": host}).status_code == 200


def test_rebinding_host_ws_refused(relay: LiveRelay) -> None:
    port = relay.settings.port
    evil = f"http://evil.example:{port}"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        status, body = ws_refusal(f"ws://evil.example:{port}/ws", browser(relay, evil), sock=sock)
    assert (status, body) == (
        403,
        {"detail": f"Host 'evil.example:{port}' is not allowed; add it to OARLOCK_ALLOWED_HOSTS."},
    )


def raw_request(relay: LiveRelay, lines: list[str], body: str = "") -> tuple[int, Any]:
    """Send a request head exactly as written (repeated headers kept); its status and JSON."""
    head = "\r\n".join([*lines, "Connection: close", "", body]).encode()
    with socket.create_connection(("127.0.0.1", relay.settings.port), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_repeated_host_origin_or_token_header_is_a_400(relay: LiveRelay) -> None:
    # Found in review: the checks read the last copy, the app the first; now neither is read.
    own = f"127.0.0.1:{relay.settings.port}"
    bearer = f"Authorization: Bearer {TOKEN}"
    cases = {
        "Host": ["GET /api/conversations HTTP/1.1", "Host: evil.example", f"Host: {own}", bearer],
        "Origin": [
            "POST /api/conversations HTTP/1.1",
            f"Host: {own}",
            "Origin: http://evil.example",
            f"Origin: http://{own}",
            bearer,
            "Content-Type: application/json",
            "Content-Length: 2",
        ],
        "Authorization": [
            "GET /api/conversations HTTP/1.1",
            f"Host: {own}",
            "Authorization: Bearer wrong",
            bearer,
        ],
        "Cookie": ["GET /api/conversations HTTP/1.1", f"Host: {own}", "Cookie: a=1", "Cookie: b=2"],
    }
    answers = {name: raw_request(relay, lines, "{}") for name, lines in cases.items()}
    assert answers == {
        name: (400, {"detail": f"The {name} header is repeated; send it once."}) for name in cases
    }
    assert relay.http.get("/api/conversations").json()["conversations"] == []
    # Each once: the same requests pass.
    status, body = raw_request(relay, ["GET /api/conversations HTTP/1.1", f"Host: {own}", bearer])
    assert (status, body["conversations"]) == (200, [])


# -- headers -----------------------------------------------------------------------------


def test_security_headers(relay: LiveRelay) -> None:
    paths = ["/api/conversations", "/login", "/api/conversations/9", "/"]
    answers = [relay.http.get(path) for path in paths]
    csps = [r.headers["content-security-policy"] for r in answers]
    assert [r.status_code for r in answers] == [200, 200, 404, 200]
    assert [("script-src 'self'" in csp, "unsafe-inline" in csp) for csp in csps] == [
        (True, False)
    ] * 4
    assert [
        (
            r.headers["x-content-type-options"],
            r.headers["x-frame-options"],
            r.headers["referrer-policy"],
        )
        for r in answers
    ] == [("nosniff", "DENY", "same-origin")] * 4


def test_nothing_but_the_static_files_is_kept_in_a_cache(relay: LiveRelay) -> None:
    # Conversations and the token's page on a shared computer's disk (a hostile review); the
    # static files are kept and revalidated (an upgrade never mixes old modules).
    cid = relay.create()["id"]
    image = relay.attach(cid, png())
    paths = ["/", "/c/1", "/login", "/api/conversations", "/api/conversations/9", "/healthz"]
    paths.append(f"/api/attachments/{image}")  # a screenshot too
    answers = [relay.http.get(path).headers.get("cache-control") for path in paths]
    assert answers == ["no-store"] * len(paths)
    assert relay.http.get("/static/app.js").headers["cache-control"] == "no-cache"


def test_security_headers_on_refusal(anon: httpx.Client) -> None:
    response = anon.get("/api/conversations")
    assert (
        response.status_code,
        response.headers["x-frame-options"],
        response.headers["x-content-type-options"],
        "frame-ancestors 'none'" in response.headers["content-security-policy"],
        response.headers["cache-control"],
    ) == (401, "DENY", "nosniff", True, "no-store")


# -- token file and CLI ------------------------------------------------------------------


def test_token_file_created_0600(tmp_path: Path) -> None:
    token = load_or_create_token(None, tmp_path / "data")
    path = tmp_path / "data" / "token"
    assert (stat.S_IMODE(path.stat().st_mode), path.read_text(), len(token)) == (
        0o600,
        token + "\n",
        43,
    )


def test_token_file_reused(tmp_path: Path) -> None:
    first = load_or_create_token(None, tmp_path)
    assert load_or_create_token(None, tmp_path) == first


def test_token_file_empty_regenerated(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    token = load_or_create_token(None, tmp_path)
    assert ((tmp_path / "token").read_text(), len(token)) == (token + "\n", 43)


def test_token_configured_wins(tmp_path: Path) -> None:
    assert (load_or_create_token("mine", tmp_path), (tmp_path / "token").exists()) == (
        "mine",
        False,
    )


def test_token_differs_between_data_dirs(tmp_path: Path) -> None:
    assert load_or_create_token(None, tmp_path / "a") != load_or_create_token(None, tmp_path / "b")


def refused_serve(tmp_path: Path, host: str, **env: str) -> tuple[int, str]:
    """`serve --host host` with env added: its exit status and what it printed on stderr."""
    command = [sys.executable, "-m", "app", "serve", "--host", host]
    command += ["--port", str(free_port()), "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(
        command, cwd=ROOT, env=os.environ | env, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "127.evil.example"])
def test_serve_refuses_no_auth_beyond_this_machine(tmp_path: Path, host: str) -> None:
    # 127.evil.example: a name, not 127.0.0.0/8; it resolves where its owner wants (a hostile
    # review: it passed as loopback, so the relay listened there without a token).
    assert refused_serve(tmp_path, host, OARLOCK_NO_AUTH="1") == (
        1,
        f"Refusing to listen on {host} without a token: agents run shell commands.\n"
        "Unset OARLOCK_NO_AUTH (a token is generated for you) or listen on 127.0.0.1.\n",
    )


def test_serve_refuses_a_short_token(tmp_path: Path) -> None:
    # A hostile review: OARLOCK_TOKEN=1 was accepted, on 0.0.0.0 too.
    assert refused_serve(tmp_path, "0.0.0.0", OARLOCK_TOKEN="1") == (
        1,
        "OARLOCK_TOKEN is 1 characters: use at least 16, or unset it (a token is generated for "
        "you).\n",
    )


def test_only_loopback_addresses_and_localhost_are_loopback() -> None:
    assert [is_loopback(h) for h in ("localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]")] == [
        True
    ] * 5
    others = ("127.evil.example", "127.0.0.1.nip.io", "0.0.0.0", "::", "10.0.0.1", "localhost.")
    assert [is_loopback(h) for h in others] == [False] * len(others)


def test_token_error_takes_16_characters_and_up() -> None:
    assert token_error(None) is None
    assert token_error("x" * 16) is None
    assert token_error("x" * 15) == (
        "OARLOCK_TOKEN is 15 characters: use at least 16, or unset it (a token is generated for "
        "you)."
    )


def test_a_token_an_authorization_header_could_not_carry_is_refused() -> None:
    # A review: a space at an end (an env file's) or a non-ASCII letter logged in by the URL,
    # never through the API's Bearer header.
    for token in (
        " lead-space-token-1234567",
        "trailing-space-token-1234 ",
        "äöü-token-0123456789",
    ):
        assert (token_error(token) or "").startswith("OARLOCK_TOKEN must be printable ASCII")
    assert token_error("inner space token 0123456789+/=") is None


def test_allowed_hosts_given_with_a_port_or_brackets_are_answered(tmp_path: Path) -> None:
    # A review: "oar.example.com:8443" (as the README allowed) and "[fd00::1]" were taken at
    # start, then every request was refused: the Host header's name was compared with them.
    hosts = ["oar.example.com:8443", "[fd00::1]"]
    relay = LiveRelay(make_settings(tmp_path / "data", allowed_hosts=hosts)).start()
    try:
        answers = [
            relay.http.get("/api/conversations", headers={"Host": host}).status_code
            for host in ("oar.example.com:8443", "oar.example.com", "[fd00::1]:8000")
        ]
    finally:
        relay.stop()
    assert answers == [200, 200, 200]


def test_cookie_is_secure_behind_tls(tmp_path: Path) -> None:
    # A TLS proxy on this machine, named in OARLOCK_TRUSTED_PROXIES, says so with X-Forwarded-Proto.
    relay = LiveRelay(make_settings(tmp_path / "data", trusted_proxies=["127.0.0.1"])).start()
    try:
        with httpx.Client(base_url=relay.base, timeout=10) as client:
            response = client.get(f"/?token={TOKEN}", headers={"X-Forwarded-Proto": "https"})
    finally:
        relay.stop()
    [cookie] = response.headers.get_list("set-cookie")
    assert (SET_COOKIE.match(cookie) is not None, cookie.endswith("; Secure")) == (True, True)


def test_token_is_compared_in_constant_time(
    anon: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert (
        anon.get("/api/conversations", headers={"Authorization": "Bearer guess"}).status_code == 401
    )
    assert (
        anon.get("/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"}).status_code
        == 200
    )
    assert compared == [(b"guess", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


def test_head_is_answered_as_get_without_the_body(relay: LiveRelay, anon: httpx.Client) -> None:
    # Uptime monitors and `curl -I` ask with HEAD; FastAPI's routes answered it 405.
    for path in ("/healthz", "/login", "/api/conversations", "/static/app.js", "/"):
        got, asked = relay.http.get(path), relay.http.head(path)
        assert (asked.status_code, asked.content) == (got.status_code, b""), path
        assert asked.headers["content-length"] == got.headers["content-length"], path
    # Checked as the GET is: no token, the API's 401 and a page's way to the login form.
    assert anon.head("/api/conversations").status_code == 401
    page = anon.head("/")
    assert (page.status_code, page.headers["location"]) == (303, "/login")
    assert relay.http.head("/api/nothing").status_code == 404

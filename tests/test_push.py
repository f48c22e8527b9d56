"""Notify (SPEC §9): Web Push subscriptions, which endpoints, real pushes to a fake service."""

from __future__ import annotations

import base64
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from py_vapid import Vapid02
from sqlmodel import select
from websockets.sync.client import ClientConnection, connect

from app.db import get_session
from app.models import PushSubscription
from app.notify import payload, question_kind
from app.push import (
    PUSH_SERVICES,
    application_server_key,
    audience,
    endpoint_problem,
    key_problem,
    load_or_create_vapid,
    vapid_from_token,
)
from tests.fake_push import FakeBrowser, PushLog, push_service
from tests.relay import LiveRelay, make_settings, receive_until

FCM = "https://fcm.googleapis.com/fcm/send/abc:def"


def allowed(url: str, *, services: tuple[str, ...] = PUSH_SERVICES, loopback: bool = False) -> bool:
    return endpoint_problem(url, services=services, loopback_http=loopback) is None


# -- the endpoint rule (pure) ---------------------------------------------------------------------


def test_endpoint_rule_allows_known_push_services_over_https() -> None:
    assert allowed(FCM)
    assert allowed("https://updates.push.services.mozilla.com/wpush/v2/gAAA")
    assert allowed("https://wns2-by3p.notify.windows.com/w/?token=x")
    assert allowed("https://web.push.apple.com/QGx")
    assert allowed("https://fcm.googleapis.com:443/fcm/send/x")


@pytest.mark.parametrize(
    "url",
    [
        "http://fcm.googleapis.com/fcm/send/x",  # not https
        "https://fcm.googleapis.com:8443/fcm/send/x",  # another port
        "https://example.com/push",  # not a push service
        "https://fcm.googleapis.com.evil.example/x",  # a lookalike suffix
        "https://evilfcm.googleapis.com/x",  # not a subdomain: no dot before the name
        "https://user@fcm.googleapis.com/x",  # credentials in the URL
        "https://10.0.0.1/x",
        "http://127.0.0.1:9/x",  # loopback needs OARLOCK_PUSH_LOOPBACK_HTTP
        "file:///etc/passwd",
        "https://[::1/x",  # not a URL
        "https://fcm.googleapis.com/" + "x" * 2100,
        "https://a\t.fcm.googleapis.com/x",  # urlsplit drops the tab; httpx refuses it
        "https://fcm.googleapis.com/x\n",
        "https://fcm.googleapis.com/x\x7f",
    ],
)
def test_endpoint_rule_refuses_other_urls(url: str) -> None:
    assert not allowed(url)


def test_endpoint_rule_loopback_http_only_when_allowed_and_only_loopback() -> None:
    assert allowed("http://127.0.0.1:8123/push/a", loopback=True)
    assert allowed("http://localhost:8123/push/a", loopback=True)
    # Found by a hostile review: accepted, then never sent (a VAPID audience names no IPv6).
    assert not allowed("http://[::1]:8123/push/a", loopback=True)
    assert not allowed("http://192.168.1.2:8123/push/a", loopback=True)
    assert not allowed("http://example.com/push/a", loopback=True)


def test_the_audience_is_the_endpoint_s_origin_as_a_browser_writes_it() -> None:
    # Found by a hostile review: the endpoint's host and port went in as written.
    assert audience(FCM) == "https://fcm.googleapis.com"
    assert audience("HTTPS://FCM.GoogleAPIs.com:0443/x") == "https://fcm.googleapis.com"
    assert audience("http://127.0.0.1:8123/push/a") == "http://127.0.0.1:8123"
    assert audience("http://localhost:80/push/a") == "http://localhost"


def test_endpoint_rule_takes_extra_services() -> None:
    services = (*PUSH_SERVICES, "push.example.org")
    assert allowed("https://push.example.org/x", services=services)
    assert allowed("https://eu.push.example.org/x", services=services)
    assert not allowed("https://push.example.org/x")


def test_key_rule() -> None:
    browser = FakeBrowser(FCM).subscription()["keys"]
    assert key_problem(browser["p256dh"], browser["auth"]) is None
    assert key_problem("AAAA", browser["auth"]) is not None  # not a point on P-256
    assert key_problem(browser["p256dh"], "AAAA") is not None  # not 16 bytes
    assert key_problem("not base64!", browser["auth"]) is not None


def test_vapid_key_is_created_private_and_kept(tmp_path: Path) -> None:
    first = load_or_create_vapid(tmp_path)
    path = tmp_path / "vapid_private.pem"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    again = load_or_create_vapid(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert again.private_pem() == first.private_pem()


def test_a_cluster_vapid_key_comes_from_the_token() -> None:
    """The same on every node with the token, another with another token; it signs."""
    key = application_server_key(vapid_from_token("token-one-0123456789"))
    assert application_server_key(vapid_from_token("token-one-0123456789")) == key
    assert application_server_key(vapid_from_token("token-two-0123456789")) != key
    vapid = vapid_from_token("token-one-0123456789")
    headers = vapid.sign({"aud": "https://push.example", "sub": "mailto:a@example.org"})
    assert Vapid02.verify(headers["Authorization"])
    assert headers["Authorization"].split("k=")[1] == key


# -- a relay and a fake push service ---------------------------------------------------------------


@pytest.fixture
def service() -> Iterator[tuple[PushLog, str]]:
    log = PushLog()
    with push_service(log) as server:
        yield log, server.base_url


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveRelay]:
    with LiveRelay(make_settings(tmp_path / "data", push_loopback_http=True)) as relay:
        yield relay


def browser_client(relay: LiveRelay, cookie: str | None = None) -> httpx.Client:
    """A logged-in browser's HTTP client: its session cookie and the relay's Origin."""
    headers = {"Cookie": cookie or relay.login(), "Origin": relay.base}
    return httpx.Client(base_url=relay.base, headers=headers, timeout=30)


def subscribe(client: httpx.Client, browser: FakeBrowser) -> None:
    response = client.post("/api/push/subscriptions", json=browser.subscription())
    assert response.status_code == 201, response.text


def stored(relay: LiveRelay) -> list[str]:
    with get_session(relay.app.state.engine) as session:
        rows = session.exec(select(PushSubscription).order_by(PushSubscription.id)).all()  # type: ignore[arg-type]
    return [row.endpoint for row in rows]


def page_socket(relay: LiveRelay, cookie: str) -> ClientConnection:
    """A page's socket, logged in with a given browser's cookie."""
    headers = {"Cookie": cookie, "Origin": relay.base}
    url = f"ws://127.0.0.1:{relay.settings.port}/ws"
    return connect(url, additional_headers=headers, open_timeout=10)


def claims(authorization: str) -> dict[str, Any]:
    token = authorization.split("t=")[1].split(",")[0]
    body = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def test_key_endpoint_gives_the_relays_vapid_key(live: LiveRelay) -> None:
    response = live.http.get("/api/push/key")
    assert response.status_code == 200
    key = load_or_create_vapid(live.settings.resolved_data_dir)
    raw = base64.urlsafe_b64decode(response.json()["public_key"] + "==")
    assert len(raw) == 65 and raw[0] == 4
    assert response.json()["public_key"] == live.app.state.notifier.public_key
    assert key.private_pem() == live.app.state.notifier.vapid.private_pem()


def test_subscribe_stores_once_per_endpoint(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    _log, base = service
    browser = FakeBrowser(f"{base}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
        subscribe(client, browser)  # a page load re-sends it
    assert stored(live) == [f"{base}/push/a"]


def test_subscribe_goes_through_auth_and_origin_checks(
    live: LiveRelay, service: tuple[PushLog, str]
) -> None:
    body = FakeBrowser(f"{service[1]}/push/a").subscription()
    with httpx.Client(base_url=live.base, timeout=30) as anonymous:
        assert anonymous.post("/api/push/subscriptions", json=body).status_code == 401
    cookie = live.login()
    with httpx.Client(base_url=live.base, headers={"Cookie": cookie}, timeout=30) as no_origin:
        assert no_origin.post("/api/push/subscriptions", json=body).status_code == 403
    foreign = {"Cookie": cookie, "Origin": "https://evil.example"}
    with httpx.Client(base_url=live.base, headers=foreign, timeout=30) as other_site:
        assert other_site.post("/api/push/subscriptions", json=body).status_code == 403
    # A bearer token is no browser: a subscription belongs to a login session.
    response = live.http.post("/api/push/subscriptions", json=body)
    assert response.status_code == 403
    assert "logged-in browser" in response.json()["detail"]
    assert stored(live) == []


@pytest.mark.parametrize(
    ("endpoint", "keys", "detail"),
    [
        ("https://example.com/push", None, "known push service"),
        ("http://10.1.2.3/push", None, "known push service"),
        (None, {"p256dh": "AAAA", "auth": "AAAAAAAAAAAAAAAAAAAAAA"}, "P-256"),
    ],
)
def test_subscribe_refuses_bad_endpoints_and_keys(
    live: LiveRelay,
    service: tuple[PushLog, str],
    endpoint: str | None,
    keys: dict[str, str] | None,
    detail: str,
) -> None:
    body = FakeBrowser(endpoint or f"{service[1]}/push/a").subscription()
    if keys:
        body["keys"] = keys
    with browser_client(live) as client:
        response = client.post("/api/push/subscriptions", json=body)
    assert response.status_code == 422
    assert detail in response.json()["detail"]
    assert stored(live) == []


def test_loopback_endpoint_refused_without_the_setting(relay: LiveRelay) -> None:
    body = FakeBrowser("http://127.0.0.1:9/push/a").subscription()
    with browser_client(relay) as client:
        response = client.post("/api/push/subscriptions", json=body)
    assert response.status_code == 422
    assert stored(relay) == []


def test_unsubscribe_forgets(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    browser = FakeBrowser(f"{service[1]}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
        response = client.request(
            "DELETE", "/api/push/subscriptions", json={"endpoint": browser.endpoint}
        )
    assert response.status_code == 204
    assert stored(live) == []


def test_logout_ends_the_subscription(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    browser = FakeBrowser(f"{service[1]}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
        assert client.post("/logout").status_code == 303
    assert stored(live) == []


# -- real pushes ---------------------------------------------------------------------------------


def test_turn_end_pushes_title_and_line_encrypted_and_signed(
    live: LiveRelay, service: tuple[PushLog, str]
) -> None:
    log, base = service
    browser = FakeBrowser(f"{base}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
    conversation = live.create(title="Fix the parser")
    assert live.send(conversation["id"], "hello there").status_code == 202
    [push] = log.wait("/push/a")
    assert browser.decrypt(push) == {
        "kind": "turn",
        "conversation_id": conversation["id"],
        "title": "Fix the parser",
        "body": "Turn finished",
        "url": f"/c/{conversation['id']}",
    }
    # Signed with the relay's VAPID key, for this push service's origin (RFC 8292).
    authorization = push.headers["authorization"]
    assert authorization.startswith("vapid t=")
    assert authorization.split("k=")[1] == live.app.state.notifier.public_key
    assert Vapid02.verify(authorization)
    assert claims(authorization)["aud"] == base  # scheme://host:port of the endpoint
    assert int(push.headers["ttl"]) > 0


def test_permission_question_pushes(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    log, base = service
    browser = FakeBrowser(f"{base}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
    conversation = live.create(title="Deploy", permission_mode="default")
    cid = conversation["id"]
    live.send(cid, "please ask permission")
    [push] = log.wait("/push/a")
    assert browser.decrypt(push)["body"] == "Permission asked"
    assert browser.decrypt(push)["title"] == "Deploy"
    view = live.wait_for(cid, lambda v: any(e["state"] == "pending" for e in v["timeline"]))
    pending = next(e for e in view["timeline"] if e["state"] == "pending")
    answer = live.http.post(
        f"/api/conversations/{cid}/permissions/{pending['id']}", json={"allow": True}
    )
    assert answer.status_code == 200
    later = log.wait("/push/a", 2)
    assert browser.decrypt(later[1])["body"] == "Turn finished"


def test_gone_subscription_is_removed(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    log, base = service
    log.status["/push/gone"] = 410
    log.status["/push/lost"] = 404
    with browser_client(live) as client:
        for name in ("gone", "lost", "kept"):
            subscribe(client, FakeBrowser(f"{base}/push/{name}"))
    conversation = live.create()
    live.send(conversation["id"], "hello")
    log.wait("/push/kept")  # sent after the others (in the order they subscribed)
    assert len(log.to("/push/gone")) == 1 and len(log.to("/push/lost")) == 1
    assert stored(live) == [f"{base}/push/kept"]


@pytest.mark.parametrize(
    ("column", "value"),
    [
        # An endpoint httpx cannot send to (one with a tab: the API took it before): skipped.
        ("endpoint", "http://127.0.0.1\t/push/first"),
        # A key no push can be encrypted for (stored by hand): the send fails, the next goes.
        ("p256dh", "not-a-key"),
    ],
)
def test_a_bad_stored_subscription_stops_no_other_push(
    live: LiveRelay, service: tuple[PushLog, str], column: str, value: str
) -> None:
    """The subscriptions after a bad one still get their push (before: none did, ever)."""
    log, base = service
    with browser_client(live) as client:
        subscribe(client, FakeBrowser(f"{base}/push/first"))
        subscribe(client, FakeBrowser(f"{base}/push/after"))
    with get_session(live.app.state.engine) as session:
        first = session.exec(select(PushSubscription).order_by(PushSubscription.id)).first()  # type: ignore[arg-type]
        assert first is not None
        setattr(first, column, value)
        session.add(first)
        session.commit()
    conversation = live.create()
    live.send(conversation["id"], "hello")
    log.wait("/push/after")
    assert log.to("/push/first") == []


def test_redirect_is_not_followed(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    log, base = service
    log.status["/push/moved"] = 307
    log.location["/push/moved"] = f"{base}/push/elsewhere"
    with browser_client(live) as client:
        subscribe(client, FakeBrowser(f"{base}/push/moved"))
        subscribe(client, FakeBrowser(f"{base}/push/after"))
    conversation = live.create()
    live.send(conversation["id"], "hello")
    log.wait("/push/after")
    assert len(log.to("/push/moved")) == 1
    assert log.to("/push/elsewhere") == []
    assert len(stored(live)) == 2  # a redirect is not "gone"


def test_no_push_to_a_browser_with_a_visible_page(
    live: LiveRelay, service: tuple[PushLog, str]
) -> None:
    log, base = service
    cookie = live.login()
    looking = FakeBrowser(f"{base}/push/looking")
    away = FakeBrowser(f"{base}/push/away")
    with browser_client(live, cookie) as client:
        subscribe(client, looking)  # first: its push, if any, would go before away's
    with browser_client(live) as client:
        subscribe(client, away)
    conversation = live.create()
    cid = conversation["id"]
    with page_socket(live, cookie) as ws:  # the looking browser's page
        ws.send(json.dumps({"type": "presence", "visible": True}))
        receive_until(ws, lambda m: m["type"] == "presence")
        live.send(cid, "one")
        receive_until(ws, lambda m: m["type"] == "notify" and m["conversation_id"] == cid)
        log.wait("/push/away")
        assert log.to("/push/looking") == []
        # The page is hidden (another tab in front, the phone locked): its browser gets pushes.
        ws.send(json.dumps({"type": "presence", "visible": False}))
        receive_until(ws, lambda m: m["type"] == "presence")
        live.send(cid, "two")
        [push] = log.wait("/push/looking")
        assert looking.decrypt(push)["body"] == "Turn finished"


def test_open_pages_get_notify_events(live: LiveRelay) -> None:
    conversation = live.create(title="Watched")
    with live.socket() as ws:
        live.send(conversation["id"], "hello")
        seen = receive_until(ws, lambda m: m["type"] == "notify")
    assert seen[-1] == {
        "type": "notify",
        "kind": "turn",
        "conversation_id": conversation["id"],
        "title": "Watched",
        "body": "Turn finished",
        "url": f"/c/{conversation['id']}",
    }


def test_long_title_is_cut_to_a_line(live: LiveRelay, service: tuple[PushLog, str]) -> None:
    log, base = service
    browser = FakeBrowser(f"{base}/push/a")
    with browser_client(live) as client:
        subscribe(client, browser)
    conversation = live.create(title="x" * 150)
    live.send(conversation["id"], "hello")
    [push] = log.wait("/push/a")
    assert browser.decrypt(push)["title"] == "x" * 79 + "…"


def test_static_service_worker_and_manifest(relay: LiveRelay) -> None:
    with httpx.Client(base_url=relay.base, timeout=30) as anonymous:
        worker = anonymous.get("/static/sw.js")
        manifest = anonymous.get("/static/manifest.webmanifest")
    assert worker.status_code == 200
    assert worker.headers["content-type"].startswith("text/javascript")
    assert worker.headers["service-worker-allowed"] == "/"
    assert "default-src 'self'" in worker.headers["content-security-policy"]
    assert manifest.status_code == 200
    assert manifest.headers["content-type"] == "application/manifest+json"
    assert manifest.json()["start_url"] == "/"
    with httpx.Client(base_url=relay.base, timeout=30) as anonymous:
        assert "service-worker-allowed" not in anonymous.get("/static/app.js").headers


def test_a_new_token_stops_pushes_to_old_subscriptions(
    tmp_path: Path, service: tuple[PushLog, str]
) -> None:
    log, base = service
    first = LiveRelay(make_settings(tmp_path / "data", push_loopback_http=True)).start()
    try:
        with browser_client(first) as client:
            subscribe(client, FakeBrowser(f"{base}/push/old"))
    finally:
        first.stop()
    token = "a-new-token-9876543210"
    settings = make_settings(tmp_path / "data", push_loopback_http=True, token=token)
    second = LiveRelay(settings).start()
    try:
        with httpx.Client(base_url=second.base, timeout=30) as anonymous:
            login = anonymous.get(f"/?token={token}")
        cookie = login.headers["set-cookie"].split(";")[0]
        with browser_client(second, cookie) as client:
            subscribe(client, FakeBrowser(f"{base}/push/new"))  # sent after old's, if that were
        conversation = second.http.post(
            "/api/conversations",
            json={"provider": "demo"},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        second.http.post(
            f"/api/conversations/{conversation['id']}/messages",
            json={"text": "hello"},
            headers={"Authorization": f"Bearer {token}"},
        )
        log.wait("/push/new")
        assert log.to("/push/old") == []
    finally:
        second.stop()


def test_subscriptions_are_bounded(
    live: LiveRelay, service: tuple[PushLog, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.routes.push.MAX_SUBSCRIPTIONS", 2)  # 200 in use: the same check
    base = service[1]
    with browser_client(live) as client:
        subscribe(client, FakeBrowser(f"{base}/push/1"))
        subscribe(client, FakeBrowser(f"{base}/push/2"))
        response = client.post(
            "/api/push/subscriptions", json=FakeBrowser(f"{base}/push/3").subscription()
        )
        assert response.status_code == 409
        assert "push subscriptions already" in response.json()["detail"]
        subscribe(client, FakeBrowser(f"{base}/push/2"))  # an existing one is still updated
    assert stored(live) == [f"{base}/push/1", f"{base}/push/2"]


def test_shutdown_cutting_a_turn_pushes_nothing(
    tmp_path: Path, service: tuple[PushLog, str]
) -> None:
    log, base = service
    relay = LiveRelay(make_settings(tmp_path / "data", push_loopback_http=True)).start()
    try:
        with browser_client(relay) as client:
            subscribe(client, FakeBrowser(f"{base}/push/a"))
        conversation = relay.create()
        relay.send(conversation["id"], "slow please")
        relay.wait_for(conversation["id"], lambda view: view["turn"]["state"] == "running")
    finally:
        relay.stop()  # interrupts the turn, and waits for the pushes under way
    assert log.to("/push/a") == []


def test_the_agent_s_own_question_is_told_as_a_question() -> None:
    def pending(tool: str, state: str = "pending") -> dict[str, Any]:
        data = {"type": "permission", "tool": tool}
        return {"type": "entry", "entry": {"state": state, "data": data}}

    assert question_kind(pending("Bash")) == "permission"
    assert question_kind(pending("AskUserQuestion")) == "question"
    assert question_kind(pending("Bash", "allowed")) is None
    assert question_kind({"type": "turn"}) is None
    assert payload("question", 3, "Plan")["body"] == "Question asked"

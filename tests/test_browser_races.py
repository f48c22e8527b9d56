"""Races between the page's HTTP answers and the socket's events, made deterministic.

Playwright holds an answer the relay already computed (route.fetch) until the socket has told
the page something newer, then delivers it: the stale answer must not undo the newer event.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from playwright.sync_api import Locator, Page, Request, Route, WebSocket, WebSocketRoute, expect

from tests.browser import Pages, T, by_id, item_menu
from tests.relay import LiveRelay, receive, receive_until


class Held:
    """Requests matching pattern: answered by the relay at once, given to the page on release."""

    def __init__(self, page: Page, pattern: re.Pattern[str]) -> None:
        self.page = page
        self.pattern = pattern
        self.waiting: list[tuple[Route, Any]] = []
        page.route(pattern, self._hold)

    def _hold(self, route: Route) -> None:
        self.waiting.append((route, route.fetch()))  # computed now, delivered later

    def release(self) -> None:
        """Deliver what was held and let later requests through."""
        for route, response in self.waiting:
            route.fulfill(response=response)
        self.waiting.clear()
        self.page.unroute(self.pattern, self._hold)


class Frames:
    """Every event the page's sockets receive, decoded."""

    def __init__(self, page: Page) -> None:
        self.events: list[dict[str, Any]] = []
        page.on("websocket", self._watch)

    def _watch(self, ws: WebSocket) -> None:
        ws.on("framereceived", self._received)

    def _received(self, payload: str | bytes) -> None:
        message = json.loads(payload)
        self.events.extend(message if isinstance(message, list) else [message])

    def seen(self, predicate: Callable[[dict[str, Any]], Any]) -> bool:
        return any(predicate(e) for e in self.events)

    def running(self, cid: int, running: bool) -> bool:
        """True once the global feed told the page that cid is running (or, after that, not)."""
        states = [
            (e.get("conversation") or {}).get("running")
            for e in self.events
            if e.get("type") == "conversation"
            and e.get("seq") is None
            and (e.get("conversation") or {}).get("id") == cid
        ]
        began = states.index(True) if True in states else None
        if running:
            return began is not None
        return began is not None and False in states[began:]


def wait_until(page: Page, condition: Callable[[], Any]) -> None:
    """Poll condition, letting Playwright deliver events (route and socket callbacks) meanwhile."""
    deadline = time.monotonic() + T / 1000
    while not condition():
        assert time.monotonic() < deadline, "the condition was never met"
        page.wait_for_timeout(20)


def after_next_draw(page: Page) -> None:
    """Return once the page drew its next animation frame (the sidebar draws in one)."""
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def sidebar_running(page: Page, title: str) -> Any:
    """The item's busy marker: "running", or "needs you" while its turn asks (these races hold
    a turn with a question)."""
    item = page.locator(".conv-item").filter(has=page.get_by_text(title, exact=True))
    return item.locator('[data-testid="conv-running"], [data-testid="conv-waiting"]')


def pending_question(relay: LiveRelay, cid: int) -> int:
    """The id of the conversation's unanswered permission question."""

    def question(view: dict[str, Any]) -> Any:
        return next(
            (
                e["id"]
                for e in view["timeline"]
                if e["data"].get("type") == "permission" and e["state"] == "pending"
            ),
            None,
        )

    return question(relay.wait_for(cid, lambda v: question(v) is not None))


def test_a_list_answered_before_a_turn_began_keeps_the_running_marker(
    pages: Pages, relay: LiveRelay
) -> None:
    busy = relay.create(title="Busy")["id"]
    other = relay.create(title="Other")["id"]
    page = pages.open(relay, f"/c/{other}")
    expect(by_id(page, "title")).to_have_text("Other")
    frames = Frames(page)
    listing = Held(page, re.compile(r"/api/conversations\?status=active"))
    page.reload()
    wait_until(page, lambda: listing.waiting)  # answered: Busy is not running
    wait_until(page, lambda: frames.seen(lambda e: e.get("type") == "hello"))
    assert relay.send(busy, "ask permission").status_code == 202
    wait_until(page, lambda: frames.running(busy, True))
    listing.release()
    # Drawn from the state after the list was applied (the broadcast alone knew only Busy).
    other_item = page.locator(".conv-item").filter(has=page.get_by_text("Other", exact=True))
    expect(other_item).to_be_visible()
    expect(sidebar_running(page, "Busy")).to_be_visible()
    pages.assert_clean()


def test_a_conversation_answered_before_its_turn_ended_does_not_show_it_running(
    pages: Pages, relay: LiveRelay
) -> None:
    busy = relay.create(title="Busy")["id"]
    # A first turn: the agent's process reports its context once, after it (a later sidebar
    # event that would hide the race).
    assert relay.send(busy, "hello").status_code == 202
    relay.wait_idle(busy)
    other = relay.create(title="Other")["id"]
    page = pages.open(relay, f"/c/{other}")
    expect(by_id(page, "title")).to_have_text("Other")
    frames = Frames(page)
    page.reload()
    expect(by_id(page, "title")).to_have_text("Other")
    assert relay.send(busy, "ask permission").status_code == 202
    question = pending_question(relay, busy)
    expect(sidebar_running(page, "Busy")).to_be_visible()
    opening = Held(page, re.compile(rf"/api/conversations/{busy}$"))
    by_id(page, "conversation-item").filter(has_text="Busy").click()
    wait_until(page, lambda: opening.waiting)  # answered: the turn runs
    answer = relay.http.post(
        f"/api/conversations/{busy}/permissions/{question}", json={"allow": False}
    )
    assert answer.status_code == 200, answer.text
    wait_until(page, lambda: frames.running(busy, False))
    opening.release()
    expect(by_id(page, "title")).to_have_text("Busy")  # the held answer is applied
    expect(by_id(page, "stop-button")).to_be_hidden()  # and the events after it: the turn ended
    after_next_draw(page)  # the sidebar is drawn on the next animation frame
    expect(sidebar_running(page, "Busy")).to_have_count(0)
    pages.assert_clean()


def test_a_rename_answered_before_a_turn_began_keeps_the_running_marker(
    pages: Pages, relay: LiveRelay
) -> None:
    """The ⋯ menu's answers are held to the same rule as the page's own requests."""
    busy = relay.create(title="Busy")["id"]
    page = pages.open(relay, f"/c/{busy}")
    frames = Frames(page)
    page.reload()  # (a socket opened before Frames is not watched)
    expect(by_id(page, "title")).to_have_text("Busy")
    wait_until(page, lambda: frames.seen(lambda e: e.get("type") == "hello"))
    renaming = Held(page, re.compile(rf"/api/conversations/{busy}$"))
    item_menu(page, "Busy")
    by_id(page, "conv-rename").click()
    by_id(page, "rename-input").fill("Renamed")
    by_id(page, "rename-save").click()
    wait_until(page, lambda: renaming.waiting)  # answered: Renamed, not running
    assert relay.send(busy, "ask permission").status_code == 202
    wait_until(page, lambda: frames.running(busy, True))
    renaming.release()
    expect(by_id(page, "rename-dialog")).to_be_hidden()
    after_next_draw(page)
    expect(sidebar_running(page, "Renamed")).to_be_visible()
    by_id(page, "permission-deny").click()
    expect(sidebar_running(page, "Renamed")).to_have_count(0)
    pages.assert_clean()


# ---- the lists and the socket's hello: events between them ------------------------------------


class Sockets:
    """The page's WebSockets, each joined to the relay when the test says (held), or at once."""

    def __init__(self, page: Page, *, hold: bool) -> None:
        self.hold = hold
        self.routes: list[WebSocketRoute] = []
        self.hellos = 0  # hellos passed to the page
        page.route_web_socket(re.compile(r"/ws$"), self._route)

    def _route(self, route: WebSocketRoute) -> None:
        self.routes.append(route)
        if not self.hold:
            self._join(route)

    def connect(self) -> None:
        """Join the newest socket to the relay: it registers there now, and gets its hello."""
        self._join(self.routes[-1])

    def _join(self, route: WebSocketRoute) -> None:
        def forward(message: str | bytes) -> None:
            decoded = json.loads(message)
            if isinstance(decoded, dict) and decoded.get("type") == "hello":
                self.hellos += 1
            route.send(message)

        route.connect_to_server().on_message(forward)


class ListReads:
    """How many times the page asked for a sidebar list's first page."""

    def __init__(self, page: Page) -> None:
        self.count = 0
        page.on("request", self._seen)

    def _seen(self, request: Request) -> None:
        if re.search(r"/api/conversations\?status=\w+&limit=\d+$", request.url):
            self.count += 1


def broadcast_about(cid: int, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    """Matches the global feed's event about cid with those fields."""

    def match(message: dict[str, Any]) -> bool:
        conv = message.get("conversation") or {}
        return (
            message.get("type") == "conversation"
            and message.get("seq") is None
            and conv.get("id") == cid
            and all(conv.get(key) == value for key, value in fields.items())
        )

    return match


def sidebar_item(page: Page, title: str) -> Locator:
    return page.locator(".conv-item").filter(has=page.get_by_text(title, exact=True))


def test_events_between_the_lists_and_the_socket_reach_the_sidebar(
    pages: Pages, relay: LiveRelay
) -> None:
    """The lists were read, then a turn began and a conversation was made, then the socket came."""
    busy = relay.create(title="Busy")["id"]
    other = relay.create(title="Other")["id"]
    page = pages.open(relay, f"/c/{other}")
    expect(by_id(page, "title")).to_have_text("Other")
    sockets = Sockets(page, hold=True)
    lists = ListReads(page)
    page.reload()
    expect(by_id(page, "title")).to_have_text("Other")  # shown after the lists were applied
    expect(sidebar_item(page, "Busy")).to_be_visible()
    assert lists.count == 2
    wait_until(page, lambda: sockets.routes)  # the page's socket, not yet at the relay
    with relay.socket() as watcher:
        receive(watcher)  # hello
        assert relay.send(busy, "ask permission").status_code == 202  # running until answered
        newcomer = relay.create(title="Newcomer")["id"]
        receive_until(watcher, broadcast_about(busy, running=True))
        receive_until(watcher, broadcast_about(newcomer))  # (made after the turn began)
    sockets.connect()
    expect(sidebar_running(page, "Busy")).to_be_visible()
    expect(sidebar_item(page, "Newcomer")).to_be_visible()
    assert lists.count == 4  # read again, once
    pages.assert_clean()


def test_a_page_load_reads_the_lists_once_when_nothing_happens_in_between(
    pages: Pages, relay: LiveRelay
) -> None:
    other = relay.create(title="Other")["id"]
    page = pages.open(relay, f"/c/{other}")
    expect(by_id(page, "title")).to_have_text("Other")
    lists = ListReads(page)
    sockets = Sockets(page, hold=False)
    for made, hold in (("First", False), ("Second", True)):  # the hello first (usually); last
        sockets.hold = hold
        sockets.routes.clear()
        sockets.hellos = 0
        lists.count = 0
        page.reload()
        expect(by_id(page, "title")).to_have_text("Other")
        if hold:
            wait_until(page, lambda: sockets.routes and lists.count == 2)
            sockets.connect()
        wait_until(page, lambda: sockets.hellos == len(sockets.routes))
        relay.create(title=made)  # on the socket, after its hello: the hello was handled
        expect(sidebar_item(page, made)).to_be_visible()
        after_next_draw(page)
        assert lists.count == 2, made
    pages.assert_clean()


def test_events_while_the_socket_was_away_reach_the_sidebar(pages: Pages, relay: LiveRelay) -> None:
    """A reconnected tab reads the lists after its hello (as before the feed counts)."""
    busy = relay.create(title="Busy")["id"]
    other = relay.create(title="Other")["id"]
    page = pages.open(relay, f"/c/{other}")
    sockets = Sockets(page, hold=False)
    page.reload()
    expect(by_id(page, "title")).to_have_text("Other")
    relay.create(title="Live")  # the socket is joined: this arrives on it
    expect(sidebar_item(page, "Live")).to_be_visible()
    sockets.hold = True
    sockets.routes[-1].close()  # the page's socket drops; its retry is held
    expect(by_id(page, "connection-status")).to_be_visible()
    wait_until(page, lambda: len(sockets.routes) == 2)
    assert relay.http.patch(f"/api/conversations/{busy}", json={"title": "Renamed"}).is_success
    assert relay.send(busy, "ask permission").status_code == 202
    relay.wait_for(busy, lambda v: v["running"])
    sockets.connect()
    expect(by_id(page, "connection-status")).to_be_hidden()
    expect(sidebar_running(page, "Renamed")).to_be_visible()
    pages.assert_clean()

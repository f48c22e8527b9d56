"""Logging in and out in a real Chromium, and a hostile page that sends wrong tokens."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from playwright.sync_api import Page, expect

from tests.browser import Pages, agent_reply, by_id, send_text
from tests.relay import TOKEN, LiveRelay, free_port

GUESSES = 12  # more than the limiter's 10 failures a minute


def fresh_page(pages: Pages) -> Page:
    """A page in a new browser context that has never logged in (closed with the others)."""
    context = pages.browser.new_context()
    pages.contexts.append(context)
    page = context.new_page()
    page.on("pageerror", lambda e: pages.problems.append(f"pageerror: {e}"))
    pages.pages.append(page)
    return page


def type_token(page: Page, relay: LiveRelay, token: str) -> None:
    """Open the relay, be sent to the login form, type the token and submit it."""
    page.goto(relay.base + "/")
    expect(page).to_have_url(f"{relay.base}/login")
    by_id(page, "login-token").fill(token)
    by_id(page, "login-submit").click()


def session_cookie(page: Page) -> dict[str, Any]:
    [cookie] = [c for c in page.context.cookies() if c["name"] == "oarlock_session"]
    return dict(cookie)


@contextmanager
def site(html: str, host: str = "127.0.0.1") -> Iterator[str]:
    """Another origin on this machine serving one page (host "localhost": another site too)."""
    body = html.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def hostile_site(relay: LiveRelay) -> contextlib.AbstractContextManager[str]:
    """Another origin on this machine whose page makes the browser guess tokens."""
    return site("".join(f'<img src="{relay.base}/?token=guess{n}" alt="">' for n in range(GUESSES)))


def sockets_open(relay: LiveRelay, count: int) -> None:
    """Wait until that many tabs' sockets are open (a log out then closes them)."""
    deadline = time.monotonic() + 15
    while len(relay.supervisor.hub._everyone) < count:
        assert time.monotonic() < deadline, "the tabs' sockets did not open"
        time.sleep(0.02)


def test_typing_the_token_into_the_login_form_logs_in(pages: Pages, relay: LiveRelay) -> None:
    page = fresh_page(pages)
    type_token(page, relay, "not-the-token")
    expect(by_id(page, "login-error")).to_have_text("That token is not valid.")
    type_token(page, relay, TOKEN)
    expect(page).to_have_url(f"{relay.base}/")
    expect(by_id(page, "new-conversation")).to_be_visible()
    assert TOKEN not in session_cookie(page)["value"]
    pages.assert_clean()


def test_a_conversations_link_opens_it_after_the_login(pages: Pages, relay: LiveRelay) -> None:
    """A link to a conversation (a notification's, a bookmark) opened logged out comes back to
    that conversation after the login form, a wrong token first (before: always to /)."""
    cid = relay.create(title="Linked")["id"]
    page = fresh_page(pages)
    page.goto(f"{relay.base}/c/{cid}")
    expect(page).to_have_url(f"{relay.base}/login?next=/c/{cid}")
    by_id(page, "login-token").fill("not-the-token")
    by_id(page, "login-submit").click()
    expect(by_id(page, "login-error")).to_have_text("That token is not valid.")
    by_id(page, "login-token").fill(TOKEN)
    by_id(page, "login-submit").click()
    expect(page).to_have_url(f"{relay.base}/c/{cid}")
    expect(by_id(page, "title")).to_have_text("Linked")
    # Only a conversation's own link is followed: anything else goes to /.
    page.context.clear_cookies()
    page.goto(f"{relay.base}/login?next=//evil.example/c/1")
    by_id(page, "login-token").fill(TOKEN)
    by_id(page, "login-submit").click()
    expect(page).to_have_url(f"{relay.base}/")
    pages.assert_clean()


def test_links_from_another_site_log_in_and_open_a_conversation(
    pages: Pages, relay: LiveRelay
) -> None:
    # A review: the printed login link clicked in another site's page (a chat, a mail) ended on
    # the login form, and a conversation's link asked a logged-in browser to log in again: a
    # SameSite=Strict cookie is not sent on a navigation that another site began.
    cid = relay.create(title="From a chat")["id"]
    links = f'<a id="login" href="{relay.base}/?token={TOKEN}">log in</a>'
    links += f' <a id="conversation" href="{relay.base}/c/{cid}">the conversation</a>'
    with site(links, host="localhost") as url:
        page = fresh_page(pages)
        page.goto(url)
        page.click("#login")
        expect(page).to_have_url(re.compile(rf"^{re.escape(relay.base)}/(c/\d+)?$"))
        expect(by_id(page, "new-conversation")).to_be_visible()
        page.goto(url)
        page.click("#conversation")
        expect(page).to_have_url(f"{relay.base}/c/{cid}")
        expect(by_id(page, "title")).to_have_text("From a chat")
    # The login form, opened by a logged-in browser, goes on where it was going.
    page.goto(f"{relay.base}/login?next=/c/{cid}")
    expect(page).to_have_url(f"{relay.base}/c/{cid}")
    page.goto(f"{relay.base}/login?token={TOKEN}")  # a login link to the form itself
    expect(page).to_have_url(re.compile(rf"^{re.escape(relay.base)}/(c/\d+)?$"))
    pages.assert_clean()


def test_log_out_returns_to_login_and_refuses_the_old_cookie(
    pages: Pages, relay: LiveRelay
) -> None:
    page = pages.open(relay)
    expect(by_id(page, "new-conversation")).to_be_visible()
    old = session_cookie(page)
    by_id(page, "logout").click()
    expect(page).to_have_url(f"{relay.base}/login")
    assert [c["name"] for c in page.context.cookies()] == []
    # The browser dropped the cookie; one kept elsewhere is refused too.
    page.context.add_cookies([old])  # type: ignore[list-item]
    page.goto(relay.base + "/")
    expect(page).to_have_url(f"{relay.base}/login")
    with httpx.Client(base_url=relay.base, timeout=10) as client:
        answer = client.get(
            "/api/conversations", headers={"Cookie": f"{old['name']}={old['value']}"}
        )
    assert answer.status_code == 401
    pages.assert_clean()


def test_log_out_sends_the_browsers_other_tabs_to_login(pages: Pages, relay: LiveRelay) -> None:
    first = pages.open(relay)
    second = pages.watch(first.context.new_page())  # its console is checked too
    second.goto(relay.base + "/")
    for page in (first, second):
        expect(by_id(page, "new-conversation")).to_be_visible()
    # Both tabs' sockets are open before the first tab logs out.
    sockets_open(relay, 2)
    by_id(first, "logout").click()
    expect(first).to_have_url(f"{relay.base}/login")
    expect(by_id(first, "login-notice")).to_have_count(0)  # it knows why: it logged out
    # The other tab says why it is there (a review: a bare "Log in" form).
    expect(second).to_have_url(f"{relay.base}/login?ended=1")
    expect(by_id(second, "login-notice")).to_have_text(
        "Your session has ended: log in again to go on."
    )
    pages.assert_clean()


def test_a_tab_logged_out_elsewhere_comes_back_to_its_conversation_and_draft(
    pages: Pages, relay: LiveRelay
) -> None:
    # Found by a review: the other tab went to /login and, after it, to the newest
    # conversation with an empty composer: what was typed there was lost.
    mine, theirs = relay.create(title="Mine")["id"], relay.create(title="Theirs")["id"]
    first = pages.open(relay, f"/c/{mine}")
    second = pages.watch(first.context.new_page())
    second.goto(f"{relay.base}/c/{theirs}")
    expect(by_id(second, "title")).to_have_text("Theirs")
    by_id(second, "message-input").fill("half a thought,\nnot sent")
    expect(by_id(first, "title")).to_have_text("Mine")
    by_id(first, "message-input").fill("typed where I logged out")
    sockets_open(relay, 2)
    by_id(first, "logout").click()
    expect(first).to_have_url(f"{relay.base}/login")
    expect(second).to_have_url(f"{relay.base}/login?ended=1&next=/c/{theirs}")
    by_id(second, "login-token").fill(TOKEN)
    by_id(second, "login-submit").click()
    expect(second).to_have_url(f"{relay.base}/c/{theirs}")
    expect(by_id(second, "title")).to_have_text("Theirs")
    expect(by_id(second, "message-input")).to_have_value("half a thought,\nnot sent")
    # The tab that logged out keeps nothing of what was typed in it.
    first.goto(f"{relay.base}/c/{mine}")
    expect(by_id(first, "title")).to_have_text("Mine")
    expect(by_id(first, "message-input")).to_have_value("")
    pages.assert_clean()


def test_a_hostile_page_cannot_lock_the_owner_out(pages: Pages, relay: LiveRelay) -> None:
    owner = pages.open(relay)
    expect(by_id(owner, "new-conversation")).to_be_visible()
    with hostile_site(relay) as url:
        hostile = owner.context.new_page()
        hostile.goto(url)
        hostile.wait_for_function(
            f"document.images.length === {GUESSES} && [...document.images].every(i => i.complete)",
            timeout=60_000,
        )
        # Every guess reached the relay: the browser's address is now past the limit.
        assert relay.app.state.limiter.blocked("127.0.0.1")
        # The owner's tab keeps working: reload it, start a conversation, get a reply.
        owner.reload()
        by_id(owner, "new-conversation").click()
        by_id(owner, "new-provider").select_option("demo")
        by_id(owner, "new-create").click()
        expect(owner).to_have_url(re.compile(r"/c/\d+$"))
        send_text(owner, "still here")
        expect(agent_reply(owner, "still here")).to_be_visible()
        # And a browser that is not logged in yet still gets in with the right token.
        other = fresh_page(pages)
        type_token(other, relay, TOKEN)
        # In the app: at / it opens the newest conversation (the owner's) at once.
        expect(other).to_have_url(re.compile(rf"^{re.escape(relay.base)}/(c/\d+)?$"))
        expect(by_id(other, "new-conversation")).to_be_visible()
        hostile.close()
    assert relay.app.state.limiter.blocked("127.0.0.1")
    pages.assert_clean()

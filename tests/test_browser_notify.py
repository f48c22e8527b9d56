"""Notify in a real Chromium: the "Notify me" button, notifications of other conversations, the app.

window.Notification is wrapped in the page (before the app loads) to record what the app
shows and whether it asked for permission; the context grants the permission itself.
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page, expect

from tests.browser import Pages, agent_reply, by_id, send_text
from tests.relay import LiveRelay

# Records each notification the app creates, and each permission request, before the real ones.
HOOK = """
window.__notes = [];
window.__noteObjects = [];
window.__asked = 0;
const RealNotification = window.Notification;
class RecordedNotification extends RealNotification {
  constructor(title, options = {}) {
    window.__notes.push({ title, body: options.body, tag: options.tag });
    document.documentElement.dataset.notes = String(window.__notes.length);
    super(title, options);
    window.__noteObjects.push(this);
  }
  static requestPermission(...args) {
    window.__asked += 1;
    return RealNotification.requestPermission(...args);
  }
}
window.Notification = RecordedNotification;
"""

# Makes the page hidden, as another tab in front or a locked phone would.
HIDE = """
Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
document.dispatchEvent(new Event('visibilitychange'));
"""


# Chromium's own message when a page calls pushManager.subscribe() in an incognito context, as
# every Playwright context is (a persistent profile tries to reach the real push service
# instead, which this machine cannot). The app catches the refusal: page notifications only.
INCOGNITO_PUSH = "Chrome currently does not support the Push API in incognito mode"


def assert_clean(pages: Pages) -> None:
    """No console error but Chromium's incognito push message, no page error or CSP violation."""
    pages.assert_clean(INCOGNITO_PUSH)


def open_watched(pages: Pages, relay: LiveRelay, cid: int) -> Page:
    """A page on conversation cid, notifications allowed by the browser, the hook installed."""
    page = pages.open(relay, f"/c/{cid}", permissions=["notifications"])
    page.add_init_script(HOOK)
    page.reload()
    expect(by_id(page, "title")).to_be_visible()
    return page


def notes(page: Page) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = page.evaluate("window.__notes")
    return result


def wait_notes(page: Page, count: int) -> list[dict[str, Any]]:
    expect(page.locator("html")).to_have_attribute("data-notes", str(count))
    return notes(page)


def turn_on(page: Page) -> None:
    button = by_id(page, "notify-button")
    expect(button).to_have_text("🔔 Notify me")
    button.click()
    expect(button).to_have_text("🔔 Notifications on")
    expect(button).to_have_attribute("aria-pressed", "true")
    expect(button).to_have_attribute("data-push", "off")  # tried, refused here (incognito)


def test_notify_me_asks_once_and_nothing_on_load(relay: LiveRelay, pages: Pages) -> None:
    elsewhere = relay.create(title="Elsewhere")["id"]
    relay.send(elsewhere, "before")
    relay.wait_idle(elsewhere)
    page = open_watched(pages, relay, relay.create(title="Here")["id"])
    expect(by_id(page, "notify-button")).to_have_text("🔔 Notify me")
    assert page.evaluate("window.__asked") == 0
    assert notes(page) == []
    turn_on(page)
    assert page.evaluate("window.__asked") == 1
    page.reload()  # turned on stays on, and nothing is asked or shown on load
    expect(by_id(page, "notify-button")).to_have_text("🔔 Notifications on")
    expect(by_id(page, "notify-button")).to_have_attribute("data-push", "off")  # tried again
    assert page.evaluate("window.__asked") == 0
    assert notes(page) == []
    assert_clean(pages)


def test_turn_end_and_question_elsewhere_notify(relay: LiveRelay, pages: Pages) -> None:
    elsewhere = relay.create(title="Elsewhere")["id"]
    here = relay.create(title="Here")["id"]
    page = open_watched(pages, relay, here)
    turn_on(page)
    # A turn in the conversation on screen: no notification (its notify event comes first).
    send_text(page, "right here")
    expect(agent_reply(page, "right here")).to_be_visible()
    relay.send(elsewhere, "over there")
    assert wait_notes(page, 1) == [
        {"title": "Elsewhere", "body": "Turn finished", "tag": f"oarlock-{elsewhere}"}
    ]
    relay.send(elsewhere, "ask permission")
    assert wait_notes(page, 2)[1] == {
        "title": "Elsewhere",
        "body": "Permission asked",
        "tag": f"oarlock-{elsewhere}",
    }
    # A click on the notification opens its conversation.
    page.evaluate("window.__noteObjects[1].dispatchEvent(new Event('click'))")
    expect(page).to_have_url(f"{relay.base}/c/{elsewhere}")
    expect(by_id(page, "title")).to_have_text("Elsewhere")
    assert_clean(pages)


def test_hidden_page_notifies_of_its_own_conversation(relay: LiveRelay, pages: Pages) -> None:
    here = relay.create(title="Here")["id"]
    page = open_watched(pages, relay, here)
    turn_on(page)
    page.evaluate(HIDE)
    relay.send(here, "while away")
    assert wait_notes(page, 1) == [
        {"title": "Here", "body": "Turn finished", "tag": f"oarlock-{here}"}
    ]
    assert_clean(pages)


def test_a_tab_looking_at_the_conversation_keeps_the_browser_s_other_tabs_quiet(
    relay: LiveRelay, pages: Pages
) -> None:
    # Found by a hostile review: a background tab notified of the conversation another tab
    # of the same browser showed ("a conversation you are not looking at", README).
    here = relay.create(title="Here")["id"]
    looking = open_watched(pages, relay, here)
    turn_on(looking)
    behind = pages.watch(looking.context.new_page())  # the same browser's other tab
    behind.add_init_script(HOOK)
    behind.goto(f"{relay.base}/c/{here}")
    expect(by_id(behind, "title")).to_have_text("Here")
    behind.evaluate(HIDE)
    relay.send(here, "while watched")
    expect(agent_reply(looking, "while watched")).to_be_visible()
    expect(agent_reply(behind, "while watched")).to_be_attached()
    behind.wait_for_timeout(1500)  # past the tab's wait for a looking tab
    assert notes(behind) == [] and notes(looking) == []
    # With the looking tab elsewhere, the hidden one notifies.
    looking.goto(f"{relay.base}/c/{relay.create(title='Elsewhere')['id']}")
    expect(by_id(looking, "title")).to_have_text("Elsewhere")
    relay.send(here, "while away")
    assert wait_notes(behind, 1) == [
        {"title": "Here", "body": "Turn finished", "tag": f"oarlock-{here}"}
    ]
    assert notes(looking) == [{"title": "Here", "body": "Turn finished", "tag": f"oarlock-{here}"}]
    assert_clean(pages)


def test_off_means_no_notification(relay: LiveRelay, pages: Pages) -> None:
    elsewhere = relay.create(title="Elsewhere")["id"]
    here = relay.create(title="Here")["id"]
    page = open_watched(pages, relay, here)
    turn_on(page)
    by_id(page, "notify-button").click()
    expect(by_id(page, "notify-button")).to_have_text("🔔 Notify me")
    relay.send(elsewhere, "quietly")
    # The sidebar shows the turn ended (the same broadcast brings the notify event after it).
    relay.wait_idle(elsewhere)
    relay.send(here, "then here")
    expect(agent_reply(page, "then here")).to_be_visible()
    assert notes(page) == []
    assert_clean(pages)


def test_a_web_push_click_goes_to_an_app_window(relay: LiveRelay, pages: Pages) -> None:
    # Found by a hostile review: the click focused the first window of the origin, a raw
    # backup file or the API docs as well, and asked it to open the conversation: nothing did.
    page = pages.open(relay)
    page.evaluate("navigator.serviceWorker.ready")
    (worker,) = page.context.service_workers
    base = relay.base
    found = worker.evaluate(
        """(base) => [
          [base + '/api/conversations/3/backups/b.md', base + '/c/3', base + '/'],
          [base + '/docs', base + '/'],
          [base + '/api/conversations/3/backups/b.md', base + '/login', base + '/docs'],
          ['http://elsewhere.example/c/3'],
        ].map((urls) => appWindow(urls.map((url) => ({ url })), self.location.origin))
         .map((client) => (client ? client.url : null))""",
        base,
    )
    assert found == [f"{base}/c/3", f"{base}/", None, None]
    assert_clean(pages)


def test_manifest_and_service_worker_load(relay: LiveRelay, pages: Pages) -> None:
    page = pages.open(relay)
    # ready never settles without a registration: give up after 10 s (a bound, not a measure).
    scope = page.evaluate(
        """Promise.race([
          navigator.serviceWorker.ready.then((r) => r.scope),
          new Promise((done) => setTimeout(() => done('no service worker'), 10000)),
        ])"""
    )
    assert scope == f"{relay.base}/"
    href = page.evaluate("document.querySelector('link[rel=manifest]').href")
    manifest = page.evaluate(f"fetch({href!r}).then((r) => r.json())")
    assert (manifest["name"], manifest["display"], manifest["start_url"]) == (
        "oarlock",
        "standalone",
        "/",
    )
    for icon in manifest["icons"]:
        status = page.evaluate(f"fetch({icon['src']!r}).then((r) => r.status)")
        assert status == 200, icon
    assert_clean(pages)

"""Several nodes in a real Chromium: two pages on two nodes follow a conversation that a third
node runs; a kill -9 of that node mid-turn, and another node carries the conversation on."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from playwright.sync_api import expect

from app.supervisor import TAKEOVER_LINE
from tests.browser import (
    Pages,
    agent_reply,
    by_id,
    context_categories,
    line,
    send_text,
    shown_categories,
    user_bubble,
)
from tests.cluster import cluster
from tests.crash import RelayProcess


def at(node: RelayProcess) -> Any:
    """What Pages.open needs of a relay: its base URL."""
    return SimpleNamespace(base=str(node.client.base_url).rstrip("/"))


def streaming(page: Any) -> Any:
    return page.locator('[data-testid="entry-agent"][data-state="streaming"]')


def test_pages_on_two_nodes_follow_a_turn_and_its_takeover(pages: Pages, tmp_path: Path) -> None:
    with cluster(tmp_path) as nodes:
        first, second, third = nodes.start(3, OARLOCK_DEMO_DELAY="0.05")
        cid = third.create(provider="demo", title="Cluster")
        p1 = pages.open(at(first), f"/c/{cid}")
        p2 = pages.open(at(second), f"/c/{cid}")
        for page in (p1, p2):
            expect(page.get_by_test_id("message-input")).to_be_editable()
        third.send(cid, "slow story please")  # the third node receives it and runs the turn
        for page in (p1, p2):  # both follow it live, from their own nodes
            expect(user_bubble(page, "slow story please")).to_have_count(1)
            expect(streaming(page)).to_have_count(1)
        send_text(p1, "after the crash")  # posted to node 1, queued behind the running turn
        expect(user_bubble(p2, "after the crash")).to_have_count(1)
        nodes.kill(third)  # mid-turn
        for page in (p1, p2):
            # The lease runs out (3 s), then another node's scan takes it: a loaded machine
            # may take longer than the usual wait.
            # The cut turn: its streamed text says the agent had the message.
            expect(line(page, TAKEOVER_LINE)).to_be_visible(timeout=60_000)
            expect(agent_reply(page, "after the crash")).to_have_count(1)
            expect(agent_reply(page, "slow story please")).to_have_count(0)
            expect(user_bubble(page, "slow story please")).to_have_count(1)  # stored once
            expect(user_bubble(page, "after the crash")).to_have_count(1)
            expect(streaming(page)).to_have_count(0)
        pages.assert_clean()


def test_log_out_on_one_node_sends_the_browsers_tab_on_another_to_login(
    pages: Pages, tmp_path: Path
) -> None:
    """One browser, one session (the cookie is the host's, whatever the port), a tab on each of
    two nodes: Log out in one closes the other's socket too, from the other node."""
    with cluster(tmp_path) as nodes:
        first, second = nodes.start(2)
        one = pages.open(at(first))
        other = pages.watch(one.context.new_page())
        other.goto(at(second).base + "/")
        for page in (one, other):
            expect(page.get_by_test_id("new-conversation")).to_be_visible()
            # Its start-up requests answered first: one still in flight at the log out gets a
            # 401, which Chromium logs (a loaded CI run did).
            page.wait_for_load_state("networkidle")
        one.get_by_test_id("logout").click()
        expect(one).to_have_url(f"{at(first).base}/login")
        # No request of its own: the socket closed by the second node sends it to /login.
        expect(other).to_have_url(f"{at(second).base}/login?ended=1", timeout=15_000)
        pages.assert_clean()


def test_deny_and_stop_in_a_page_on_a_node_that_does_not_run_the_agent(
    pages: Pages, tmp_path: Path
) -> None:
    """The second node runs the conversation; the page is on the first. Its Deny reaches the
    agent (the tool fails with the user's answer, the reply follows), and its Stop cuts the
    second node's slow turn short."""
    with cluster(tmp_path) as nodes:
        first, second = nodes.start(2, OARLOCK_DEMO_DELAY="0.05")  # "slow": about 12 s
        cid = second.create(provider="demo", title="Answered elsewhere")
        page = pages.open(at(first), f"/c/{cid}")
        expect(by_id(page, "title")).to_have_text("Answered elsewhere")
        second.send(cid, "please ask permission")  # the second node takes it and runs it
        expect(by_id(page, "permission-deny")).to_be_visible()
        by_id(page, "permission-deny").click()
        expect(by_id(page, "permission-answer")).to_have_text(["Denied"])
        failed = page.locator('details[data-testid="entry-activity"].failed')
        expect(failed).to_contain_text("Denied by the user.")
        expect(agent_reply(page, "please ask permission")).to_have_count(1)
        second.wait_idle(cid)

        second.send(cid, "slow please")
        expect(streaming(page)).to_contain_text("word1")  # (the quote of the prompt is whole)
        by_id(page, "stop-button").click()
        expect(line(page, "Interrupted by the user.")).to_have_count(1)
        slow = agent_reply(page, "slow please")
        expect(slow).to_have_count(1)
        expect(slow).not_to_contain_text("word200")
        expect(by_id(page, "stop-button")).to_be_hidden()
        pages.assert_clean()


def test_the_context_modal_in_a_page_on_a_node_that_does_not_run_the_agent(
    pages: Pages, tmp_path: Path, home: Path
) -> None:
    """The second node runs the real Claude Code CLI; the 🧠 modal opened in a page on the first
    lists what fills that agent's window, as the second node reports it (it asks the owner)."""
    with cluster(tmp_path) as nodes:
        first, second = nodes.start(2)
        cid = second.create(provider="claude", title="Asked elsewhere")
        second.send(cid, "hello")
        second.wait_idle(cid, timeout=60)
        categories = context_categories(second.client, cid)
        page = pages.open(at(first), f"/c/{cid}")
        by_id(page, "context-button").click()
        expect(by_id(page, "context-categories").locator("li")).to_have_text(
            shown_categories(categories)
        )
        pages.assert_clean()

"""Turns and compaction in a real Chromium: a message queued before /compact (issue 12, item 12)."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from tests.browser import Pages, by_id, own_relay, send_text, user_bubble


def test_message_queued_before_compact_is_answered_in_the_new_conversation(
    pages: Pages, tmp_path: Path
) -> None:
    relay = own_relay(tmp_path, demo_delay=0.08)  # "slow" streams 200 words: about 16 s
    try:
        old = relay.create(title="Queue then compact")["id"]
        page = pages.open(relay, f"/c/{old}")
        send_text(page, "slow please")
        streaming = page.locator('[data-testid="entry-agent"][data-state="streaming"]')
        expect(streaming).to_have_count(1)
        # The reply's line in the carry-over is cut once it is long enough (word40 shown: the
        # text stored a second earlier holds more than the line does); until then each of
        # its checkpoints changes the preview, and a confirmation after one is refused as
        # stale (as it should be), which the slower run on a loaded machine met.
        expect(streaming).to_contain_text("word40")
        expect(by_id(page, "send-button")).to_have_text("Queue")
        # The composer empties as a message is sent; one sent before the 202 (which waits for
        # the fsync) is posted after it.
        expect(by_id(page, "message-input")).to_have_value("")

        send_text(page, "queued before compact")
        queued = user_bubble(page, "queued before compact")
        expect(queued.get_by_test_id("queued-badge")).to_be_visible()
        expect(by_id(page, "message-input")).to_have_value("")

        send_text(page, "/compact")
        by_id(page, "compact-confirm").click()
        new = relay.wait_for(old, lambda v: v["compacted_into_id"] is not None)["compacted_into_id"]
        expect(page).to_have_url(f"{relay.base}/c/{new}")
        expect(by_id(page, "title")).to_have_text("Queue then compact (compacted)")

        # The queued message moved here, went out first, carrying the summary.
        expect(user_bubble(page, "queued before compact")).to_have_count(1)
        expect(by_id(page, "entry-user")).to_have_count(1)
        expect(by_id(page, "queued-badge")).to_have_count(0)
        view = relay.wait_idle(new)
        assert view["pending_summary"] is None
        assert [e["kind"] for e in view["timeline"]] == ["user", "agent"]
        carried = (  # the demo quotes its prompt: the carry-over, then the queued text
            "You said: “[Carry-over context from previous compacted conversation] "
            "Conversation: Queue then compact User: slow please"
        )
        assert view["timeline"][1]["text"].startswith(carried)
        answered = page.locator('[data-testid="entry-agent"][data-state="done"]')
        expect(answered).to_have_count(1)
        expect(answered).to_contain_text(carried)

        # The archived conversation never ran it, and its own turn ran to the end.
        relay.wait_idle(old)
        by_id(page, "archive-list").get_by_test_id("archive-item").click()
        expect(page).to_have_url(f"{relay.base}/c/{old}")
        expect(by_id(page, "entry-user")).to_have_count(1)
        expect(user_bubble(page, "slow please")).to_have_count(1)
        expect(user_bubble(page, "queued before compact")).to_have_count(0)
        done = page.locator('[data-testid="entry-agent"][data-state="done"]')
        expect(done).to_have_count(1)
        expect(done).to_contain_text("word200")
        archived = relay.get(old)["timeline"]
        assert [e["text"] for e in archived if e["kind"] == "user"] == ["slow please"]
        pages.assert_clean()
    finally:
        pages.close()
        relay.stop()


def test_a_queue_longer_than_a_read_says_how_many_more_wait(pages: Pages, tmp_path: Path) -> None:
    # Found by a review: a read shows the next 100 queued messages (the turn counts them
    # all); a tab opened on a longer queue showed 100 and said nothing of the rest.
    relay = own_relay(tmp_path, demo_delay=0.08)  # "slow" streams 200 words: about 16 s
    try:
        cid = relay.create(title="A long queue")["id"]
        assert relay.send(cid, "slow please").status_code == 202
        for n in range(102):
            assert relay.send(cid, f"q{n}").status_code == 202
        page = pages.open(relay, f"/c/{cid}")
        expect(page.get_by_test_id("queued-badge")).to_have_count(100)
        expect(user_bubble(page, "q99")).to_have_count(1)  # the next 100: q0 to q99
        expect(user_bubble(page, "q100")).to_have_count(0)
        more = by_id(page, "queued-more")
        expect(more).to_have_text("…and 2 more queued (each shows here as its turn comes)")
        send_text(page, "one more")  # the live tab gets each new one: shown, not counted
        expect(user_bubble(page, "one more")).to_have_count(1)
        expect(more).to_have_text("…and 2 more queued (each shows here as its turn comes)")
    finally:
        relay.stop()

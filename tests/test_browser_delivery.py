"""Resend in a real Chromium: a relay (a real process) is SIGKILLed mid-turn with the demo agent,
which keeps no record of what it received, so the cut turn's line offers Resend."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from app.supervisor import UNKNOWN_LINE
from tests.browser import Pages, agent_reply, by_id, line, own_relay, user_bubble
from tests.crash import RelayProcess, entry


def test_resend_on_a_cut_turn_gets_the_message_answered(pages: Pages, tmp_path: Path) -> None:
    crashed = RelayProcess(tmp_path / "data")
    try:
        # Its first word 20 s after the turn began: killed before any, so nothing stored says
        # whether the demo (which keeps no record) got the message.
        crashed.start(OARLOCK_DEMO_DELAY="20")
        cid = crashed.create(provider="demo", title="Cut")
        message = crashed.send(cid, "please be slow")
        crashed.wait_for(cid, lambda v: entry(v, message["id"])["state"] == "sent")
        crashed.kill()
    finally:
        crashed.close()

    relay = own_relay(tmp_path, demo_delay=0.005)  # the same data directory
    try:
        p1 = pages.open(relay, f"/c/{cid}")
        p2 = pages.open(relay, f"/c/{cid}")
        cut = line(p1, UNKNOWN_LINE)
        expect(cut).to_be_visible()
        expect(agent_reply(p1, "please be slow")).to_have_count(0)
        expect(by_id(p2, "resend")).to_be_visible()
        cut.get_by_test_id("resend").click()
        expect(agent_reply(p1, "please be slow")).to_have_count(1)
        expect(user_bubble(p1, "please be slow")).to_have_count(2)
        for page in (p1, p2):  # every tab sees it was resent: no second Resend
            expect(by_id(page, "resend-done")).to_have_text("Resent")
            expect(by_id(page, "resend")).to_have_count(0)
            expect(agent_reply(page, "please be slow")).to_have_count(1)
        pages.assert_clean()
    finally:
        relay.stop()

"""What each compaction did, in Chromium, on the SDK engine: its "Context compacted…" row opens
to the details its compaction event carried (the real Copilot CLI, the fake OpenAI API)."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests import test_copilot_relay
from tests.browser import Pages, by_id
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay

fake = test_copilot_relay.fake  # the same fixtures: the fake OpenAI API, a relay on it
relay = test_copilot_relay.relay

HOSTILE = '<img src=x onerror="window.__pwned = 1"> What we did: <b>tests</b>.'


def test_engine_compaction_row_opens_to_its_details(
    pages: Pages, relay: LiveRelay, fake: FakeOpenAI
) -> None:
    fake.summary_text = HOSTILE
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "turn one")
    relay.wait_idle(cid, timeout=60)
    fake.prompt_tokens = 120_000  # of the 128k limit: past the engine's 80% threshold
    for text in ("turn two", "turn three"):
        relay.send(cid, text)
        relay.wait_idle(cid, timeout=90)
    (entry,) = [e for e in relay.get(cid)["timeline"] if e["data"].get("type") == "compaction"]
    data = entry["data"]

    page = pages.open(relay, f"/c/{cid}")
    row = by_id(page, "compaction-note")
    expect(row).to_have_text(re.compile(r"^Context compacted \(removed 3 messages, "))
    details = by_id(page, "compaction-details")
    expect(details).to_be_hidden()
    row.focus()
    page.keyboard.press("Enter")
    expect(details).to_be_visible()
    expect(by_id(page, "compaction-before")).to_have_text(f"{data['pre_tokens']:,}")
    expect(by_id(page, "compaction-after")).to_have_text(f"{data['post_tokens']:,}")
    expect(by_id(page, "compaction-removed")).to_have_text(
        f"3 messages, {data['tokens_removed']:,} tokens"
    )
    summary = by_id(page, "compaction-summary")
    expect(summary).to_have_text(HOSTILE)
    expect(summary.locator("img, b")).to_have_count(0)
    assert page.evaluate("window.__pwned") is None
    pages.assert_clean()

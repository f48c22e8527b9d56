"""What each compaction did, on the SDK engine (provider openai): the real Copilot CLI against
the fake OpenAI-compatible server; its compaction event carries the numbers and the summary."""

from __future__ import annotations

from tests import test_copilot_relay
from tests.fake_openai import FakeOpenAI
from tests.relay import LiveRelay

fake = test_copilot_relay.fake  # the same fixtures: the fake OpenAI API, a relay on it
relay = test_copilot_relay.relay


def test_engine_compaction_keeps_numbers_time_and_its_summary(
    relay: LiveRelay, fake: FakeOpenAI
) -> None:
    fake.summary_text = "<script>alert(1)</script> What we did: tests."
    fake.summary_delay = 1.0  # the compaction takes at least this long
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "turn one")
    relay.wait_idle(cid, timeout=60)
    fake.prompt_tokens = 120_000  # of the 128k limit: past the engine's 80% threshold
    for text in ("turn two", "turn three"):
        relay.send(cid, text)
        relay.wait_idle(cid, timeout=90)
    (entry,) = [e for e in relay.get(cid)["timeline"] if e["data"].get("type") == "compaction"]
    data = entry["data"]
    assert (entry["kind"], entry["state"]) == ("activity", "done")
    assert data["summary"] == "<script>alert(1)</script> What we did: tests."
    assert data["pre_tokens"] > data["post_tokens"] > 0
    assert data["messages_removed"] == 3
    assert data["duration_ms"] >= 1000  # from compaction_start to compaction_complete

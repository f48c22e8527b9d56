"""The SDK engine (provider openai) through the whole relay: the real Copilot CLI, a fake API."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.compaction import finished_text
from app.summary import compose_first_message
from tests.fake_openai import FakeOpenAI, content_text
from tests.images import png
from tests.relay import LiveRelay, make_settings


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def relay(
    cli: str, fake: FakeOpenAI, shared_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveRelay]:
    monkeypatch.setenv("HOME", str(shared_home))
    settings = make_settings(
        tmp_path / "data",
        copilot_cli=cli,
        openai_base_url=fake.base_url,
        openai_api_key="sk-test",
        openai_model="gpt-4.1",
    )
    with LiveRelay(settings) as live:
        yield live


def of_kind(view: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [entry for entry in view["timeline"] if entry["kind"] == kind]


def test_provider_is_offered_with_its_settings(relay: LiveRelay) -> None:
    providers = {p["id"]: p for p in relay.http.get("/api/providers").json()["providers"]}
    assert providers["openai"] == {
        "id": "openai",
        "name": "OpenAI-compatible",
        "available": True,
        "reason": "",
        "compact_window": False,
        "images": True,
        "refused_modes": {},
    }


def test_reply_is_stored_and_streamed(relay: LiveRelay) -> None:
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "hello engine")
    view = relay.wait_idle(cid, timeout=60)
    assert [(e["kind"], e["text"]) for e in view["timeline"]] == [
        ("user", "hello engine"),
        ("agent", "You said: hello engine"),
    ]
    assert view["session_id"]
    assert view["model"] == "gpt-4.1"


def test_claude_code_s_window_variable_leaves_the_engine_s_window_alone(
    relay: LiveRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The variable is Claude Code's: the engine compacts at 80% of the model's own window.
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "hello engine")
    view = relay.wait_idle(cid, timeout=60)
    assert (view["window"], view["threshold"]) == (128_000, 102_400)
    context = relay.http.get(f"/api/conversations/{cid}/context").json()
    shown = ("window", "auto_window", "threshold", "source", "line", "capped", "supports_window")
    assert {key: context[key] for key in shown} == {
        "window": 128_000,
        "auto_window": 128_000,
        "threshold": 102_400,
        "source": "model",
        "line": "128k · model default",
        "capped": False,
        "supports_window": False,
    }


def test_compaction_shows_as_activity_lines(relay: LiveRelay, fake: FakeOpenAI) -> None:
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "turn one")
    relay.wait_idle(cid, timeout=60)
    fake.prompt_tokens = 120_000  # of the 128k limit: past the engine's 80% threshold
    for text in ("turn two", "turn three"):
        relay.send(cid, text)
        relay.wait_idle(cid, timeout=90)
    view = relay.get(cid)
    compactions = [e for e in of_kind(view, "activity") if e["data"].get("type") == "compaction"]
    assert len(compactions) == 1
    data = compactions[0]["data"]
    assert compactions[0]["state"] == "done"
    assert data["messages_removed"] == 3
    assert compactions[0]["text"] == finished_text(
        "activity", messages_removed=3, tokens_removed=data["tokens_removed"]
    )
    assert compactions[0]["text"].startswith("Context compacted (removed 3 messages, ")
    assert of_kind(view, "line") == []  # no full-width line for this engine


def test_failed_compaction_gives_one_short_reason(relay: LiveRelay, fake: FakeOpenAI) -> None:
    fake.prompt_tokens = 120_000
    fake.summary_status = 400
    cid = relay.create(provider="openai")["id"]
    for text in ("turn one", "turn two"):
        relay.send(cid, text)
        relay.wait_idle(cid, timeout=90)
    activity = of_kind(relay.get(cid), "activity")
    assert [(e["text"], e["state"]) for e in activity] == [
        ("Context compaction failed: provider rejected (HTTP 400)", "error")
    ]


def test_compact_carries_summary_into_first_request(relay: LiveRelay, fake: FakeOpenAI) -> None:
    old = relay.create(provider="openai", title="Engine chat")["id"]
    relay.send(old, "remember the number 7")
    relay.wait_idle(old, timeout=60)
    new = relay.send(old, "/compact").json()["compacted_into"]
    summary = new["pending_summary"]
    assert summary == (
        "Conversation: Engine chat\nUser: remember the number 7\n"
        "Agent: You said: remember the number 7"
    )
    relay.send(new["id"], "what was it?")
    relay.wait_idle(new["id"], timeout=60)
    relay.send(new["id"], "and again?")
    relay.wait_idle(new["id"], timeout=60)
    chats = [r.body for r in fake.requests if r.path.endswith("/chat/completions")]
    first, second = chats[-2], chats[-1]
    users = [content_text(m["content"]) for m in first["messages"] if m["role"] == "user"]
    expected = compose_first_message(summary, "what was it?")
    assert sum(expected in text for text in users) == 1
    later = [content_text(m["content"]) for m in second["messages"] if m["role"] == "user"]
    assert sum("[Carry-over context" in text for text in later) == 1  # only the first, in history
    assert "and again?" in later[-1] and "[Carry-over" not in later[-1]
    assert [e["text"] for e in of_kind(relay.get(new["id"]), "user")] == [
        "what was it?",
        "and again?",
    ]


def test_stop_interrupts_the_turn(relay: LiveRelay) -> None:
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "go [[LONG:400]]")
    relay.wait_for(cid, lambda v: any(e["kind"] == "agent" for e in v["timeline"]), timeout=60)
    assert relay.http.post(f"/api/conversations/{cid}/interrupt").json() == {"interrupted": True}
    view = relay.wait_idle(cid, timeout=60)
    assert [e["text"] for e in of_kind(view, "line")] == ["Interrupted by the user."]
    relay.send(cid, "still there?")
    assert (
        of_kind(relay.wait_idle(cid, timeout=60), "agent")[-1]["text"] == "You said: still there?"
    )


def test_stop_interrupts_a_turn_that_began_right_after_another(relay: LiveRelay) -> None:
    # As with Claude Code: the first turn's clean-up, left to the garbage collector, ran in the
    # queued message's turn and cleared its flag: the Stop found no turn.
    cid = relay.create(provider="openai")["id"]
    relay.send(cid, "first")
    relay.send(cid, "go [[LONG:400]]")  # queued behind it
    relay.wait_for(
        cid,
        lambda v: any(
            e["text"] == "go [[LONG:400]]" and e["state"] == "sent" for e in v["timeline"]
        ),
        timeout=60,
    )
    relay.wait_for(cid, lambda v: of_kind(v, "agent")[-1]["text"] != "You said: first", timeout=60)
    assert relay.http.post(f"/api/conversations/{cid}/interrupt").json() == {"interrupted": True}
    view = relay.wait_idle(cid, timeout=60)
    assert [e["text"] for e in of_kind(view, "line")] == ["Interrupted by the user."]
    assert len(of_kind(view, "agent")[-1]["text"].split()) < 400


def test_an_attached_image_reaches_the_model(relay: LiveRelay, fake: FakeOpenAI) -> None:
    """The engine sends images as the SDK's inline blob attachments: the model's request
    carries each as a data URL beside the text."""
    cid = relay.create(provider="openai")["id"]
    image = png()
    body = {"text": "What colour is this?", "attachments": [relay.attach(cid, image)]}
    assert relay.http.post(f"/api/conversations/{cid}/messages", json=body).status_code == 202
    relay.wait_idle(cid, timeout=60)
    (content,) = [m["content"] for m in fake.chat_bodies()[-1]["messages"] if m["role"] == "user"]
    url = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    assert {"type": "image_url", "image_url": {"url": url}} in content
    assert any("What colour is this?" in part.get("text", "") for part in content)

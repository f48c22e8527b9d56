"""Which conversations wait for the user's answer: conversation.questions (the sidebar's
"needs you"), with the demo agent, which asks permission when told to.

The count is the questions still pending; every tab hears it change (a `conversation` event
to the whole app), and the conversation list carries it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.crash import RelayProcess
from tests.relay import LiveRelay, make_settings, receive_until
from tests.test_api import (
    SubagentAsker,
    answer,
    ask,
    first,
    has_pending_question,
    is_permission,
    lingering,
)
from tests.test_cluster_races import Pause


def listed(relay: LiveRelay) -> dict[int, int]:
    """Each listed conversation's count of questions waiting for an answer."""
    found = relay.http.get("/api/conversations").json()["conversations"]
    return {view["id"]: view["questions"] for view in found}


def announced(ws: Any, cid: int, questions: int) -> dict[str, Any]:
    """The conversation event that tells every tab cid now waits on this many questions."""
    return receive_until(
        ws,
        lambda m: (
            m["type"] == "conversation"
            and m["conversation"]["id"] == cid
            and m["conversation"]["questions"] == questions
        ),
    )[-1]["conversation"]


def test_a_question_is_counted_until_it_is_answered(relay: LiveRelay) -> None:
    other = relay.create()["id"]
    with relay.socket() as ws:
        cid, question = ask(relay)
        asking = announced(ws, cid, 1)
        assert (asking["running"], listed(relay)) == (True, {cid: 1, other: 0})
        assert answer(relay, cid, question["id"], allow=True).status_code == 200
        assert announced(ws, cid, 0)["id"] == cid
    relay.wait_idle(cid)
    assert listed(relay) == {cid: 0, other: 0}
    assert relay.get(cid)["questions"] == 0


def test_a_question_stopped_is_no_longer_counted(relay: LiveRelay) -> None:
    cid, _question = ask(relay)
    assert listed(relay)[cid] == 1
    relay.http.post(f"/api/conversations/{cid}/interrupt")
    asked = first(relay.wait_idle(cid), is_permission)
    assert (asked["state"], asked["data"]["expired"]) == ("expired", "the turn was stopped")
    assert listed(relay)[cid] == 0


def test_a_restart_expires_the_question_and_its_count(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "relay")
    with LiveRelay(settings) as live:
        cid = live.create()["id"]
        live.send(cid, "ask permission")
        live.wait_for(cid, has_pending_question)
        assert listed(live) == {cid: 1}
    with LiveRelay(settings) as live:
        asked = first(live.get(cid), is_permission)
        assert (asked["state"], asked["data"]["expired"]) == ("expired", "the relay was shut down")
        assert listed(live) == {cid: 0}


def test_a_shutdown_expires_a_subagent_s_question_saying_so(tmp_path: Path) -> None:
    # Found by a hostile review: asked by a background subagent, its turn over, the question
    # expired as "the agent was stopped" when the relay was shut down.
    with LiveRelay(make_settings(tmp_path / "relay")) as live:
        cid, question = lingering(live, SubagentAsker)
        SubagentAsker.go_on.set()
        assert first(live.wait_idle(cid), is_permission)["state"] == "pending"  # (lasting)
    with LiveRelay(make_settings(tmp_path / "relay")) as live:
        asked = first(live.get(cid), is_permission)
    assert (asked["id"], asked["state"]) == (question["id"], "expired")
    assert asked["data"]["expired"] == "the relay was shut down"


def test_a_crash_expires_the_question_when_the_relay_starts_again(tmp_path: Path) -> None:
    relay = RelayProcess(tmp_path / "data")
    try:
        relay.start()
        cid = relay.create(provider="demo", title="Asked")
        relay.send(cid, "ask permission")
        relay.wait_for(cid, has_pending_question)
        relay.kill()
        relay.start()
        view = relay.wait_idle(cid)
    finally:
        relay.close()
    asked = first(view, is_permission)
    assert (asked["state"], asked["data"]["expired"]) == ("expired", "the relay restarted")
    assert view["questions"] == 0


def test_a_rename_read_before_a_question_still_says_it_waits(relay: LiveRelay) -> None:
    # Found by a hostile review: a PATCH whose read came before the question published its
    # older copy (0 questions) after it: every tab stopped saying "needs you".
    cid = relay.create(title="Before")["id"]

    def read(statement: str, _params: object) -> bool:
        return "FROM conversation" in statement

    pause = Pause(relay, read, "oarlock-db-read", after=True)
    with relay.socket() as ws, ThreadPoolExecutor(1) as pool:
        pause.armed = True
        url = f"/api/conversations/{cid}"
        renamed = pool.submit(relay.http.patch, url, json={"title": "After"})
        assert pause.reached.wait(10)  # the PATCH read the conversation: no question yet
        try:
            relay.send(cid, "ask permission")
            relay.wait_for(cid, has_pending_question)
        finally:
            pause.release.set()
        assert renamed.result().json()["questions"] == 1
        last = receive_until(
            ws, lambda m: m["type"] == "conversation" and m["conversation"]["title"] == "After"
        )[-1]
    assert last["conversation"]["questions"] == 1
    assert listed(relay)[cid] == 1

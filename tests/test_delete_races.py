"""A delete racing what starts work in its conversation (found by a hostile review).

A message posted while a delete ran was stored and acknowledged between the delete's check
and its deletion, then deleted with the rows (and its turn failed: "conversation N is gone");
a warm-up whose read came before a delete started an agent for the deleted conversation,
which the next conversation given the same id then used. Each race is made to happen by
holding a storage thread at a statement (tests/test_cluster_races.Pause), in one relay.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.supervisor.runner import DELETING
from tests.crash import TIMEOUT
from tests.relay import LiveRelay, receive, receive_until
from tests.test_cluster_races import Pause


def queued_count(statement: str, _params: Any) -> bool:
    """The delete's check for waiting messages."""
    return "count(" in statement and "FROM entry" in statement


def test_a_message_sent_while_a_delete_runs_is_refused_not_lost(relay: LiveRelay) -> None:
    cid = relay.create(title="Deleted while sent")["id"]
    assert relay.send(cid, "hello").status_code == 202
    relay.wait_idle(cid)
    pause = Pause(relay, queued_count)
    pause.armed = True
    with ThreadPoolExecutor(2) as pool:
        deleting = pool.submit(relay.http.delete, f"/api/conversations/{cid}")
        assert pause.reached.wait(TIMEOUT), "the delete never checked for waiting messages"
        sending = pool.submit(relay.send, cid, "sent during the delete")
        deadline = time.monotonic() + TIMEOUT
        while not relay.supervisor.storage._jobs.qsize():  # the message's job waits behind
            assert time.monotonic() < deadline, "the message never reached the writer"
            time.sleep(0.01)
        pause.release.set()
        deleted, sent = deleting.result(TIMEOUT), sending.result(TIMEOUT)
    assert deleted.status_code == 204, deleted.text
    assert (sent.status_code, sent.json()) == (409, {"detail": DELETING})
    assert relay.http.get(f"/api/conversations/{cid}").status_code == 404


def test_a_warm_up_read_before_a_delete_starts_no_agent(relay: LiveRelay) -> None:
    cid = relay.create(title="Warmed while deleted")["id"]
    with relay.socket() as ws:
        assert receive(ws)["type"] == "hello"
        pause = Pause(
            relay,
            lambda statement, params: "FROM conversation" in statement and cid in tuple(params),
            thread="oarlock-db-read",
            after=True,
        )
        pause.armed = True
        ws.send(json.dumps({"type": "warm", "conversation_id": cid}))
        assert pause.reached.wait(TIMEOUT), "the warm-up never read its conversation"
        assert relay.http.delete(f"/api/conversations/{cid}").status_code == 204
        pause.release.set()
        answer = receive_until(ws, lambda event: event["type"] in ("warm", "error"))
    assert answer[-1] == {"type": "error", "detail": DELETING}
    assert cid not in relay.supervisor.runners

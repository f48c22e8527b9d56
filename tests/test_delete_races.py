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

from app.db import get_session
from app.models import Entry
from app.supervisor.runner import DELETING
from tests.crash import TIMEOUT
from tests.relay import LiveRelay, receive, receive_until
from tests.test_cluster_races import Pause


def queued_count(statement: str, _params: Any) -> bool:
    """The delete's check for waiting messages."""
    return "count(" in statement and "FROM entry" in statement


def during_a_delete(relay: LiveRelay, cid: int, request: Any) -> Any:
    """Run request() while the delete of cid waits at its check for waiting messages; its
    answer, once the delete (204) is over and the conversation gone."""
    pause = Pause(relay, queued_count)
    pause.armed = True
    with ThreadPoolExecutor(2) as pool:
        deleting = pool.submit(relay.http.delete, f"/api/conversations/{cid}")
        assert pause.reached.wait(TIMEOUT), "the delete never checked for waiting messages"
        answering = pool.submit(request)
        deadline = time.monotonic() + TIMEOUT
        while not relay.supervisor.storage._jobs.qsize():  # the request's job waits behind
            assert time.monotonic() < deadline, "the request never reached the writer"
            time.sleep(0.01)
        pause.release.set()
        deleted, answer = deleting.result(TIMEOUT), answering.result(TIMEOUT)
    assert deleted.status_code == 204, deleted.text
    assert relay.http.get(f"/api/conversations/{cid}").status_code == 404
    return answer


def test_a_message_sent_while_a_delete_runs_is_refused_not_lost(relay: LiveRelay) -> None:
    cid = relay.create(title="Deleted while sent")["id"]
    assert relay.send(cid, "hello").status_code == 202
    relay.wait_idle(cid)
    sent = during_a_delete(relay, cid, lambda: relay.send(cid, "sent during the delete"))
    assert (sent.status_code, sent.json()) == (409, {"detail": DELETING})


def test_a_resend_while_a_delete_runs_is_refused(relay: LiveRelay) -> None:
    cid = relay.create(title="Deleted while resent")["id"]
    message = relay.send(cid, "hello").json()
    relay.wait_idle(cid)
    with get_session(relay.app.state.engine) as session:  # as a relay restart leaves it
        entry = session.get(Entry, message["id"])
        assert entry is not None
        entry.data = {**entry.data, "cut": "unknown"}
        session.add(entry)
        session.commit()
    url = f"/api/conversations/{cid}/messages/{message['id']}/resend"
    resent = during_a_delete(relay, cid, lambda: relay.http.post(url))
    assert (resent.status_code, resent.json()) == (409, {"detail": DELETING})


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

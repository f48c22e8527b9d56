import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import event as sql_event
from websockets.exceptions import ConnectionClosedError
from websockets.sync.client import ClientConnection

from app.routes import ws as ws_route
from tests.relay import LiveRelay, gone_error, make_settings, receive, receive_until

NOT_OBJECT = {"type": "error", "detail": "Messages must be JSON objects."}
BAD_SUBSCRIBE = {"type": "error", "detail": "subscribe needs an integer conversation_id (and seq)."}
MAX_FRAME = 16 * 1024
IDLE = {"state": "idle", "queued": 0}


def frame(ws: ClientConnection, timeout: float = 10) -> Any:
    """The next frame of a socket, decoded as it came (an object or an array)."""
    return json.loads(ws.recv(timeout=timeout))


def hello(ws: ClientConnection) -> dict[str, Any]:
    message = receive(ws)
    assert message["type"] == "hello"
    return message


def subscribe(ws: ClientConnection, conversation_id: int, **position: Any) -> dict[str, Any]:
    """Read the hello, subscribe, and return the first answer."""
    hello(ws)
    ws.send(json.dumps({"type": "subscribe", "conversation_id": conversation_id, **position}))
    return receive(ws)


def ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return receive(ws)


def is_idle_turn(message: dict[str, Any]) -> bool:
    return message["type"] == "turn" and message["turn"] == IDLE


def numbered(messages: list[dict[str, Any]], conversation_id: int) -> list[dict[str, Any]]:
    """The conversation events among messages (global broadcasts carry no seq)."""
    return [m for m in messages if "seq" in m and m.get("conversation_id") == conversation_id]


def conversation_only(view: dict[str, Any]) -> dict[str, Any]:
    """A GET view without the snapshot-only keys: a Conversation."""
    extra = ("timeline", "has_more", "earlier", "turn", "agent", "seq", "epoch", "backup")
    return {key: value for key, value in view.items() if key not in extra}


def replay(timeline: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply entry, delta and entry_removed events to a timeline, as a tab does."""
    entries = {entry["id"]: dict(entry) for entry in timeline}
    for event in events:
        if event["type"] == "entry":
            entries[event["entry"]["id"]] = event["entry"]
        elif event["type"] == "delta":
            entry = entries[event["entry_id"]]
            entries[event["entry_id"]] = {**entry, "text": entry["text"] + event["text"]}
        elif event["type"] == "entry_removed":
            del entries[event["entry_id"]]
    return sorted(entries.values(), key=lambda entry: entry["seq"])


def test_hello_then_ping_pong(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as ws:
        greeting = receive(ws)
        pong = ask(ws, {"type": "ping"})
    assert set(greeting["feed"]) == {"id", "count"}  # (tests/test_api.py: what it counts)
    assert (greeting, pong) == (
        {"type": "hello", "epoch": relay.get(cid)["epoch"], "feed": greeting["feed"]},
        {"type": "pong"},
    )


def test_subscribe_without_position_sends_snapshot(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"title": "Snap"})
    with relay.socket() as ws:
        answer = subscribe(ws, cid)
    assert answer == {"type": "snapshot", "conversation_id": cid, "conversation": relay.get(cid)}


def test_subscribe_unusable_position_sends_snapshot(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"title": "Snap"})
    view = relay.get(cid)
    positions = [
        {"epoch": "0123456789ab", "seq": 0},  # another relay run
        {"epoch": view["epoch"]},  # no seq
        {"epoch": view["epoch"], "seq": 5},  # ahead of the relay
        {"seq": 0},  # no epoch
    ]
    with relay.socket() as ws:
        hello(ws)
        answers = [
            ask(ws, {"type": "subscribe", "conversation_id": cid, **position})
            for position in positions
        ]
    assert answers == [{"type": "snapshot", "conversation_id": cid, "conversation": view}] * 4


def test_subscribe_up_to_date_sends_subscribed(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"title": "Snap"})
    view = relay.get(cid)
    with relay.socket() as ws:
        answer = subscribe(ws, cid, epoch=view["epoch"], seq=view["seq"])
    assert (answer, view["seq"]) == ({"type": "subscribed", "conversation_id": cid}, 1)


def test_subscribe_behind_replays_missed(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.http.patch(f"/api/conversations/{cid}", json={"title": "One"})
    epoch = relay.get(cid)["epoch"]
    patched = relay.http.patch(f"/api/conversations/{cid}", json={"title": "Two"}).json()
    with relay.socket() as ws:
        answer = subscribe(ws, cid, epoch=epoch, seq=1)
    assert answer == {
        "type": "conversation",
        "conversation": patched,
        "seq": 2,
        "conversation_id": cid,
    }


def test_subscribe_switches_conversation(relay: LiveRelay) -> None:
    first, second = relay.create()["id"], relay.create()["id"]
    with relay.socket() as ws:
        subscribe(ws, first)
        ws.send(json.dumps({"type": "subscribe", "conversation_id": second}))
        assert receive(ws)["conversation_id"] == second
        one = relay.http.patch(f"/api/conversations/{first}", json={"title": "A"}).json()
        two = relay.http.patch(f"/api/conversations/{second}", json={"title": "B"}).json()
        messages = [receive(ws) for _ in range(3)]
    assert messages == [
        {"type": "conversation", "conversation": one},
        {"type": "conversation", "conversation": two, "seq": 1, "conversation_id": second},
        {"type": "conversation", "conversation": two},
    ]


def test_fanout_two_clients_same_events(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as a, relay.socket() as b:
        snapshots = [subscribe(ws, cid) for ws in (a, b)]
        relay.send(cid, "use a tool")
        seen = [receive_until(ws, is_idle_turn) for ws in (a, b)]
    start = snapshots[0]["conversation"]["seq"] + 1
    seqs = [m["seq"] for m in numbered(seen[0], cid)]
    assert seen[0] == seen[1]
    assert (seqs, snapshots[1]["conversation"]["seq"]) == (
        list(range(start, start + len(seqs))),
        start - 1,
    )


def test_fanout_events_rebuild_timeline(tmp_path: Path) -> None:
    # The reply's pieces 0.1 s apart: streamed, never whole in one burst (which is stored once,
    # without deltas) unless a storage job stalls for 0.3 s; at the tests' 5 ms it did once.
    with LiveRelay(make_settings(tmp_path / "data", demo_delay=0.1)) as relay:
        cid = relay.create()["id"]
        with relay.socket() as ws:
            snapshot = subscribe(ws, cid)["conversation"]
            relay.send(cid, "use a tool")
            events = numbered(receive_until(ws, is_idle_turn), cid)
        view = relay.get(cid)
    assert replay(snapshot["timeline"], events) == view["timeline"]
    assert {m["type"] for m in events} == {"entry", "delta", "turn", "conversation", "agent"}


def test_reconnect_replays_exactly_missed_events(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as stayer:
        subscribe(stayer, cid)
        with relay.socket() as leaver:
            epoch = subscribe(leaver, cid)["conversation"]["epoch"]
            relay.send(cid, "slow please")
            deltas: list[dict[str, Any]] = []
            receive_until(
                leaver, lambda m: m["type"] == "delta" and len(deltas.append(m) or deltas) == 5
            )
            last = deltas[-1]["seq"]
        relay.send(cid, "after the break")
        end = relay.wait_idle(cid)["seq"]
        stayed = numbered(receive_until(stayer, lambda m: m.get("seq") == end), cid)
        with relay.socket() as back:
            hello(back)
            back.send(
                json.dumps(
                    {"type": "subscribe", "conversation_id": cid, "epoch": epoch, "seq": last}
                )
            )
            replayed = numbered(receive_until(back, lambda m: m.get("seq") == end), cid)
    assert [m["seq"] for m in replayed] == list(range(last + 1, end + 1))
    assert replayed == [m for m in stayed if m["seq"] > last]


def test_http_snapshot_then_subscribe_rebuilds_timeline(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    relay.send(cid, "slow please")
    view = relay.wait_for(
        cid, lambda v: any(e["state"] == "streaming" and e["text"] for e in v["timeline"])
    )
    position = {"epoch": view["epoch"], "seq": view["seq"]}
    with relay.socket() as ws:
        hello(ws)
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid, **position}))
        relay.http.post(f"/api/conversations/{cid}/interrupt")
        events = numbered(receive_until(ws, is_idle_turn), cid)
    seqs = [event["seq"] for event in events]
    assert seqs == list(range(view["seq"] + 1, view["seq"] + 1 + len(seqs)))
    assert replay(view["timeline"], events) == relay.get(cid)["timeline"]


def test_not_an_object_is_error_then_socket_works(relay: LiveRelay) -> None:
    frames = ["{not json", "[1, 2]", "42", '"subscribe"', "null"]
    with relay.socket() as ws:
        hello(ws)
        answers = [ask(ws, frame) for frame in frames]
        assert (answers, ask(ws, {"type": "ping"})) == ([NOT_OBJECT] * 5, {"type": "pong"})


def test_unknown_type_is_error(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        hello(ws)
        answers = [ask(ws, {"type": "nope"}), ask(ws, {}), ask(ws, {"type": 7})]
    assert answers == [
        {"type": "error", "detail": "Unknown message type 'nope'."},
        {"type": "error", "detail": "Unknown message type None."},
        {"type": "error", "detail": "Unknown message type 7."},
    ]


def test_subscribe_bad_fields_is_error(relay: LiveRelay) -> None:
    relay.create()
    messages = [
        {"type": "subscribe", "conversation_id": "1"},
        {"type": "subscribe"},
        {"type": "subscribe", "conversation_id": 1, "seq": "5"},
        {"type": "subscribe", "conversation_id": 2**70},  # beyond SQLite's integers
        {"type": "subscribe", "conversation_id": True},
        {"type": "subscribe", "conversation_id": 1, "seq": True},  # (was read as seq 1)
        {"type": "subscribe", "conversation_id": 999},
    ]
    with relay.socket() as ws:
        hello(ws)
        answers = [ask(ws, message) for message in messages]
        pong = ask(ws, {"type": "ping"})
    assert (answers, pong) == (
        [*[BAD_SUBSCRIBE] * 6, gone_error(999)],
        {"type": "pong"},
    )


def test_frame_at_limit_is_accepted(relay: LiveRelay) -> None:
    head = '{"type": "ping", "pad": "'
    frame = head + "x" * (MAX_FRAME - len(head) - 2) + '"}'
    with relay.socket() as ws:
        hello(ws)
        assert (len(frame), ask(ws, frame)) == (MAX_FRAME, {"type": "pong"})


def test_oversized_frame_closes_socket_1009(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        hello(ws)
        ws.send("x" * (MAX_FRAME + 1))
        with pytest.raises(ConnectionClosedError) as closed:
            receive(ws)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


def test_oversized_frame_in_bytes_closes_socket_1009(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        hello(ws)
        ws.send("é" * 9000)  # 9,000 characters, 18,000 bytes
        with pytest.raises(ConnectionClosedError) as closed:
            receive(ws)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009


def test_oversized_frame_spares_other_sockets(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as other:
        subscribe(other, cid)
        with relay.socket() as ws:
            hello(ws)
            ws.send("x" * (MAX_FRAME + 1))
            with pytest.raises(ConnectionClosedError):
                receive(ws)
        patched = relay.http.patch(f"/api/conversations/{cid}", json={"title": "Still"}).json()
        events = [receive(other), receive(other)]
        pong = ask(other, {"type": "ping"})
    assert (events, pong) == (
        [
            {"type": "conversation", "conversation": patched, "seq": 1, "conversation_id": cid},
            {"type": "conversation", "conversation": patched},
        ],
        {"type": "pong"},
    )


def test_global_conversation_events_reach_unsubscribed(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        hello(ws)
        created = relay.create(title="Fresh")
        first = receive(ws)
        patched = relay.http.patch(
            f"/api/conversations/{created['id']}", json={"title": "Renamed"}
        ).json()
        second = receive(ws)
    assert [first, second] == [
        {"type": "conversation", "conversation": created},
        {"type": "conversation", "conversation": patched},
    ]


def test_compacted_event_reaches_old_subscribers(relay: LiveRelay) -> None:
    cid = relay.create(title="Old")["id"]
    with relay.socket() as ws:
        seq = subscribe(ws, cid)["conversation"]["seq"]
        new = relay.send(cid, "/compact").json()["compacted_into"]
        messages = [receive(ws) for _ in range(4)]
    old = conversation_only(relay.get(cid))
    assert messages == [
        {"type": "conversation", "conversation": old, "seq": seq + 1, "conversation_id": cid},
        {"type": "compacted", "into": new, "seq": seq + 2, "conversation_id": cid},
        {"type": "conversation", "conversation": old},
        {"type": "conversation", "conversation": new},
    ]


def test_single_message_is_plain_object(relay: LiveRelay) -> None:
    with relay.socket() as ws:
        frame(ws)
        ws.send(json.dumps({"type": "ping"}))
        assert frame(ws) == {"type": "pong"}


def test_events_queued_together_share_one_array_frame(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as ws:
        frame(ws)
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
        assert frame(ws)["type"] == "snapshot"
        # A rename publishes the conversation's event and the global one in one step.
        patched = relay.http.patch(f"/api/conversations/{cid}", json={"title": "Both"}).json()
        assert frame(ws) == [
            {"type": "conversation", "conversation": patched, "seq": 1, "conversation_id": cid},
            {"type": "conversation", "conversation": patched},
        ]


def test_replay_is_sent_in_batches_of_max_batch(
    relay: LiveRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ws_route, "MAX_BATCH", 4)
    cid = relay.create()["id"]
    epoch = relay.get(cid)["epoch"]
    for n in range(10):
        relay.http.patch(f"/api/conversations/{cid}", json={"title": f"T{n}"})
    with relay.socket() as ws:
        frame(ws)
        ws.send(json.dumps({"type": "subscribe", "conversation_id": cid, "epoch": epoch, "seq": 0}))
        frames = [frame(ws) for _ in range(3)]
    assert [[event["seq"] for event in batch] for batch in frames] == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10],
    ]


def test_streamed_turn_arrives_complete_whatever_the_framing(relay: LiveRelay) -> None:
    cid = relay.create()["id"]
    with relay.socket() as ws:
        snapshot = subscribe(ws, cid)["conversation"]
        relay.send(cid, "slow please")
        # The turn going idle with nothing queued is the last event of the exchange.
        idle = {"state": "idle", "queued": 0}
        events = numbered(
            receive_until(ws, lambda m: m["type"] == "turn" and m["turn"] == idle), cid
        )
    view = relay.get(cid)
    seqs = [event["seq"] for event in events]
    assert seqs == list(range(snapshot["seq"] + 1, view["seq"] + 1))
    assert replay(snapshot["timeline"], events) == view["timeline"]


def test_a_change_made_while_the_snapshot_is_read_reaches_the_tab(relay: LiveRelay) -> None:
    """The snapshot reads the conversation's row after its seq: a change committed between
    them is in the row or follows it, never left out of both (the tab would show the old
    title, or a turn's old context figure, until the next change)."""
    cid = relay.create(title="Before")["id"]
    relay.get(cid)  # numbered by the hub (the usual case: a conversation in use)
    reads: list[str] = []

    def rename_during_the_read(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        # The first read of the row by a reader thread, once the tab subscribed: rename the
        # conversation (committed and published) before that read goes on.
        reader = threading.current_thread().name.startswith("oarlock-db-read")
        if armed.is_set() and reader and "FROM conversation" in statement and not reads:
            reads.append(statement)
            with httpx.Client(base_url=relay.base, headers=relay.http.headers) as client:
                changed = client.patch(f"/api/conversations/{cid}", json={"title": "After"})
            assert changed.status_code == 200, changed.text

    armed = threading.Event()
    engine = relay.supervisor.engine
    sql_event.listen(engine, "after_cursor_execute", rename_during_the_read)
    try:
        with relay.socket() as ws:
            hello(ws)
            armed.set()
            ws.send(json.dumps({"type": "subscribe", "conversation_id": cid}))
            answers = receive_until(ws, lambda m: m["type"] == "snapshot")
            # Everything published before the ping reaches the tab before its pong.
            ws.send(json.dumps({"type": "ping"}))
            answers += receive_until(ws, lambda m: m["type"] == "pong")
    finally:
        sql_event.remove(engine, "after_cursor_execute", rename_during_the_read)
    assert reads, "the snapshot's read was not seen"
    title = None  # what the tab shows: the snapshot, then each change after it, in order
    for message in answers:
        kind, conversation = message["type"], message.get("conversation", {})
        if kind == "snapshot" or (kind == "conversation" and conversation["id"] == cid):
            title = conversation["title"]
    assert title == "After"

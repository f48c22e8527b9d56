"""Load: many browser connections over many conversations with streaming demo agents.

Every connection must receive every event of its conversation, in order, none
missing (sequence numbers consecutive from its snapshot on) up to the last one (once
the senders stop and every turn is over, each tab must reach its conversation's final
seq); one deliberately stalled connection must be dropped without slowing the others;
relay memory is reported at the start and the end. Prints one line of figures; exits 1
when a check fails (a gap, a resync, a tab short of the last event, the stalled tab kept).

    python -m bench.load --seconds 300 --connections 100 --conversations 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from bench.reliability import TOKEN, Relay

SAMPLE_EVERY = 30.0  # seconds between RSS samples
FINISH = 60.0  # seconds the turns and the tabs get to finish once the senders stop


@dataclass
class Watcher:
    """One browser tab: what it saw of one conversation."""

    conversation_id: int
    last_seq: int | None = None
    events: int = 0
    gaps: int = 0
    resyncs: int = 0
    final_seq: int | None = None  # the conversation's last seq, once every turn is over


def rss_kib(pid: int) -> int:
    """Resident memory of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def events_of(frame: str | bytes) -> list[dict[str, Any]]:
    """The events in one frame (one object, or an array of them)."""
    message = json.loads(frame)
    return message if isinstance(message, list) else [message]


def finished(watcher: Watcher) -> bool:
    """True once the tab saw its conversation's last event."""
    return (
        watcher.final_seq is not None
        and watcher.last_seq is not None
        and watcher.last_seq >= watcher.final_seq
    )


async def watch(url: str, headers: dict[str, str], watcher: Watcher) -> None:
    """Follow one conversation and check its sequence up to its last event."""
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps({"type": "subscribe", "conversation_id": watcher.conversation_id}))
        while not finished(watcher):
            try:
                frame = await asyncio.wait_for(ws.recv(), timeout=0.5)
            except TimeoutError:
                continue  # (the final seq is read once the senders stop)
            for event in events_of(frame):
                observe(watcher, event)


def observe(watcher: Watcher, event: dict[str, Any]) -> None:
    """Check one event against the sequence seen so far."""
    kind = event.get("type")
    if kind == "snapshot":
        watcher.last_seq = event["conversation"]["seq"]
    elif kind == "resync":
        watcher.resyncs += 1
    elif "seq" in event and event.get("conversation_id") == watcher.conversation_id:
        watcher.events += 1
        if watcher.last_seq is not None and event["seq"] != watcher.last_seq + 1:
            watcher.gaps += 1
        watcher.last_seq = event["seq"]


async def stall(
    url: str, headers: dict[str, str], conversation_id: int, stop: asyncio.Event
) -> bool:
    """A tab that subscribes and never reads; True when the relay dropped it."""
    try:
        async with connect(url, additional_headers=headers, max_queue=1) as ws:
            await ws.send(json.dumps({"type": "subscribe", "conversation_id": conversation_id}))
            await stop.wait()
            return ws.state.name != "OPEN"
    except Exception:  # noqa: BLE001 - a dropped connection is the expected outcome
        return True


async def drive(client: httpx.AsyncClient, conversation_id: int, stop: asyncio.Event) -> int:
    """Keep one conversation's agent streaming: a new message whenever the last turn ended."""
    sent = 0
    while not stop.is_set():
        view = (
            await client.get(f"/api/conversations/{conversation_id}", params={"limit": 1})
        ).json()
        if view["turn"]["queued"] == 0:
            sent += 1
            text = f"load {sent} slow"
            await client.post(f"/api/conversations/{conversation_id}/messages", json={"text": text})
        await asyncio.sleep(0.2)
    return sent


async def final_seq(client: httpx.AsyncClient, conversation_id: int) -> int:
    """A conversation's last seq once its turns are over and nothing is queued."""
    deadline = asyncio.get_running_loop().time() + FINISH
    while True:
        view = (
            await client.get(f"/api/conversations/{conversation_id}", params={"limit": 1})
        ).json()
        if view["turn"] == {"state": "idle", "queued": 0}:
            return int(view["seq"])
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"conversation {conversation_id} never went idle")
        await asyncio.sleep(0.1)


async def run(
    seconds: float, connections: int, conversations: int, workdir: Path
) -> dict[str, Any]:
    """The whole experiment; returns its figures."""
    relay = Relay(workdir, demo_delay=0.01)
    relay.start().close()
    assert relay.process is not None
    base = f"http://127.0.0.1:{relay.port}"
    url = f"ws://127.0.0.1:{relay.port}/ws"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            ids = [
                (await client.post("/api/conversations", json={"provider": "demo"})).json()["id"]
                for _ in range(conversations)
            ]
            rss_start = rss_kib(relay.process.pid)
            stop = asyncio.Event()
            watchers = [Watcher(ids[n % conversations]) for n in range(connections)]
            tabs = [asyncio.create_task(watch(url, headers, w)) for w in watchers]
            stalled = asyncio.create_task(stall(url, headers, ids[0], stop))
            await asyncio.sleep(1)
            drivers = [asyncio.create_task(drive(client, cid, stop)) for cid in ids]
            samples = []  # RSS over time: flat once the hub's replay buffers are full
            for _ in range(max(1, round(seconds / SAMPLE_EVERY))):
                await asyncio.sleep(seconds / max(1, round(seconds / SAMPLE_EVERY)))
                samples.append(round(rss_kib(relay.process.pid) / 1024))
            stop.set()
            messages = sum(await asyncio.gather(*drivers))
            finals = {cid: await final_seq(client, cid) for cid in ids}
            for watcher in watchers:
                watcher.final_seq = finals[watcher.conversation_id]
            # Every tab must reach its conversation's last event; those that do not in time
            # are counted short.
            _done, late = await asyncio.wait(tabs, timeout=FINISH)
            for task in late:
                task.cancel()
            dropped = await stalled
            rss_end = rss_kib(relay.process.pid)
    finally:
        relay.kill()
    return {
        "seconds": seconds,
        "connections": connections,
        "conversations": conversations,
        "messages": messages,
        "events": sum(w.events for w in watchers),
        "gaps": sum(w.gaps for w in watchers),
        "resyncs": sum(w.resyncs for w in watchers),
        "short": sum(not finished(w) for w in watchers),
        "stalled_dropped": dropped,
        "rss_start_mib": round(rss_start / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "rss_mib_samples": ",".join(str(sample) for sample in samples),
    }


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--conversations", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oarlock-load-") as workdir:
        figures = asyncio.run(
            run(args.seconds, args.connections, args.conversations, Path(workdir))
        )
    print(" ".join(f"{key}={value}" for key, value in figures.items()))
    failed = figures["gaps"] or figures["resyncs"] or figures["short"]
    sys.exit(1 if failed or not figures["stalled_dropped"] else 0)


if __name__ == "__main__":
    main()

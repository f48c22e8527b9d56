"""The benches' Tab reads every event of a socket frame, not only the first that matched.

The relay sends a burst of events as one frame (a JSON array): a turn's first delta and its
end can share one. Against a real websockets server on 127.0.0.1.
"""

from __future__ import annotations

import json
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from bench.common import Tab


class _Relay:
    """What Tab needs of a relay: its socket's URL and headers."""

    def __init__(self, port: int) -> None:
        self.ws_url = f"ws://127.0.0.1:{port}/ws"

    def ws_headers(self) -> dict[str, str]:
        return {}


async def test_events_after_the_awaited_one_in_a_frame_are_kept() -> None:
    idle = {"type": "turn", "turn": {"state": "idle", "queued": 0}}

    async def handler(ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "hello"}))
        await ws.recv()  # subscribe
        await ws.send(json.dumps({"type": "snapshot"}))
        frame = [{"type": "delta", "text": "You"}, idle, {"type": "agent", "agent": "asleep"}]
        await ws.send(json.dumps(frame))
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        tab = Tab(_Relay(port), 1)  # type: ignore[arg-type]
        await tab.open()
        seen: list[dict[str, Any]] = []
        await tab.until(lambda m: seen.append(m) is None and m["type"] == "delta", 5)
        await tab.until(lambda m: m == idle, 5)  # in the delta's frame
        await tab.until(lambda m: m.get("agent") == "asleep", 5)
        assert tab.ws is not None
        await tab.ws.close()
    assert seen == [{"type": "delta", "text": "You"}]

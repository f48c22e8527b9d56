"""Tests of the fake Anthropic Messages API the Claude Code tests run against."""

from __future__ import annotations

import itertools
import json
import select
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from tests.fake_anthropic import SUMMARY_MARKER, FakeAnthropic


def post(fake: FakeAnthropic, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(
        fake.base_url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": "sk-test"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def ask(text: str, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    return {"model": "claude-test", "stream": stream, "messages": messages}


def sse_events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def test_messages_answer_json_with_unique_ids(fake: FakeAnthropic) -> None:
    fake.configure(input_tokens="1234", cache_read=5)
    _, _, first = post(fake, "/v1/messages?beta=true", ask("hello"))
    _, _, second = post(fake, "/v1/messages", ask("again"))

    reply = json.loads(first)
    assert reply["id"] == "msg_fake_000001" and json.loads(second)["id"] == "msg_fake_000002"
    assert reply["content"] == [{"type": "text", "text": "You said: hello"}]
    assert reply["usage"]["input_tokens"] == 1234
    assert reply["usage"]["cache_read_input_tokens"] == 5
    assert fake.requests[0].headers["x-api-key"] == "sk-test"
    assert fake.requests[0].body["model"] == "claude-test"


def test_messages_stream_sse_in_api_order(fake: FakeAnthropic) -> None:
    status, headers, body = post(fake, "/v1/messages?beta=true", ask("[[BASH:ls]]", True))

    events = sse_events(body)
    kinds = [kind for kind, _ in itertools.groupby(e["type"] for e in events)]
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    tool_start, tool_delta = events[-5], events[-4]
    assert tool_start["content_block"]["name"] == "Bash"
    assert json.loads(tool_delta["delta"]["partial_json"])["command"] == "ls"
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_tool_result_and_summary_replies(fake: FakeAnthropic) -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "hi"}
    body = {"model": "m", "messages": [{"role": "user", "content": [result]}]}
    _, _, tool_reply = post(fake, "/v1/messages", body)
    summary = ask(f"CRITICAL: Respond with TEXT ONLY. {SUMMARY_MARKER}.")
    _, _, summary_reply = post(fake, "/v1/messages", summary)

    assert json.loads(tool_reply)["content"][0]["text"] == "The tool returned: hi"
    summary_text = json.loads(summary_reply)["content"][0]["text"]
    assert summary_text.endswith("<summary>FAKE SUMMARY of 0 messages</summary>")
    assert json.loads(summary_reply)["usage"]["input_tokens"] == 5000


def test_scripted_errors_then_success(fake: FakeAnthropic) -> None:
    post(fake, "/_admin", {"errors": [429], "should_retry": False})
    fake.fail(529)

    status, headers, body = post(fake, "/v1/messages", ask("x"))
    assert (status, headers["x-should-retry"]) == (429, "false")
    assert json.loads(body)["error"]["type"] == "rate_limit_error"
    status, headers, body = post(fake, "/v1/messages", ask("x"))
    assert status == 529 and "x-should-retry" not in headers
    assert json.loads(body)["error"]["type"] == "overloaded_error"
    assert post(fake, "/v1/messages", ask("x"))[0] == 200


def test_slow_marker_delays_reply(fake: FakeAnthropic) -> None:
    started = time.monotonic()
    _, _, reply = post(fake, "/v1/messages", ask("wait [[SLOW:0.3]]"))
    assert time.monotonic() - started >= 0.3
    assert json.loads(reply)["content"][0]["text"] == "You said: wait [[SLOW:0.3]]"


def test_count_tokens_is_a_quarter_of_the_body(fake: FakeAnthropic) -> None:
    body = ask("count me")
    _, _, reply = post(fake, "/v1/messages/count_tokens?beta=true", body)
    assert json.loads(reply) == {"input_tokens": len(json.dumps(body)) // 4}


def test_many_connections_at_once_wait_for_no_retry() -> None:
    """Claude Code's context report opens 13 connections at once: the kernel must queue them
    all, not drop the SYNs past a backlog of 5 (each then waits 1 s: the report took 2 s)."""
    fake = FakeAnthropic()  # listening, not accepting yet: a busy accept loop at its worst
    sockets = [socket.socket() for _ in range(20)]
    try:
        for sock in sockets:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", fake.port))
        connected: set[socket.socket] = set()
        deadline = time.monotonic() + 0.5  # a dropped SYN is sent again after 1 s
        while len(connected) < len(sockets) and time.monotonic() < deadline:
            _, writable, _ = select.select([], [s for s in sockets if s not in connected], [], 0.05)
            connected.update(
                s for s in writable if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            )
        assert len(connected) == len(sockets)
    finally:
        for sock in sockets:
            sock.close()
        fake.stop()

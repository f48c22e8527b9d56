"""A fake Anthropic Messages API on 127.0.0.1, for running the real Claude Code CLI offline.

Replies (the model answers whatever was asked, so tests can check what reached it):

* by default the text ``You said: <last user text>``, where the last user text is the last
  text block of the last user message, without the CLI's ``<system-reminder>`` parts;
* a compaction request (its last user message asks for "a detailed summary of the
  conversation so far") gets ``<analysis>…</analysis><summary>FAKE SUMMARY of N
  messages</summary>`` after ``summary_delay`` seconds, reporting ``summary_input_tokens``
  (``summary_text``, when set, is said in the summary block instead);
* a request whose last message carries a tool_result (and no text) gets
  ``The tool returned: <content>``;
* markers in the last user message: ``[[BASH:cmd]]`` → a text block plus a ``Bash`` tool_use
  for ``cmd``; ``[[WRITE:path|text]]`` → a text block plus a ``Write`` tool_use writing ``text`` to
  ``path``; ``[[LONG:N]]`` → N words streamed ``long_word_delay`` seconds apart;
  ``[[SLOW:s]]`` → the reply starts after s seconds.

Controls, as attributes or through ``POST /_admin`` with a JSON object of the same names:
``input_tokens``, ``output_tokens``, ``cache_read``, ``cache_creation`` (the usage every
reply reports), ``delta_delay`` (seconds before each streamed delta), ``summary_delay``,
``summary_input_tokens``, ``summary_text``, ``long_word_delay``; ``fail(*statuses, retry=True)`` (or
``{"errors": [429], "should_retry": false}``) queues error replies for the next requests.
A request for a model named ``no-such-model…`` gets the API's 404 (not_found_error).
Every request is recorded in ``requests`` (path, lowercased headers, JSON body).
``tool_calls`` holds (name, input) pairs: each answers one next request (that carries no
tool_result) with a ``tool_use`` of that tool, e.g. ``mcp__oarlock__save_handoff``; an
``ExitPlanMode`` with a ``plan`` first writes it to the plan file the request names.
Message ids are unique: ``msg_fake_000001``, ``msg_fake_000002``…
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.fake_server import LOREM, FakeServer, Request, content_text

UNKNOWN_MODEL = "no-such-model"  # a model name the fake does not know (404), and its start
PLAN_FILE = re.compile(r"(?:create your plan at|plan file exists at) (/[^ \\\"]+?\.md)")
REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)
SUMMARY_MARKER = "Your task is to create a detailed summary of the conversation so far"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
DROP = 0  # a "status" for fail(): close the connection without answering
CONTROLS = {
    "input_tokens": int,
    "output_tokens": int,
    "cache_read": int,
    "cache_creation": int,
    "delta_delay": float,
    "summary_delay": float,
    "summary_input_tokens": int,
    "summary_text": str,
    "long_word_delay": float,
}


def user_texts(message: dict[str, Any]) -> list[str]:
    """Return the text blocks of one message, without the CLI's system reminders."""
    content = message.get("content")
    blocks = [content] if isinstance(content, str) else [content_text([b]) for b in content or []]
    texts = [REMINDER.sub("", t).strip() for t in blocks]
    return [t for t in texts if t]


def last_user_text(body: dict[str, Any]) -> str:
    """Return the last non-reminder text of the last user message of a request body."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    texts = user_texts(users[-1]) if users else []
    return texts[-1].strip() if texts else ""


class FakeAnthropic(FakeServer):
    """A threaded HTTP server answering like the Anthropic Messages API; a context manager."""

    def __init__(self, *, input_tokens: int = 1000, output_tokens: int = 10) -> None:
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cache_read = 0
        self.cache_creation = 0
        self.delta_delay = 0.0
        self.summary_delay = 0.0
        self.summary_input_tokens = 5000
        self.summary_text = ""
        self.long_word_delay = 0.05
        self.requests: list[Request] = []
        self.tool_calls: deque[tuple[str, dict[str, Any]]] = deque()
        self._errors: deque[tuple[int, bool]] = deque()
        self._lock = threading.Lock()
        self._count = 0
        super().__init__(lambda: _handler_for(self))

    def fail(self, *statuses: int, retry: bool = True) -> None:
        """Answer the next Messages requests with these HTTP error statuses, in order (DROP:
        no answer, the connection closes)."""
        with self._lock:
            self._errors.extend((s, retry) for s in statuses)

    def configure(self, **controls: Any) -> None:
        """Set controls by name (what ``POST /_admin`` does)."""
        for name, value in controls.items():
            if name == "errors":
                self.fail(*map(int, value), retry=bool(controls.get("should_retry", True)))
            elif name in CONTROLS:
                setattr(self, name, CONTROLS[name](value))
            elif name != "should_retry":
                raise ValueError(f"unknown control {name!r}")

    def message_bodies(self) -> list[dict[str, Any]]:
        """Return the JSON bodies of the Messages requests (not count_tokens), in order."""
        with self._lock:
            return [r.body for r in self.requests if r.path.split("?")[0] == "/v1/messages"]

    def user_texts_sent(self) -> list[str]:
        """Return every user text of the last Messages request (the history the model saw)."""
        bodies = self.message_bodies()
        msgs = bodies[-1]["messages"] if bodies else []
        return [t for m in msgs if m.get("role") == "user" for t in user_texts(m)]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_id(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    def _next_error(self) -> tuple[int, bool] | None:
        with self._lock:
            return self._errors.popleft() if self._errors else None

    def _usage(self, input_tokens: int | None = None) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens if input_tokens is None else input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_creation,
        }

    def plan(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        """Decide the reply to a Messages request: blocks, stop reason, delays, usage."""
        messages = body.get("messages") or [{}]
        last = messages[-1]
        text = last_user_text(body)
        reply: dict[str, Any] = {"wait": 0.0, "word_delay": self.delta_delay, "usage": None}
        if SUMMARY_MARKER in content_text(last.get("content")):
            summary = self.summary_text or f"FAKE SUMMARY of {len(messages) - 1} messages"
            analysis = "<analysis>Fake analysis.</analysis>\n"
            reply.update(wait=self.summary_delay, usage=self._usage(self.summary_input_tokens))
            return reply | {"blocks": [("text", f"{analysis}<summary>{summary}</summary>")]}
        results = [
            b
            for b in last.get("content") or []
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if results and not text:  # (a prompt queued after an interrupt joins the results)
            texts = [t for b in results for t in user_texts({"content": b.get("content")})]
            returned = "\n".join(texts)
            return reply | {"blocks": [("text", f"The tool returned: {returned}")]}
        if self.tool_calls:
            name, tool_input = self.tool_calls.popleft()
            if name == "ExitPlanMode" and isinstance(tool_input.get("plan"), str):
                _write_plan(body, tool_input["plan"])
            tool_use = ("tool_use", f"toolu_fake_{n:04d}", tool_input, name)
            return reply | {"blocks": [("text", f"I will call {name}."), tool_use]}
        if slow := re.search(r"\[\[SLOW:([\d.]+)\]\]", text):
            reply["wait"] = float(slow[1])
        if bash := re.search(r"\[\[BASH:(.*?)\]\]", text, re.DOTALL):
            tool = {"command": bash[1], "description": "Run the requested command"}
            tool_use = ("tool_use", f"toolu_fake_{n:04d}", tool)
            return reply | {"blocks": [("text", "I will run the command."), tool_use]}
        if write := re.search(r"\[\[WRITE:(.*?)\|(.*?)\]\]", text, re.DOTALL):
            tool = {"file_path": write[1], "content": write[2]}
            tool_use = ("tool_use", f"toolu_fake_{n:04d}", tool, "Write")
            return reply | {"blocks": [("text", "I will write the file."), tool_use]}
        if long := re.search(r"\[\[LONG:(\d+)\]\]", text):
            words = [LOREM[i % len(LOREM)] for i in range(int(long[1]))]
            reply["word_delay"] = max(self.delta_delay, self.long_word_delay)
            return reply | {"blocks": [("text", " ".join(words))], "split_words": True}
        return reply | {"blocks": [("text", f"You said: {text}")]}


def _write_plan(body: dict[str, Any], plan: str) -> None:
    """Write the plan where plan mode told the model to (as a model's Write would have): Claude
    Code sends the plan file's text with ExitPlanMode's question, not the call's own."""
    found = PLAN_FILE.search(json.dumps(body))
    if found is not None:
        path = Path(json.loads(f'"{found[1]}"'))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan)


def _tool_name(block: tuple[Any, ...]) -> str:
    """The tool a tool_use block calls (Bash unless the block names another)."""
    return str(block[3]) if len(block) > 3 else "Bash"


def _handler_for(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.loads(raw or b"{}")
            path = self.path.split("?")[0]
            fake._record(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if path == "/_admin":
                fake.configure(**body)
                self._json(200, {"ok": True})
            elif path == "/v1/messages/count_tokens":
                self._json(200, {"input_tokens": len(raw) // 4})
            elif path == "/v1/messages":
                self._messages(body)
            else:
                self._error(404, "not_found_error", f"no route {path}")

        def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str, retry: bool = True) -> None:
            payload = {"type": "error", "error": {"type": kind, "message": message}}
            self._json(status, payload, {} if retry else {"x-should-retry": "false"})

        def _messages(self, body: dict[str, Any]) -> None:
            if error := fake._next_error():
                status, retry = error
                if status == DROP:  # the connection closes with no answer at all
                    self.close_connection = True
                    return
                kind = ERROR_TYPES.get(status, "api_error")
                self._error(status, kind, f"fake {kind} ({status})", retry)
                return
            if str(body.get("model", "")).startswith(UNKNOWN_MODEL):  # as the API answers
                self._error(404, "not_found_error", f"model: {body['model']}", False)
                return
            n = fake._next_id()
            plan = fake.plan(body, n)
            time.sleep(plan["wait"])
            message = {
                "id": f"msg_fake_{n:06d}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "claude-fake"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": plan["usage"] or fake._usage(),
            }
            has_tool = any(b[0] == "tool_use" for b in plan["blocks"])
            stop = "tool_use" if has_tool else "end_turn"
            if not body.get("stream"):
                content = [
                    {"type": "text", "text": b[1]}
                    if b[0] == "text"
                    else {"type": "tool_use", "id": b[1], "name": _tool_name(b), "input": b[2]}
                    for b in plan["blocks"]
                ]
                self._json(200, message | {"content": content, "stop_reason": stop})
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("request-id", f"req_fake_{n:06d}")
            self.end_headers()
            # the client may go away mid-stream (an interrupt): stop writing then
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._stream(message, plan, stop)

        def _event(self, kind: str, data: dict[str, Any], delay: float = 0.0) -> None:
            if delay:
                time.sleep(delay)
            self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        def _stream(self, message: dict[str, Any], plan: dict[str, Any], stop: str) -> None:
            self._event("message_start", {"type": "message_start", "message": message})
            delay = plan["word_delay"]
            for i, block in enumerate(plan["blocks"]):
                if block[0] == "text":
                    start = {"type": "text", "text": ""}
                    words = re.findall(r"\S+\s*", block[1]) if plan.get("split_words") else []
                    chunks = words or [block[1][j : j + 20] for j in range(0, len(block[1]), 20)]
                    deltas = [{"type": "text_delta", "text": c} for c in chunks]
                else:
                    start = {
                        "type": "tool_use",
                        "id": block[1],
                        "name": _tool_name(block),
                        "input": {},
                    }
                    deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block[2])}]
                self._event(
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": start},
                )
                for delta in deltas:
                    payload = {"type": "content_block_delta", "index": i, "delta": delta}
                    self._event("content_block_delta", payload, delay)
                self._event("content_block_stop", {"type": "content_block_stop", "index": i})
            self._event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": message["usage"]["output_tokens"]},
                },
            )
            self._event("message_stop", {"type": "message_stop"})

    return Handler

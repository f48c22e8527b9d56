"""A fake OpenAI-compatible Chat Completions API on 127.0.0.1, for the real Copilot CLI offline.

Replies (the model answers whatever was asked, so tests can check what reached it):

* by default the text ``You said: <last user text>``, where the last user text is the last
  text of the last user message, without the CLI's ``<tag>…</tag>`` context blocks;
* a summarizer request (its last user message starts "Please create a detailed summary of
  the conversation so far") gets ``summary_text`` after ``summary_delay`` seconds, reporting
  ``summary_prompt_tokens``; ``summary_status`` (when set) answers every summarizer request
  with that HTTP error status instead;
* a request whose last message is a tool result gets ``The tool returned: <content>``;
* markers in the last user message: ``[[TOOL:name {json}]]`` → a tool call of ``name`` with
  those arguments; ``[[LONG:N]]`` → N words streamed ``long_word_delay`` seconds apart;
  ``[[SLOW:s]]`` → the reply starts after s seconds.

Controls, as attributes or through ``POST /_admin`` with a JSON object of the same names:
``prompt_tokens``, ``completion_tokens`` (the usage every reply reports), ``delta_delay``
(seconds before each streamed chunk), ``summary_delay``, ``summary_prompt_tokens``,
``summary_text``, ``summary_status``, ``long_word_delay``; ``fail(*statuses)`` (or
``{"errors": [500]}``) queues error replies for the next non-summarizer requests.
Every request is recorded in ``requests`` (path, lowercased headers, JSON body).
Completion ids are unique: ``chatcmpl-fake-000001``, ``chatcmpl-fake-000002``…
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.fake_server import LOREM, FakeServer, Request, content_text

SUMMARY_MARKER = "Please create a detailed summary of the conversation so far"
CONTEXT_BLOCK = re.compile(r"<([a-z_]+)>.*?</\1>", re.DOTALL)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    500: "server_error",
}
CONTROLS = {
    "prompt_tokens": int,
    "completion_tokens": int,
    "delta_delay": float,
    "summary_delay": float,
    "summary_prompt_tokens": int,
    "summary_text": str,
    "summary_status": lambda value: None if value is None else int(value),
    "long_word_delay": float,
}


def user_text(message: dict[str, Any]) -> str:
    """Return a user message's own text, without the CLI's context blocks."""
    return CONTEXT_BLOCK.sub("", content_text(message.get("content"))).strip()


def last_user_text(body: dict[str, Any]) -> str:
    """Return the own text of the last user message of a request body."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return user_text(users[-1]) if users else ""


def is_summary_request(body: dict[str, Any]) -> bool:
    """Tell whether a request is the CLI's compaction summarizer call."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return bool(users) and content_text(users[-1].get("content")).lstrip().startswith(
        SUMMARY_MARKER
    )


class FakeOpenAI(FakeServer):
    """A threaded HTTP server answering like the OpenAI Chat Completions API; a context manager."""

    def __init__(self, *, prompt_tokens: int = 1000, completion_tokens: int = 10) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.delta_delay = 0.0
        self.summary_delay = 0.0
        self.summary_prompt_tokens = 5000
        self.summary_text = "FAKE SUMMARY of the conversation."
        self.summary_status: int | None = None
        self.long_word_delay = 0.05
        self.requests: list[Request] = []
        self._errors: deque[int] = deque()
        self._lock = threading.Lock()
        self._count = 0
        super().__init__(lambda: _handler_for(self), "/v1")

    def fail(self, *statuses: int) -> None:
        """Answer the next non-summarizer requests with these HTTP error statuses, in order."""
        with self._lock:
            self._errors.extend(statuses)

    def configure(self, **controls: Any) -> None:
        """Set controls by name (what ``POST /_admin`` does)."""
        for name, value in controls.items():
            if name == "errors":
                self.fail(*map(int, value))
            elif name in CONTROLS:
                setattr(self, name, CONTROLS[name](value))
            else:
                raise ValueError(f"unknown control {name!r}")

    def chat_bodies(self) -> list[dict[str, Any]]:
        """Return the JSON bodies of the chat completion requests, in order."""
        with self._lock:
            return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def summary_bodies(self) -> list[dict[str, Any]]:
        """Return the bodies of the summarizer requests."""
        return [b for b in self.chat_bodies() if is_summary_request(b)]

    def turn_bodies(self) -> list[dict[str, Any]]:
        """Return the bodies of the chat requests that are not the summarizer's."""
        return [b for b in self.chat_bodies() if not is_summary_request(b)]

    def user_texts_sent(self) -> list[str]:
        """Return every user text of the last turn request (the history the model saw)."""
        bodies = self.turn_bodies()
        messages = bodies[-1]["messages"] if bodies else []
        texts = [user_text(m) for m in messages if m.get("role") == "user"]
        return [t for t in texts if t]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_id(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    def _next_error(self) -> int | None:
        with self._lock:
            return self._errors.popleft() if self._errors else None

    def _usage(self, prompt_tokens: int | None = None) -> dict[str, int]:
        prompt = self.prompt_tokens if prompt_tokens is None else prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    def plan(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        """Decide the reply to a chat request: text, tool calls, delays, usage, or an error."""
        reply: dict[str, Any] = {
            "wait": 0.0,
            "chunk_delay": self.delta_delay,
            "usage": self._usage(),
            "text": "",
            "tool_calls": [],
            "split_words": False,
            "status": None,
        }
        if is_summary_request(body):
            reply.update(wait=self.summary_delay, usage=self._usage(self.summary_prompt_tokens))
            return reply | {"text": self.summary_text, "status": self.summary_status}
        if (status := self._next_error()) is not None:
            return reply | {"status": status}
        messages = body.get("messages") or [{}]
        last = messages[-1]
        if last.get("role") == "tool":
            results = []
            for message in reversed(messages):
                if message.get("role") != "tool":
                    break
                results.insert(0, content_text(message.get("content")))
            return reply | {"text": "The tool returned: " + "\n".join(results)}
        text = last_user_text(body)
        if slow := re.search(r"\[\[SLOW:([\d.]+)\]\]", text):
            reply["wait"] = float(slow[1])
        if tool := re.search(r"\[\[TOOL:(\S+) (.*?)\]\]", text, re.DOTALL):
            call = {
                "id": f"call_fake_{n:04d}",
                "type": "function",
                "function": {"name": tool[1], "arguments": tool[2]},
            }
            return reply | {"text": "I will use a tool.", "tool_calls": [call]}
        if long := re.search(r"\[\[LONG:(\d+)\]\]", text):
            words = [LOREM[i % len(LOREM)] for i in range(int(long[1]))]
            reply["chunk_delay"] = max(self.delta_delay, self.long_word_delay)
            return reply | {"text": " ".join(words), "split_words": True}
        return reply | {"text": f"You said: {text}"}


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            fake._record(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, {}))
            if self.path.split("?")[0].endswith("/models"):
                self._json(200, {"object": "list", "data": []})
            else:
                self._error(404, "not_found", f"no route {self.path}")

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            body = json.loads(raw or b"{}")
            path = self.path.split("?")[0]
            fake._record(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if path == "/_admin":
                fake.configure(**body)
                self._json(200, {"ok": True})
            elif path.endswith("/chat/completions"):
                self._chat(body)
            else:
                self._error(404, "not_found", f"no route {path}")

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, kind: str, message: str) -> None:
            error = {"message": message, "type": kind, "param": None, "code": kind}
            self._json(status, {"error": error})

        def _chat(self, body: dict[str, Any]) -> None:
            n = fake._next_id()
            plan = fake.plan(body, n)
            if plan["status"] is not None:
                status = plan["status"]
                kind = ERROR_TYPES.get(status, "server_error")
                self._error(status, kind, f"fake {kind} ({status})")
                return
            time.sleep(plan["wait"])
            completion_id = f"chatcmpl-fake-{n:06d}"
            model = body.get("model", "gpt-fake")
            finish = "tool_calls" if plan["tool_calls"] else "stop"
            if not body.get("stream"):
                message: dict[str, Any] = {"role": "assistant", "content": plan["text"]}
                if plan["tool_calls"]:
                    message["tool_calls"] = plan["tool_calls"]
                choice = {"index": 0, "message": message, "finish_reason": finish}
                self._json(
                    200,
                    {
                        "id": completion_id,
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [choice],
                        "usage": plan["usage"],
                    },
                )
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            # the client may go away mid-stream (an interrupt): stop writing then
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._stream(completion_id, model, plan, finish, include_usage)

        def _chunk(self, base: dict[str, Any], delta: dict[str, Any], finish: str | None) -> None:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            self._send(base | {"choices": [choice]})

        def _send(self, payload: dict[str, Any] | str) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def _stream(
            self,
            completion_id: str,
            model: str,
            plan: dict[str, Any],
            finish: str,
            include_usage: bool,
        ) -> None:
            base = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
            }
            text = plan["text"]
            if plan["split_words"]:
                pieces = re.findall(r"\S+\s*", text)
            else:
                pieces = [text[i : i + 20] for i in range(0, len(text), 20)]
            self._chunk(base, {"role": "assistant", "content": ""}, None)
            for piece in pieces:
                if plan["chunk_delay"]:
                    time.sleep(plan["chunk_delay"])
                self._chunk(base, {"content": piece}, None)
            for i, call in enumerate(plan["tool_calls"]):
                self._chunk(base, {"tool_calls": [call | {"index": i}]}, None)
            self._chunk(base, {}, finish)
            if include_usage:
                self._send(base | {"choices": [], "usage": plan["usage"]})
            self._send("[DONE]")

    return Handler

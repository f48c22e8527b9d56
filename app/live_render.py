"""A streaming message rendered now and then as it grows, in a worker thread.

Rendering (markdown-it, Pygments, nh3) a long message takes tens of milliseconds (the
project's README, 57 kB: 25 ms in session 33), and a streaming message is rendered whole
each time: on the event loop a long reply would stall every other conversation. In a
worker thread the loop keeps running (the GIL is handed over every few milliseconds), and
the pause between two renderings grows with the text it would render and with what the
last one took, so rendering (and sending its HTML to every tab) stays a small share: a
text growing faster than RENDER_CHARS_PER_SECOND, which no one reads as it comes, stays
plain until it slows down or ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from app.render import render_partial

log = logging.getLogger(__name__)

RENDER_SECONDS = 0.1  # the shortest pause between two renderings of a message
RENDER_CHARS_PER_SECOND = 100_000  # and longer for long texts: 0.5 s at 50,000 characters
RENDER_SHARE = 5  # and at least this many times what the last rendering took


def utf16_length(text: str) -> int:
    """The text's length as JavaScript counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le")) // 2


class LiveRender:
    """Renders one streaming message's text, off the loop, at most every so often."""

    def __init__(self, text: Callable[[], str], emit: Callable[[str, int], None]) -> None:
        self.text = text  # the text so far
        self.emit = emit  # (html, how much of the text it renders, in UTF-16 units)
        self.due = 0.0  # monotonic time from which the next rendering may start
        self.since = time.monotonic()  # when the last rendering was sent (or the message began)
        self.busy = False
        self.dirty = False  # text arrived while a rendering ran
        self.closed = False
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the timer's (set with the first)

    def poke(self) -> None:
        """More text arrived: render now if due, else once due."""
        if self.closed:
            return
        if self.busy:
            self.dirty = True
            return
        if self.timer is not None:  # a rendering is due: it reads the text when it fires
            return
        wait = self.due - time.monotonic()
        if wait > 0:
            self._arm(wait)
            return
        self._start()

    def noted(self) -> bool:
        """True when more text needs no poke: a rendering is due (timer) or follows this one.

        A poke then changes nothing (the streaming path skips a call per delta). Read from
        any thread: both states end on the loop only after the text is read again.
        """
        return self.timer is not None or (self.busy and self.dirty)

    def close(self) -> None:
        """The message is done: render nothing more. From any thread (the storage writer's).

        The timer is cancelled on its loop: uvloop's timers are not thread-safe, and one
        cancelled from the writer thread can corrupt the loop's timers (the cause found for
        test processes that died with a segfault in a later, unrelated timer's cancel).
        """
        self.closed = True  # a timer that fires meanwhile renders nothing
        timer, self.timer = self.timer, None
        if timer is not None and self.loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: its timers went with it
                self.loop.call_soon_threadsafe(timer.cancel)

    def _arm(self, wait: float) -> None:
        """Render once `wait` seconds have passed (on the loop)."""
        self.loop = loop = asyncio.get_running_loop()
        self.timer = loop.call_later(wait, self._fire)

    def _fire(self) -> None:
        self.timer = None
        self.poke()

    def _start(self) -> None:
        text = self.text()
        wait = self.since + len(text) / RENDER_CHARS_PER_SECOND - time.monotonic()
        if wait > 0:  # the text grew faster than it may be rendered: later, if still streaming
            self._arm(wait)
            return
        self.busy, self.dirty = True, False
        started = time.monotonic()
        future = asyncio.get_running_loop().run_in_executor(None, render_partial, text)
        future.add_done_callback(lambda done: self._done(done, text, started))

    def _done(self, future: asyncio.Future[str], text: str, started: float) -> None:
        self.busy = False
        if self.closed or future.cancelled():
            return
        if (error := future.exception()) is not None:
            log.warning("rendering a streaming message failed: %r", error)
            return
        now = time.monotonic()
        # (_start waits longer when the text it finds is long)
        self.due = now + max(RENDER_SECONDS, RENDER_SHARE * (now - started))
        self.since = now
        self.emit(future.result(), utf16_length(text))
        if self.dirty:
            self.poke()

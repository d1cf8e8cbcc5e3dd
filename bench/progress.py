"""What `make bench` says while it runs: a line as each part starts, after each round of the
parts measured in rounds, every `HEARTBEAT_S` seconds of a part that says nothing else, and
as the part ends.

Every line is flushed as it is written, so `make bench | tee bench.log` shows a part's
progress while it runs, not everything at the end.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import TextIO

HEARTBEAT_S = 15.0


def say(text: str, out: TextIO | None = None) -> None:
    """Print one line and flush it (a pipe would otherwise hold it until exit)."""
    print(text, file=out or sys.stdout, flush=True)


class Parts:
    """Announces the parts of one run, `total` of them, and times each one."""

    def __init__(
        self, total: int, out: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S
    ) -> None:
        self.total = total
        self.out = out
        self.heartbeat_s = heartbeat_s
        self.seconds: dict[str, float] = {}
        self._started = 0
        self._label = ""
        self._last_said = 0.0
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        """A line about the part under way, e.g. `[bench 2/9] sync: round 3/7`."""
        with self._lock:
            say(f"{self._label}: {text}" if self._label else text, self.out)
            self._last_said = time.monotonic()

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Run a part: say so, keep saying so while it is quiet, then say how long it took."""
        global _current
        self._label = self._next(name)
        start = time.perf_counter()
        stop = threading.Event()
        # A thread, not a task: the parts block their event loops and their threads alike.
        beat = threading.Thread(target=self._heartbeat, args=(stop, start), daemon=True)
        self.say("started")
        beat.start()
        previous, _current = _current, self
        try:
            yield
        finally:
            _current = previous
            stop.set()
            beat.join()
            took = round(time.perf_counter() - start, 1)
            self.seconds[name] = took
            self.say(f"done in {took:.1f} s")
            self._label = ""

    def skip(self, name: str, why: str) -> None:
        """A part that does not run here, counted so the numbering stays whole."""
        self._label = self._next(name)
        self.say(why)
        self._label = ""

    def _next(self, name: str) -> str:
        self._started += 1
        return f"[bench {self._started}/{max(self.total, self._started)}] {name}"

    def _heartbeat(self, stop: threading.Event, start: float) -> None:
        while not stop.wait(self.heartbeat_s / 3):
            if time.monotonic() - self._last_said >= self.heartbeat_s:
                self.say(f"still running, {time.perf_counter() - start:.0f} s so far")


_current: Parts | None = None


def round_done(done: int, rounds: int) -> None:
    """Called by `bench.rounds` after each round; says it when a part is under way."""
    if _current is not None:
        _current.say(f"round {done}/{rounds}")

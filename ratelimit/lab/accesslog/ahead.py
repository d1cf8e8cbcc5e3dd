"""Reading ahead: the next chunks of a log are parsed in a thread of their own while the
caller works on the one before, so that reading and planning share the machine's cores.

The chunks arrive in the order they were made, so what the caller sees is what it would
see without the thread; only when they are made changes. At most `depth` chunks wait
at once, so memory stays bounded. An exception raised while reading reaches the caller
at the point the chunk would have come, and a caller that stops early (an error, a
`break`) stops the reading too: the reader's own clean-up (closing the file) runs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()
_POLL_S = 0.05  # how often a full queue looks whether the caller has gone


def ahead(chunks: Generator[T, None, None], depth: int) -> Iterator[T]:
    """The items of `chunks`, made up to `depth` ahead in a thread; `depth` 0 makes
    them here, one at a time, when asked."""
    if depth <= 0:
        yield from chunks
        return
    waiting: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    gone = threading.Event()

    def hand_over(item: object, error: BaseException | None = None) -> bool:
        while not gone.is_set():
            try:
                waiting.put((item, error), timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in chunks:
                if not hand_over(item):
                    return
        except BaseException as exc:  # the caller raises it, where the chunk would be
            hand_over(_END, exc)
        else:
            hand_over(_END)
        finally:
            chunks.close()  # the reader's clean-up runs in the thread that ran it

    thread = threading.Thread(target=produce, name="ratelimit-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = waiting.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item  # type: ignore[misc]
    finally:
        gone.set()
        thread.join()

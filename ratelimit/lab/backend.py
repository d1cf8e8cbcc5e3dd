"""Which Redis a chapter runs on: `REDIS_URL`, else a private redis-server, else the
embedded fakeredis. One helper for every chapter that needs a real server.

    with backend.choose() as redis_for_memory:        # REDIS_URL, private, or embedded
        client = redis_for_memory.sync_client(socket_timeout=30)
        redis_for_memory.real                          # False on the embedded backend

    with backend.choose(shared=False) as target:       # never a shared Redis: flushes,
        ...                                            # restarts and pauses are safe

A private server is started only when `redis-server` is installed (and `private=True`),
keeps nothing on disk unless `server_args` say so, and is stopped, by PID, by `close()`
or on leaving the `with` block. The embedded backend's sync and async clients share one
in-process server, so both see the same keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

import fakeredis
import redis
import redis.asyncio

from ratelimit.devtools.process import Managed
from ratelimit.devtools.server import RedisServer

__all__ = ["Backend", "choose"]

Kind = Literal["url", "private", "embedded"]


@dataclass
class Backend(Managed):
    """A Redis to run on, and how to reach it."""

    kind: Kind
    url: str | None = None
    server: RedisServer | None = None
    _embedded: fakeredis.FakeServer = field(default_factory=fakeredis.FakeServer, repr=False)

    @property
    def real(self) -> bool:
        """True for a real redis-server (REDIS_URL or private), False when embedded."""
        return self.kind != "embedded"

    @property
    def description(self) -> str:
        """What it is, in words, without machine details (ports, PIDs)."""
        return {
            "url": "the Redis at REDIS_URL",
            "private": "a private redis-server",
            "embedded": "the embedded fakeredis",
        }[self.kind]

    def sync_client(self, **kwargs: Any) -> Any:
        """A new `redis.Redis` (keyword arguments go to `from_url`), or a FakeRedis."""
        if self.url is None:
            return fakeredis.FakeRedis(server=self._embedded)
        return redis.Redis.from_url(self.url, **kwargs)

    def async_client(self, **kwargs: Any) -> Any:
        """A new `redis.asyncio.Redis`, or a FakeAsyncRedis on the same embedded data."""
        if self.url is None:
            return fakeredis.FakeAsyncRedis(server=self._embedded)
        return redis.asyncio.Redis.from_url(self.url, **kwargs)

    def set_down(self, down: bool) -> None:
        """Take Redis away (`down=True`) or bring it back: a private server is stopped,
        and started again on the same port (once it has loaded its data); the embedded
        one refuses every command meanwhile, as a stopped server would. A shared Redis
        (REDIS_URL) is never stopped: ValueError."""
        if self.kind == "url":
            raise ValueError("a shared Redis (REDIS_URL) is never stopped by the lab")
        if self.server is None:
            self._embedded.connected = not down
        elif down:
            self.server.stop()
        else:
            self.server.start()

    def start(self) -> Backend:
        return self

    def close(self) -> None:
        """Stop the private server, if this backend started one."""
        if self.server is not None:
            self.server.close()


def choose(
    *, shared: bool = True, private: bool = True, server_args: tuple[str, ...] = ()
) -> Backend:
    """The Redis to run on: `REDIS_URL` when set and `shared` allows it; else a private
    redis-server (with `server_args`) when `private` and one is installed; else the
    embedded fakeredis."""
    url = os.environ.get("REDIS_URL")
    if shared and url:
        return Backend("url", url)
    if private and RedisServer.available():
        server = RedisServer(args=server_args).start()
        return Backend("private", server.url, server)
    return Backend("embedded")

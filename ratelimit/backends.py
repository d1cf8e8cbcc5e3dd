"""Redis clients: a real server when a URL is given, else the embedded fakeredis.

`connect()` gives an asyncio client for the limiters in `ratelimit`, and
`connect_sync()` a synchronous one for `ratelimit.sync`. With no URL and no
`REDIS_URL` in the environment both return an in-process fakeredis with Lua, so
everything runs on a fresh machine with no server; each call makes a new, empty one.
"""

from __future__ import annotations

import os
from typing import Any

import fakeredis
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry


def _url(url: str | None, embedded: bool) -> str | None:
    if embedded:
        return None
    return url or os.environ.get("REDIS_URL") or None


def connect(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> redis.asyncio.Redis:
    """An asyncio client for `url` (or `REDIS_URL`), else an embedded fakeredis.

    `embedded=True` always gives the embedded one, whatever `REDIS_URL` says (for
    notebooks whose output must not depend on the machine).
    """
    url = _url(url, embedded)
    if url is None:
        return fakeredis.FakeAsyncRedis()
    return redis.asyncio.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def connect_sync(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> redis.Redis:
    """A synchronous client for `url` (or `REDIS_URL`), else an embedded fakeredis."""
    url = _url(url, embedded)
    if url is None:
        return fakeredis.FakeRedis()
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def is_embedded(client: Any) -> bool:
    """True for an in-process fakeredis client (no server, no real memory figures)."""
    return isinstance(client, fakeredis.FakeRedis | fakeredis.FakeAsyncRedis)


def bounded_client(client: Any, timeout: float) -> Any:
    """A sync client on the same server whose every command gives up after `timeout`.

    A synchronous call cannot be cancelled from outside, and redis-py's default
    retries alone can wait seconds for a server that is down. So the limiter talks
    through its own pool with the caller's settings, socket timeouts of `timeout`
    and no retries of its own (the limiter retries a dropped connection once itself).
    Clients without a connection pool (Redis Cluster) are used as they are.
    """
    pool = getattr(client, "connection_pool", None)
    if pool is None or is_embedded(client):
        return client
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    own = type(pool)(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return redis.Redis(connection_pool=own)

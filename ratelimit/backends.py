"""Redis clients: a real server when a URL is given, else the embedded fakeredis.

`connect()` gives an asyncio client for the limiters in `ratelimit`, and
`connect_sync()` a synchronous one for `ratelimit.sync`. With no URL and no
`REDIS_URL` in the environment both return an in-process fakeredis with Lua, so
everything runs on a fresh machine with no server; each call makes a new, empty one.

A Redis Cluster is named by its own scheme, so a plain URL can never be taken for one:

    redis+cluster://[[user]:[password]@]host:port[,host:port...][/0][?option=value&...]
    rediss+cluster://...   (the same over TLS)

Every `host:port` is a seed node: the client asks the first one that answers for the
slot map and then talks to every master directly, so listing several seeds lets it
start while one node is down. Options are redis-py's (as in a `redis://` URL); a path
other than `/0` is an error, since a cluster has only database 0. For such a URL
`connect()` returns a `redis.asyncio.RedisCluster` and `connect_sync()` a
`redis.RedisCluster`, with the same timeouts as for a single server.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import cluster_client

# The cluster schemes and the single-server scheme each stands for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# CLUSTER_RETRIES: cluster clients from `connect()` do not retry by themselves, like
# redis-py's single-server clients from a URL; the limiters retry a dropped connection
# once. redis-py's default (3 retries, each after a refresh of the whole slot map,
# pure Python) turned one node outage into seconds of blocked event loop on a busy
# host: asyncio checks overshot their timeout by up to 4 s, against < 0.3 s without.


def _fakeredis() -> Any:
    # Imported on first use: a service that talks to a real Redis never loads it (and
    # fakeredis loads numpy whenever numpy is installed).
    import fakeredis

    return fakeredis


def _url(url: str | None, embedded: bool) -> str | None:
    if embedded:
        return None
    return url or os.environ.get("REDIS_URL") or None


def connect(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> redis.asyncio.Redis | redis.asyncio.RedisCluster:
    """An asyncio client for `url` (or `REDIS_URL`), else an embedded fakeredis.

    `embedded=True` always gives the embedded one, whatever `REDIS_URL` says (for
    notebooks whose output must not depend on the machine).
    """
    url = _url(url, embedded)
    if url is None:
        return _fakeredis().FakeAsyncRedis()
    if is_cluster_url(url):
        first, seeds = parse_cluster_url(url)
        return redis.asyncio.RedisCluster.from_url(
            first,
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in seeds[1:]],
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=AsyncRetry(NoBackoff(), 0),  # see CLUSTER_RETRIES
        )
    return redis.asyncio.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def connect_sync(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> redis.Redis | redis.RedisCluster:
    """A synchronous client for `url` (or `REDIS_URL`), else an embedded fakeredis."""
    url = _url(url, embedded)
    if url is None:
        return _fakeredis().FakeRedis()
    if is_cluster_url(url):
        first, seeds = parse_cluster_url(url)
        return redis.RedisCluster.from_url(
            first,
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds[1:]],
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # see CLUSTER_RETRIES
        )
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def is_cluster_url(url: str) -> bool:
    """True for a `redis+cluster://` or `rediss+cluster://` URL."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> tuple[str, list[tuple[str, int]]]:
    """Split a cluster URL into a plain URL for its first seed (credentials and
    options kept, for redis-py's `from_url`) and the list of all seeds (host, port).

    ValueError for anything else: another scheme, a seed without a port, a database
    other than 0.
    """
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if not sep or plain is None:
        raise ValueError(f"not a redis+cluster:// or rediss+cluster:// URL: {url!r}")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    if path not in ("", "/", "/0"):
        raise ValueError(f"a Redis Cluster has only database 0; remove {path!r} from the URL")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds, netlocs = [], []
    for part in hosts.split(","):
        try:
            parsed = urlsplit(f"//{part}")
            host, port = parsed.hostname, parsed.port
        except ValueError as exc:
            raise ValueError(f"bad node {part!r} in cluster URL: {exc}") from None
        if not host or port is None:
            raise ValueError(f"every node in a cluster URL is host:port, got {part!r}")
        seeds.append((host, port))
        netlocs.append(part)
    first = f"{plain}://{userinfo}{at}{netlocs[0]}" + (f"?{query}" if query else "")
    return first, seeds


def is_embedded(client: Any) -> bool:
    """True for an in-process fakeredis client (no server, no real memory figures)."""
    fake = sys.modules.get("fakeredis")  # not imported yet: no client can be one
    return fake is not None and isinstance(client, fake.FakeRedis | fake.FakeAsyncRedis)


# One bounded client per (caller's client, timeout): limiters built alike, such as the
# copies `with_options` makes, share its pool instead of opening one each.
_BOUNDED: weakref.WeakKeyDictionary[Any, dict[float, Any]] = weakref.WeakKeyDictionary()


def bounded_client(client: Any, timeout: float) -> Any:
    """A sync client on the same server whose every command gives up after `timeout`.

    A synchronous call cannot be cancelled from outside, and redis-py's default
    retries alone can wait seconds for a server that is down. So the limiter talks
    through its own pool with the caller's settings, socket timeouts of `timeout`
    and no retries of its own (the limiter retries a dropped connection once itself).
    A `redis.RedisCluster` gets the same treatment (see `cluster_client.bounded_cluster`).
    """
    cluster = isinstance(client, redis.RedisCluster)
    if is_embedded(client) or not (cluster or getattr(client, "connection_pool", None)):
        return client
    try:
        made = _BOUNDED.setdefault(client, {})
    except TypeError:  # not weak-referenceable: make one for this limiter alone
        made = {}
    if timeout not in made:
        made[timeout] = _bounded(client, timeout)
    return made[timeout]


def _bounded(client: Any, timeout: float) -> Any:
    if isinstance(client, redis.RedisCluster):
        return cluster_client.bounded_cluster(client, timeout)
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    own = type(pool)(
        connection_class=pool.connection_class, max_connections=pool.max_connections, **kwargs
    )
    return redis.Redis(connection_pool=own)

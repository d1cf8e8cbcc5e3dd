"""Redis clients: a real server when a URL is given, else the embedded fakeredis.

`connect()` gives an asyncio client for the limiters in `ratelimit`, and
`connect_sync()` a synchronous one for `ratelimit.sync`. With no URL and an unset or
empty `REDIS_URL` both fall back on an in-process fakeredis with Lua (the `embedded`
extra, `pip install 'ratelimit-lab[embedded]'`), so everything runs on a fresh machine
with no server; each call makes a new, empty one. A process falling back on it is told
so once, with an `EmbeddedRedisWarning`: every process then counts on its own, so two
workers admit twice the limit. Without fakeredis installed there is no fallback: the
call fails, saying to set `REDIS_URL` or install the extra. `embedded=True` asks for
the embedded one on purpose, whatever `REDIS_URL` says, and is not warned about.

A Redis Cluster is named by its own scheme, so a plain URL can never be taken for one:

    redis+cluster://[[user]:[password]@]host:port[,host:port...][/0][?option=value&...]
    rediss+cluster://...   (the same over TLS)

Every `host:port` is a seed node: the client asks the first one that answers for the
slot map and then talks to every master directly, so listing several seeds lets it
start while one node is down. Options are redis-py's (as in a `redis://` URL); a path
other than `/0` is an error, since a cluster has only database 0. For such a URL
`connect()` returns a `redis.asyncio.RedisCluster` and `connect_sync()` a
`redis.RedisCluster`, with the same timeouts as for a single server.

A primary with replicas watched by Redis Sentinel is named by the Sentinels:

    redis+sentinel://[[user]:[password]@]host:port[,host:port...]/service_name[/db][?option=value&...]
    rediss+sentinel://...   (the same over TLS, to the Sentinels and the servers)

Every `host:port` is a Sentinel; `service_name` is the name they monitor. The
credentials, the database and the options are those of the Redis servers (as in a
`redis://` URL), except `sentinel_username` and `sentinel_password`, which are sent
to the Sentinels. `connect()` and `connect_sync()` return the master client of
redis-py's Sentinel support (`master_for(service_name)`): each new connection asks
the Sentinels where the primary is, and one to a primary that became a replica fails
(READONLY turns into ConnectionError), so the limiters' failure policy answers while
a failover is under way and the checks after it go to the promoted replica. Both the
Sentinels and the servers get the same timeouts as a single server, and no retries.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.exceptions
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import cluster_client

# The cluster schemes and the single-server scheme each stands for.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}

# The clients the limiters take: `ratelimit`'s an asyncio one, `ratelimit.sync`'s a
# blocking one (fakeredis's and Sentinel's master clients are subclasses of these).
AsyncClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.RedisCluster
SyncClient: TypeAlias = redis.Redis | redis.RedisCluster

# CLUSTER_RETRIES: cluster clients from `connect()` do not retry by themselves, like
# redis-py's single-server clients from a URL; the limiters retry a dropped connection
# once. redis-py's default (3 retries, each after a refresh of the whole slot map,
# pure Python) turned one node outage into seconds of blocked event loop on a busy
# host: asyncio checks overshot their timeout by up to 4 s, against < 0.3 s without.


class EmbeddedRedisWarning(UserWarning):
    """`connect()` or `connect_sync()` was given no Redis (no URL, `REDIS_URL` unset or
    empty) and fell back on the embedded fakeredis: this process's limits are its own.
    Issued once per process; `embedded=True` asks for the embedded Redis without it."""


EMBEDDED_EXTRA = "ratelimit-lab[embedded]"

# Whether this process has been told it fell back on the embedded Redis.
_fallback_announced = False


def _fakeredis(asked: bool) -> Any:
    # Imported on first use: a service that talks to a real Redis never loads it (and
    # fakeredis loads numpy whenever numpy is installed).
    try:
        import fakeredis
    except ImportError as exc:
        why = (
            "embedded=True needs the embedded Redis (fakeredis)"
            if asked
            else "no Redis named: no URL given and REDIS_URL is unset or empty"
        )
        raise RuntimeError(
            f"{why}, and fakeredis is not installed. Set REDIS_URL (or pass a URL) to "
            f"use a real Redis, or install the embedded one: pip install '{EMBEDDED_EXTRA}'"
        ) from exc
    return fakeredis


def configured_url(url: str | None = None) -> str | None:
    """The Redis `connect()` would use: `url`, else `REDIS_URL`; None when neither names
    one (an empty or blank value names none)."""
    for candidate in (url, os.environ.get("REDIS_URL")):
        if candidate and candidate.strip():
            return candidate.strip()
    return None


def redact_url(url: str) -> str:
    """`url` without its password, for logs and reports."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _url(url: str | None, embedded: bool) -> str | None:
    return None if embedded else configured_url(url)


def _fallback(embedded: bool) -> Any:
    """fakeredis for a client nobody named a server for, saying so once per process
    unless the caller asked for it."""
    global _fallback_announced
    module = _fakeredis(embedded)
    if not embedded and not _fallback_announced:
        _fallback_announced = True
        warnings.warn(
            "no Redis named (REDIS_URL is unset or empty): using the embedded fakeredis, "
            "an in-memory Redis inside this process. Each process gets its own, empty "
            "Redis, so limits are not shared between workers or hosts and vanish on exit. "
            "Set REDIS_URL for a real Redis, or pass embedded=True to ask for this one.",
            EmbeddedRedisWarning,
            stacklevel=3,
        )
    return module


def connect(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> AsyncClient:
    """An asyncio client for `url` (or `REDIS_URL`), else an embedded fakeredis, announced
    once per process with an `EmbeddedRedisWarning` (RuntimeError when fakeredis is not
    installed).

    `embedded=True` always gives the embedded one, whatever `REDIS_URL` says, without a
    warning (for notebooks whose output must not depend on the machine).
    """
    url = _url(url, embedded)
    if url is None:
        embedded_client: redis.asyncio.Redis = _fallback(embedded).FakeAsyncRedis()
        return embedded_client
    if is_cluster_url(url):
        first, seeds = parse_cluster_url(url)
        return redis.asyncio.RedisCluster.from_url(
            first,
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in seeds[1:]],
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=AsyncRetry(NoBackoff(), 0),  # see CLUSTER_RETRIES
        )
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        bounded = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        sentinel = redis.asyncio.sentinel.Sentinel(
            target.sentinels,
            sentinel_kwargs={
                **target.sentinel_kwargs,
                **bounded,
                "retry": AsyncRetry(NoBackoff(), 0),
            },
            **target.server_kwargs,
        )
        primary: redis.asyncio.Redis = sentinel.master_for(
            target.service,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=AsyncRetry(NoBackoff(), 0),
        )
        return primary
    return redis.asyncio.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def connect_sync(
    url: str | None = None, *, timeout: float = 1.0, embedded: bool = False
) -> SyncClient:
    """A synchronous client for `url` (or `REDIS_URL`), else an embedded fakeredis; as
    `connect()`, warning and errors included."""
    url = _url(url, embedded)
    if url is None:
        embedded_sync: redis.Redis = _fallback(embedded).FakeRedis()
        return embedded_sync
    if is_cluster_url(url):
        first, seeds = parse_cluster_url(url)
        return redis.RedisCluster.from_url(
            first,
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds[1:]],
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # see CLUSTER_RETRIES
        )
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        bounded = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        sentinel = redis.sentinel.Sentinel(
            target.sentinels,
            sentinel_kwargs={**target.sentinel_kwargs, **bounded, "retry": Retry(NoBackoff(), 0)},
            **target.server_kwargs,
        )
        primary_sync: redis.Redis = sentinel.master_for(
            target.service,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        return primary_sync
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
    plain, credentials, seeds, netlocs, path, query = _split_hosts(url, CLUSTER_SCHEMES, "node")
    if path not in ("", "/", "/0"):
        raise ValueError(f"a Redis Cluster has only database 0; remove {path!r} from the URL")
    first = f"{plain}://{credentials}{netlocs[0]}" + (f"?{query}" if query else "")
    return first, seeds


def is_sentinel_url(url: str) -> bool:
    """True for a `redis+sentinel://` or `rediss+sentinel://` URL."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


@dataclass(frozen=True)
class SentinelTarget:
    """What a Sentinel URL names: the Sentinels, the service, and the connection
    options for the servers and for the Sentinels (redis-py keyword arguments)."""

    sentinels: list[tuple[str, int]]
    service: str
    server_kwargs: dict[str, Any]
    sentinel_kwargs: dict[str, Any]


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split a Sentinel URL (see the module docstring) into a `SentinelTarget`.

    ValueError naming the problem for anything else: another scheme, no Sentinel, a
    Sentinel without a port, no service name, a database that is not an integer.
    """
    plain, credentials, sentinels, _, path, query = _split_hosts(url, SENTINEL_SCHEMES, "Sentinel")
    parts = path.strip("/").split("/") if path.strip("/") else []
    if not parts:
        raise ValueError(
            "a Sentinel URL names its service (redis+sentinel://host:port/service_name), "
            f"got {url!r}"
        )
    if len(parts) > 2:
        raise ValueError(f"a Sentinel URL's path is /service_name[/db], got {path!r}")
    service, db = parts[0], parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"the database in a Sentinel URL is an integer, got {db!r}")
    options = parse_qsl(query, keep_blank_values=True)
    to_sentinels = {k: v for k, v in options if k in ("sentinel_username", "sentinel_password")}
    rest_query = urlencode([(k, v) for k, v in options if k not in to_sentinels])
    # redis-py's own URL rules give the servers' options (credentials, db, TLS...).
    server = redis.connection.parse_url(
        f"{plain}://{credentials}127.0.0.1:1/{db}" + (f"?{rest_query}" if rest_query else "")
    )
    del server["host"], server["port"]
    sentinel_kwargs: dict[str, Any] = {
        k.removeprefix("sentinel_"): v for k, v in to_sentinels.items()
    }
    if server.pop("connection_class", None) is not None:  # rediss: TLS everywhere
        server["ssl"] = True
        sentinel_kwargs["ssl"] = True
        sentinel_kwargs.update({k: v for k, v in server.items() if k.startswith("ssl_")})
    return SentinelTarget(sentinels, service, server, sentinel_kwargs)


def _split_hosts(
    url: str, schemes: dict[str, str], noun: str
) -> tuple[str, str, list[tuple[str, int]], list[str], str, str]:
    """Take apart a URL that names several servers (a cluster's seeds, the Sentinels):
    the plain scheme it stands for, its "user:password@" ("" when none), each server's
    (host, port) and text as written, its path and its query.

    ValueError naming the problem for another scheme or a server that is not host:port.
    """
    scheme, sep, rest = url.partition("://")
    plain = schemes.get(scheme.lower())
    if not sep or plain is None:
        names = " or ".join(f"{name}://" for name in schemes)
        raise ValueError(f"not a {names} URL: {url!r}")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    path, _, query = tail.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    servers, netlocs = [], []
    for part in hosts.split(","):
        try:
            parsed = urlsplit(f"//{part}")
            host, port = parsed.hostname, parsed.port
        except ValueError as exc:
            raise ValueError(f"bad {noun} {part!r} in URL: {exc}") from None
        if not host or port is None:
            raise ValueError(f"every {noun} in the URL is host:port, got {part!r}")
        servers.append((host, port))
        netlocs.append(part)
    return plain, userinfo + at, servers, netlocs, path, query


def is_embedded(client: Any) -> bool:
    """True for an in-process fakeredis client (no server, no real memory figures)."""
    fake = sys.modules.get("fakeredis")  # not imported yet: no client can be one
    # FakeStrictRedis is a sibling of FakeRedis, not a subclass.
    return fake is not None and isinstance(
        client, fake.FakeRedis | fake.FakeStrictRedis | fake.FakeAsyncRedis
    )


def require_kind(client: object, asyncio: bool, limiter: type) -> None:
    """TypeError naming the limiter to use instead when `client` is a redis-py client of
    the other kind: a blocking one given to an asyncio limiter, or the reverse (its
    checks would fail only later, and obscurely). Any other object (a wrapper that is
    no redis-py client) is taken as it is."""
    other: tuple[type, ...] = (
        (redis.Redis, redis.RedisCluster)
        if asyncio
        else (redis.asyncio.Redis, redis.asyncio.RedisCluster)
    )
    if not isinstance(client, other):
        return
    # The limiter of the same algorithm in the other module: the first of the library's
    # classes the limiter is (a user's subclass names the class it builds on).
    here = "ratelimit.limiters" if asyncio else "ratelimit.sync"
    base = next((c.__name__ for c in limiter.__mro__ if c.__module__ == here), "")
    there = "ratelimit.sync" if asyncio else "ratelimit"
    instead = (
        f"{there}.{base}"
        if base and base not in ("AsyncLimiter", "SyncLimiter")
        else f"the limiters of {there}"
    )
    takes = "a redis.asyncio client" if asyncio else "a synchronous client (redis.Redis)"
    raise TypeError(
        f"{_public_name(limiter)} takes {takes}; for a {_client_name(client)} use {instead}"
    )


def _public_name(cls: type) -> str:
    """`cls` as a user imports it: ratelimit.limiters' classes from `ratelimit`."""
    module = {"ratelimit.limiters": "", "ratelimit.sync": "ratelimit.sync."}.get(
        cls.__module__, f"{cls.__module__}."
    )
    return f"{module}{cls.__qualname__}"


def _client_name(client: object) -> str:
    """What kind of client `client` is, by the name it is imported as."""
    if type(client).__module__.startswith("fakeredis"):
        if isinstance(client, redis.asyncio.Redis):
            return "fakeredis.FakeAsyncRedis"
        return f"fakeredis.{type(client).__name__}"
    kinds: tuple[tuple[type, str], ...] = (
        (redis.asyncio.RedisCluster, "redis.asyncio.RedisCluster"),
        (redis.asyncio.Redis, "redis.asyncio.Redis"),
        (redis.RedisCluster, "redis.RedisCluster"),
    )
    return next((name for kind, name in kinds if isinstance(client, kind)), "redis.Redis")


# One bounded client per (caller's client, timeout): limiters built alike, such as the
# copies `with_options` makes, share its pool instead of opening one each.
_BOUNDED: weakref.WeakKeyDictionary[Any, dict[float, Any]] = weakref.WeakKeyDictionary()


def bounded_client(client: Any, timeout: float) -> Any:
    """A sync client on the same server whose every command gives up after `timeout`.

    A synchronous call cannot be cancelled from outside, and redis-py's default
    retries alone can wait seconds for a server that is down. So the limiter talks
    through its own pool with the caller's settings, socket timeouts of `timeout`
    and no retries of its own (the limiter retries a dropped connection once itself).
    A `redis.RedisCluster` gets the same treatment (see `cluster_client.bounded_cluster`),
    and so does a Sentinel master client (its Sentinels too).
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
    common = {"connection_class": pool.connection_class, "max_connections": pool.max_connections}
    if isinstance(pool, redis.BlockingConnectionPool):
        # It waits for a free connection itself: at most `timeout` too (its own default,
        # 20 s, would hold a check that long).
        wait = timeout if pool.timeout is None else min(pool.timeout, timeout)
        common.update(timeout=wait, queue_class=pool.queue_class)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        # Its connections find the primary through the pool (their `connection_pool`
        # option, which the copy sets for itself) and the Sentinels, asked with the
        # same bound.
        del kwargs["connection_pool"]
        own: Any = type(pool)(
            pool.service_name, _bounded_sentinel(pool.sentinel_manager, timeout),
            is_master=pool.is_master, check_connection=pool.check_connection,
            **common, **kwargs,
        )  # fmt: skip
    else:
        own = type(pool)(**common, **kwargs)
    return redis.Redis(connection_pool=own)


def _bounded_sentinel(manager: redis.sentinel.Sentinel, timeout: float) -> redis.sentinel.Sentinel:
    """The same Sentinels, asked with socket timeouts of `timeout` and no retries."""
    addresses = [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in manager.sentinels
    ]
    kwargs = dict(manager.sentinel_kwargs)
    kwargs.update(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    return redis.sentinel.Sentinel(
        addresses, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=kwargs,
        force_master_ip=manager._force_master_ip, **manager.connection_kwargs,
    )  # fmt: skip

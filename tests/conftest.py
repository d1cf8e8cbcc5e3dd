"""Backends for the tests: the embedded fakeredis, a real Redis, a private server.

A real Redis is found at REDIS_URL or 127.0.0.1:6379. Without one, the tests that
need it skip and say why; with CI=true they fail instead, since CI must prove the
limiter on a real server.

RATELIMIT_TASK_FACTORY=eager (`make test-eager`, Python 3.12+): every event loop the
tests make, pytest-asyncio's and asyncio.run's alike, runs its tasks with
`asyncio.eager_task_factory`, as a service that installs it does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

from ratelimit.clock import ManualClock
from ratelimit.devtools.cluster import LocalCluster
from ratelimit.devtools.server import RedisServer
from ratelimit.limiters import AsyncLimiter
from ratelimit.sync import SyncLimiter

REAL_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
IN_CI = os.environ.get("CI", "").lower() == "true"
TASK_FACTORY = os.environ.get("RATELIMIT_TASK_FACTORY", "")


class _EagerTaskLoops(asyncio.DefaultEventLoopPolicy):
    """New event loops start their tasks eagerly (`asyncio.eager_task_factory`)."""

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        loop.set_task_factory(asyncio.eager_task_factory)
        return loop


def pytest_configure(config: pytest.Config) -> None:
    if not TASK_FACTORY:
        return
    if TASK_FACTORY != "eager":
        raise pytest.UsageError(
            f"RATELIMIT_TASK_FACTORY={TASK_FACTORY!r}: the only one known is 'eager'"
        )
    if not hasattr(asyncio, "eager_task_factory"):
        raise pytest.UsageError(
            "RATELIMIT_TASK_FACTORY=eager needs asyncio.eager_task_factory (Python 3.12+); "
            f"this is Python {sys.version.split()[0]}"
        )
    # Set before pytest-asyncio's session fixture `event_loop_policy` reads the policy.
    asyncio.set_event_loop_policy(_EagerTaskLoops())


def pytest_report_header(config: pytest.Config) -> str:
    return f"event loops' task factory: {TASK_FACTORY or 'asyncio default'}"


def _missing(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a real Redis is required, not optional)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_redis_url() -> str:
    """URL of a reachable real Redis; skips (fails in CI) when there is none."""
    client = redis.Redis.from_url(REAL_URL, socket_timeout=1, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        _missing(f"no real Redis at {REAL_URL} ({exc}); set REDIS_URL or start redis-server")
    finally:
        client.close()
    return REAL_URL


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A key prefix of this test's own; its keys are deleted from the real Redis after."""
    value = f"test:{uuid.uuid4().hex[:12]}"
    yield value
    if "real_redis_url" in request.fixturenames or _uses_real(request):
        client = redis.Redis.from_url(REAL_URL, socket_timeout=2)
        try:
            keys = list(client.scan_iter(match=f"{value}:*", count=1000))
            if keys:
                client.delete(*keys)
        except redis.exceptions.RedisError:
            pass
        finally:
            client.close()


def _uses_real(request: pytest.FixtureRequest) -> bool:
    return getattr(request.node, "callspec", None) is not None and (
        request.node.callspec.params.get("backend") == "real"
    )


@pytest.fixture(params=["embedded", "real"])
def backend(request: pytest.FixtureRequest) -> str:
    """Runs a test once on fakeredis and once on a real Redis."""
    if request.param == "real":
        request.getfixturevalue("real_redis_url")
    return request.param


@pytest.fixture
async def client(backend: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client on the backend under test."""
    if backend == "embedded":
        c = fakeredis.FakeAsyncRedis()
    else:
        c = redis.asyncio.Redis.from_url(REAL_URL, socket_timeout=5)
    yield c
    await c.aclose()


@pytest.fixture
def sync_client(backend: str) -> Iterator[redis.Redis]:
    """A synchronous client on the backend under test."""
    c = fakeredis.FakeRedis() if backend == "embedded" else redis.Redis.from_url(REAL_URL)
    yield c
    c.close()


@pytest.fixture
def clock() -> ManualClock:
    """Virtual time, starting at a whole second (window boundaries line up)."""
    return ManualClock(1_000_000.0)


@pytest.fixture
def private_redis(tmp_path) -> Iterator[RedisServer]:
    """A redis-server of this test's own on a free loopback port, stopped afterwards."""
    if not RedisServer.available():
        _missing("redis-server is not installed; the private-server tests need it")
    with RedisServer(tmp_path) as server:  # `ratelimit.devtools.server`, shared with the notebooks
        yield server


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local Redis Cluster (3 masters, no replicas, free loopback ports) shared by the
    whole session: started once, stopped by PID at the end. Tests that stop or restart
    a node must leave it ok again (`cluster.wait_ready()`)."""
    if not LocalCluster.available():
        _missing("redis-server and redis-cli are needed for the Redis Cluster tests")
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as local:
        yield local


@pytest.fixture
def flush_after_script_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SCRIPT LOAD a limiter sends is followed at once by a SCRIPT FLUSH on the
    same server: the timing of another client's flush (or a failover) landing between
    the reload of a script and its call, made deterministic. The reload's round trip
    (see ratelimit.plan) is split in two around the flush."""
    sync_send, async_send = SyncLimiter._send, AsyncLimiter._send

    def parts(commands: list[Any]) -> tuple[list[Any], list[Any]]:
        return [commands[0], ("SCRIPT", "FLUSH")], commands[1:]

    def joined(loaded: Any, rest: Any) -> Any:
        for outcome in (loaded, rest):
            if isinstance(outcome, Exception):
                return outcome
        return [loaded[0], *rest]

    def sync_split(self: Any, key: Any, commands: list[Any]) -> Any:
        if commands[0][:2] != ("SCRIPT", "LOAD"):
            return sync_send(self, key, commands)
        load, rest = parts(commands)
        return joined(sync_send(self, key, load), sync_send(self, key, rest))

    async def async_split(self: Any, key: Any, commands: list[Any]) -> Any:
        if commands[0][:2] != ("SCRIPT", "LOAD"):
            return await async_send(self, key, commands)
        load, rest = parts(commands)
        return joined(await async_send(self, key, load), await async_send(self, key, rest))

    monkeypatch.setattr(SyncLimiter, "_send", sync_split)
    monkeypatch.setattr(AsyncLimiter, "_send", async_split)


@pytest.fixture
async def plain_clients() -> AsyncIterator[Callable[..., Any]]:
    """Makes plain redis-py clients from a URL, asyncio or sync; closes them after."""
    made: list[Any] = []

    def make(mode: str, url: str, **kwargs: Any) -> Any:
        cls = redis.asyncio.Redis if mode == "async" else redis.Redis
        made.append(cls.from_url(url, **kwargs))
        return made[-1]

    yield make
    for client in made:
        if isinstance(client, redis.asyncio.Redis):
            await client.aclose()
        else:
            client.close()

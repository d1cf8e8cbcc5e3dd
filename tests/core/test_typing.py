"""Typed signatures: wrong calls are rejected by mypy (tests/typing/wrong_calls.py) and,
for a client of the wrong kind, at run time with a TypeError naming the class to use.

`make test` runs `mypy` (pyproject.toml's [tool.mypy]: --strict over the library and
tests/typing/user_code.py) before pytest; here mypy runs on the file of wrong calls, whose
every line marked `# mypy: error` must be reported, and no other line.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.http
import ratelimit.sync

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
MARK = "# mypy: error"
NAMES = ["SlidingWindowLimiter", "FixedWindowLimiter", "SlidingWindowCounterLimiter",
         "TokenBucketLimiter"]  # fmt: skip

# Every option of the constructors, in order, and those of one algorithm or one kind.
COMMON = ["redis", "window_seconds", "limit", "prefix", "window_ms", "clock", "on_error",
          "timeout", "readable_keys", "plain_keys", "key_secret", "ttl_slack_ms",
          "clock_tolerance_ms"]  # fmt: skip
OWN = {"SlidingWindowLimiter": ["storage"], "TokenBucketLimiter": ["burst"]}


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    """mypy as `make test` runs it: from the project's root, with its configuration."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_mypy_rejects_every_wrong_call_and_nothing_else():
    path = TYPING / "wrong_calls.py"
    lines = path.read_text().splitlines()
    marked = {n for n, line in enumerate(lines, 1) if line.rstrip().endswith(MARK)}
    assert len(marked) >= 30  # the file is what this test is about: it must not empty out
    done = mypy(str(path.relative_to(ROOT)))
    reported: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        found = re.match(r".*wrong_calls\.py:(\d+): error: (.*)", line)
        if found:
            reported.setdefault(int(found[1]), []).append(found[2])
    assert done.returncode == 1, done.stdout + done.stderr
    missed = {n: lines[n - 1].strip() for n in sorted(marked - set(reported))}
    extra = {n: reported[n] for n in sorted(set(reported) - marked)}
    assert not missed, f"mypy accepted these wrong calls: {missed}"
    assert not extra, f"mypy rejected unmarked lines: {extra}"


def test_user_code_type_checks_and_runs():
    """tests/typing/user_code.py passes mypy --strict, and does what it shows."""
    done = mypy("tests/typing/user_code.py")
    assert done.returncode == 0, done.stdout + done.stderr
    spec = importlib.util.spec_from_file_location("user_code", TYPING / "user_code.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    decisions = asyncio.run(module.quick_start())
    assert [d.allowed for d in decisions] == [True] * 10 + [False] * 2
    assert module.sync_code().allowed
    tiers = asyncio.run(module.tiers())  # 3 per second binds, then refuses the fourth
    assert [(d.allowed, d.tier) for d in tiers] == [(True, 0)] * 3 + [(False, 0)]
    assert {"/within", "/tiles", "/api/items"} <= {route.path for route in module.make_app().routes}


@pytest.mark.parametrize("module", [ratelimit, ratelimit.sync], ids=["async", "sync"])
@pytest.mark.parametrize("name", NAMES)
def test_each_class_shows_its_real_parameters(module, name):
    """What an editor shows: the class's own signature, every option named and typed."""
    parameters = inspect.signature(getattr(module, name)).parameters
    expected = COMMON + OWN.get(name, []) + ["near_cache", "wait_replicas"]
    if module is ratelimit:
        expected.append("auto_pipeline")
    assert list(parameters) == expected
    assert all(p.annotation is not p.empty for p in parameters.values())
    assert [p.name for p in parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        "redis", "window_seconds", "limit", "prefix"
    ]  # fmt: skip


def public_callables() -> list[tuple[str, Any]]:
    found = []
    for module in (ratelimit, ratelimit.sync, ratelimit.http):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                if issubclass(obj, BaseException):
                    continue  # BaseException's own methods have no Python signature
                found.append((f"{module.__name__}.{name}", obj))
                found += [
                    (f"{module.__name__}.{name}.{attr}", member)
                    for attr, member in inspect.getmembers(obj, callable)
                    if not attr.startswith("_") or attr == "__call__" and attr in vars(obj)
                ]
            elif callable(obj):
                found.append((f"{module.__name__}.{name}", obj))
    return found


def test_no_public_signature_takes_args_or_kwargs():
    untyped = []
    for label, obj in public_callables():
        for p in inspect.signature(obj).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                untyped.append(f"{label}: {p}")
            elif p.annotation is p.empty and p.name not in ("self", "cls"):
                untyped.append(f"{label}: {p.name} has no type")
    assert len(public_callables()) > 50
    assert not untyped


# --- a client of the wrong kind ------------------------------------------------------------


def refused(make: Any, client: Any) -> str:
    with pytest.raises(TypeError) as caught:
        make(client, "10/s")
    return str(caught.value)


def expect_async_refuses(client: Any, kind: str) -> None:
    for name in NAMES:
        message = refused(getattr(ratelimit, name), client)
        assert message == (
            f"{name} takes a redis.asyncio client; for a {kind} use ratelimit.sync.{name}"
        )


def expect_sync_refuses(client: Any, kind: str) -> None:
    for name in NAMES:
        message = refused(getattr(ratelimit.sync, name), client)
        assert message == (
            f"ratelimit.sync.{name} takes a synchronous client (redis.Redis); "
            f"for a {kind} use ratelimit.{name}"
        )


async def test_embedded_clients_of_the_wrong_kind_are_refused():
    expect_async_refuses(fakeredis.FakeRedis(), "fakeredis.FakeRedis")
    expect_async_refuses(fakeredis.FakeStrictRedis(), "fakeredis.FakeStrictRedis")
    expect_sync_refuses(fakeredis.FakeAsyncRedis(), "fakeredis.FakeAsyncRedis")
    # The right kind is taken, and checks.
    assert (
        await ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), "1/s").check("a")
    ).allowed
    assert ratelimit.sync.TokenBucketLimiter(fakeredis.FakeRedis(), "1/s").check("a").allowed


@pytest.mark.real_redis
async def test_real_clients_of_the_wrong_kind_are_refused(real_redis_url, prefix):
    sync_client = redis.Redis.from_url(real_redis_url)
    async_client = redis.asyncio.Redis.from_url(real_redis_url)
    try:
        expect_async_refuses(sync_client, "redis.Redis")
        expect_sync_refuses(async_client, "redis.asyncio.Redis")
        # The same clients, given to the right kind, check on the server.
        limiter = ratelimit.FixedWindowLimiter(async_client, "1/min", prefix=prefix)
        assert [(await limiter.check("a")).allowed for _ in range(2)] == [True, False]
        with ratelimit.sync.FixedWindowLimiter(sync_client, "1/min", prefix=prefix) as same:
            assert not same.check("a").allowed  # the async limiter's admit, on the same key
        await limiter.aclose()
    finally:
        sync_client.close()
        await async_client.aclose()


async def test_a_users_subclass_names_the_class_it_builds_on():
    class MyLimiter(ratelimit.SlidingWindowLimiter):
        pass

    message = refused(MyLimiter, fakeredis.FakeRedis())
    assert message.startswith(f"{__name__}.")
    assert message.endswith(
        "MyLimiter takes a redis.asyncio client; for a fakeredis.FakeRedis "
        "use ratelimit.sync.SlidingWindowLimiter"
    )


@pytest.mark.real_redis
async def test_a_wrapped_client_is_taken_by_its_kind(real_redis_url, prefix):
    """A client whose `execute_command` is wrapped (as instrumentation does) is still
    of its kind: taken by the limiters of that kind, every lone check going through
    the wrapper, and refused by the others."""
    seen: list[Any] = []

    class Traced(redis.asyncio.Redis):
        async def execute_command(self, *args: Any, **options: Any) -> Any:
            seen.append(args[0])
            return await super().execute_command(*args, **options)

    class TracedSync(redis.Redis):
        def execute_command(self, *args: Any, **options: Any) -> Any:
            seen.append(args[0])
            return super().execute_command(*args, **options)

    client, sync_client = Traced.from_url(real_redis_url), TracedSync.from_url(real_redis_url)
    try:
        limiter = ratelimit.SlidingWindowLimiter(client, "5/s", prefix=prefix)
        assert (await limiter.check("a")).allowed  # loads the script (NOSCRIPT once)
        seen.clear()
        for _ in range(3):
            assert (await limiter.check("a")).allowed
        assert seen == ["EVALSHA"] * 3
        with ratelimit.sync.SlidingWindowLimiter(sync_client, "5/s", prefix=prefix) as same:
            assert same.check("a").remaining == 0  # the async checks' key: 5th of 5
        expect_sync_refuses(client, "redis.asyncio.Redis")
        expect_async_refuses(sync_client, "redis.Redis")
        await limiter.aclose()
    finally:
        await client.aclose()
        sync_client.close()


async def test_cluster_clients_of_the_wrong_kind_are_refused(cluster):
    async_cluster = ratelimit.connect(cluster.url)
    sync_cluster = ratelimit.connect_sync(cluster.url)
    try:
        assert isinstance(async_cluster, redis.asyncio.RedisCluster)
        assert isinstance(sync_cluster, redis.RedisCluster)
        expect_async_refuses(sync_cluster, "redis.RedisCluster")
        expect_sync_refuses(async_cluster, "redis.asyncio.RedisCluster")
    finally:
        sync_cluster.close()
        await async_cluster.aclose()


def test_an_object_that_is_no_redis_py_client_is_not_judged_by_kind():
    """Only redis-py clients (and fakeredis, built on them) are known to be of one kind:
    anything else gets no TypeError of this sort (it fails on its own terms)."""
    with pytest.raises(Exception) as caught:
        ratelimit.SlidingWindowLimiter(object(), "10/s")  # type: ignore[arg-type]
    assert "takes a redis.asyncio client" not in str(caught.value)

"""The limiters on a primary with a replica watched by three Sentinels
(`redis+sentinel://` URLs), through failovers, and what asynchronous replication loses.

One local set (`ratelimit.devtools.sentinel.LocalSentinel`: real redis-servers on
loopback, stopped by PID) serves the module; every test starts with `heal()`, which
brings back whatever the previous one killed or cut, as a replica.

- Checks go on through `SENTINEL FAILOVER` and through the primary being killed:
  nothing escapes but the failure policy, failures happen only during the switch, and
  the checks after it are real decisions on the promoted replica, whose empty script
  cache the limiter refills (NOSCRIPT).
- Lost admits: with replication stopped (the replica's ACL user disabled, so it
  cannot resync while clients and Sentinels still reach the primary), N admits are
  acknowledged, the primary is killed and the replica promoted: the new primary has
  none of them and admits exactly N more than the limit. Without `wait_replicas`,
  the admits a failover can lose are those acknowledged by the old primary after the
  last write the promoted replica received.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.sentinel

import ratelimit
import ratelimit.sync
from ratelimit import Decision
from ratelimit.backends import parse_sentinel_url
from ratelimit.devtools.sentinel import LocalSentinel
from tests.conftest import _missing
from tests.core.checks import check, host_stalls, stalled_within
from tests.core.loadgen import hammer

TIMEOUT = 0.5  # the limiters' timeout
GRACE = 1.0  # after the new primary is announced, failures may still end within this
THINK = 0.005  # between a load task's checks
AFTER = 0.7  # seconds of load once the new primary is announced
LIMIT = 10  # for the lost-admits scenario


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinel]:
    """A primary, a replica and three Sentinels for this module, stopped by PID after."""
    if not LocalSentinel.available():
        _missing("redis-server is needed for the Sentinel tests")
    with LocalSentinel(tmp_path_factory.mktemp("sentinel")) as local:
        yield local


@pytest.fixture
def healthy(replicated: LocalSentinel) -> LocalSentinel:
    """The module's set, ready: both data servers up, replicating, seen by Sentinel."""
    replicated.heal()
    return replicated


def make_limiter(url: str, mode: str, **options: Any) -> tuple[Any, Any]:
    """A sliding-window limiter (and its client) on `url`, asyncio or sync."""
    # The sorted-set log: the tests read its members.
    options = {
        "timeout": TIMEOUT, "prefix": f"t{uuid.uuid4().hex[:8]}", "storage": "sorted-set",
        **options,
    }  # fmt: skip
    if mode == "async":
        client: Any = ratelimit.connect(url, timeout=TIMEOUT)
        return ratelimit.SlidingWindowLimiter(client, **options), client
    client = ratelimit.connect_sync(url, timeout=TIMEOUT)
    return ratelimit.sync.SlidingWindowLimiter(client, **options), client


async def close(client: Any) -> None:
    if isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
        await client.aclose()
    else:
        client.close()


def script_on(replicated: LocalSentinel, server: Any, sha: str) -> bool:
    with server.client() as admin:
        return bool(admin.script_exists(sha)[0])


# URLs ---------------------------------------------------------------------------------


def test_sentinel_url_is_parsed():
    """Sentinels, service, database, the servers' credentials and options, and the
    Sentinels' own credentials all land where redis-py expects them."""
    target = parse_sentinel_url(
        "redis+sentinel://app:s3cret@10.0.0.1:26379,sentinel-2:26380/cache/3"
        "?sentinel_password=watch&health_check_interval=5"
    )
    assert target.sentinels == [("10.0.0.1", 26379), ("sentinel-2", 26380)]
    assert target.service == "cache"
    assert target.server_kwargs == {
        "username": "app", "password": "s3cret", "db": 3, "health_check_interval": 5,
    }  # fmt: skip
    assert target.sentinel_kwargs == {"password": "watch"}
    tls = parse_sentinel_url("rediss+sentinel://h:1/svc?ssl_cert_reqs=none")
    assert tls.server_kwargs["ssl"] is True and tls.sentinel_kwargs["ssl"] is True
    assert tls.sentinel_kwargs["ssl_cert_reqs"] == tls.server_kwargs["ssl_cert_reqs"] == "none"
    assert parse_sentinel_url("redis+sentinel://h:1/svc").server_kwargs == {"db": 0}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379", "names its service"),
        ("redis+sentinel://127.0.0.1:26379/", "names its service"),
        ("redis+sentinel://127.0.0.1/svc", "host:port"),
        ("redis+sentinel://127.0.0.1:26379,other/svc", "host:port"),
        ("redis+sentinel://127.0.0.1:26379/svc/0/extra", "/service_name[/db]"),
        ("redis+sentinel://127.0.0.1:26379/svc/zero", "integer"),
        ("redis://127.0.0.1:26379/svc", "not a redis+sentinel"),
    ],
)
def test_bad_sentinel_url_names_the_problem(url, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_sentinel_url(url)
    if url.startswith("redis+sentinel"):  # connect() says the same, before any I/O
        with pytest.raises(ValueError, match="Sentinel"):
            ratelimit.connect_sync(url)


# Connecting ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_sentinel_url_gives_a_bounded_master_client(healthy, mode):
    """`connect`/`connect_sync` give redis-py's master client; the limiter's checks
    land on the primary the Sentinels announce (the sync limiter through its own
    bounded copy of the Sentinel pool: socket timeouts of its timeout, no retries)."""
    limiter, client = make_limiter(healthy.url, mode, window_seconds=60, limit=10)
    try:
        pool = client.connection_pool
        assert type(pool).__name__ == "SentinelConnectionPool", pool
        assert pool.service_name == healthy.service
        for _ in range(3):
            decision = await check(limiter, "alice")
            assert decision.allowed and not decision.degraded, decision
        assert decision.remaining == limiter.limit - 3
        with healthy.primary().client() as admin:
            assert admin.zcard(limiter.key_for("alice")) == 3
        if mode == "sync":
            own = limiter._client.connection_pool
            assert isinstance(own, redis.sentinel.SentinelConnectionPool)
            assert own is not pool and own.service_name == healthy.service
            assert own.connection_kwargs["socket_timeout"] == TIMEOUT
            assert own.connection_kwargs["retry"].get_retries() == 0
            for sentinel in own.sentinel_manager.sentinels:
                assert sentinel.connection_pool.connection_kwargs["socket_timeout"] == TIMEOUT
    finally:
        await close(client)


# Checking through a failover ---------------------------------------------------------

SCENARIOS = [
    pytest.param("async", "failover", "raise", id="async-sentinel-failover-raise"),
    pytest.param("sync", "failover", "deny", id="sync-sentinel-failover-deny"),
    pytest.param("async", "kill", "deny", id="async-primary-killed-deny"),
    pytest.param("sync", "kill", "raise", id="sync-primary-killed-raise"),
]


@pytest.mark.parametrize(("mode", "fault", "on_error"), SCENARIOS)
async def test_checks_go_on_through_a_failover(healthy, mode, fault, on_error):
    """Load on one limiter while the primary changes: only the failure policy's
    outcomes during the switch, then real decisions on the promoted replica, whose
    script cache was empty and now holds the limiter's script."""
    limiter, client = make_limiter(
        healthy.url, mode, window_ms=1000, limit=1_000_000, on_error=on_error
    )
    sha = limiter.script_sha
    with healthy.replica().client() as replica:
        replica.script_flush()  # (Redis 7 does not replicate SCRIPT LOAD anyway)
    assert not script_on(healthy, healthy.replica(), sha)
    old = healthy.primary_address()
    stop = asyncio.Event()
    stalls: list[tuple[float, float]] = []
    with host_stalls(events=stalls):
        load = asyncio.create_task(
            hammer(limiter, "victim", tasks=3, duration=60, think_time=THINK, stop=stop)
        )
        try:
            await _until(lambda: healthy.primary().client().zcard(limiter.key_for("victim")) >= 5)
            fault_start = time.time()
            if fault == "failover":
                await asyncio.to_thread(healthy.failover)
            else:
                await asyncio.to_thread(healthy.kill_primary)
                await asyncio.to_thread(healthy.wait_for_primary, old)
            switched = time.time()
            await asyncio.sleep(GRACE + AFTER)
        finally:
            stop.set()
            checks = await load
            await close(client)
    assert healthy.primary_address() != old
    # What a busy host took from this process while each check ran: a check the host
    # stalled for a good part of its timeout may fail outside the switch.
    stolen = [
        stalled_within(stalls, sent, received)
        for sent, received in zip(checks["sent"], checks["received"], strict=True)
    ]
    checks = checks.assign(stolen=stolen)

    errors = collections.Counter(checks["error"][checks["error"] != ""])
    failed = checks[(checks["error"] != "") | checks["degraded"]]
    if on_error == "raise":
        assert set(errors) <= {"RateLimiterUnavailable"}, errors
        assert not checks["degraded"].any()
    else:
        assert not errors, errors
        assert not failed["allowed"].any()
    # Failures only during the switch (or where the host stalled the check); real
    # decisions before it and after it.
    # A check sent just before the fault that was still in flight when it came is the
    # fault's: only a failure answered before the fault began is early.
    unexcused = failed[failed["stolen"] < TIMEOUT / 3]
    unexcused = unexcused[["sent", "received", "latency", "error", "stolen"]]
    early = unexcused[unexcused["received"] < fault_start]
    late = unexcused[unexcused["sent"] >= switched + GRACE]
    assert early.empty, f"failed before the fault (s from it):\n{_from(early, fault_start)}"
    assert late.empty, f"failed after the switch (s from it):\n{_from(late, switched)}"
    before = checks[checks["received"] < fault_start]
    after = checks[checks["sent"] >= switched + GRACE]
    assert len(before) > 0 and len(after) >= 20, (len(before), len(after))
    real = after["allowed"] & ~after["degraded"] & (after["error"] == "")
    assert (real | (after["stolen"] >= TIMEOUT / 3)).all(), after[~real].head()
    assert real.sum() >= 20, real.sum()
    if fault == "kill":
        assert len(failed) > 0  # the dead primary was noticed, and the policy answered
    # NOSCRIPT recovered on the promoted replica: its cache now holds the script.
    assert script_on(healthy, healthy.primary(), sha)
    span = (failed["sent"].min(), (failed["sent"] + failed["latency"]).max())
    degraded_for = span[1] - span[0] if len(failed) else 0.0
    print(
        f"\n{mode} {fault} ({on_error}): {len(checks)} checks, {len(failed)} failed over "
        f"{degraded_for:.2f} s; new primary announced {switched - fault_start:.2f} s later"
    )


def _from(rows: Any, moment: float) -> Any:
    """The first rows, their send and answer times counted from `moment`."""
    return rows.assign(sent=rows["sent"] - moment, received=rows["received"] - moment).head(10)


async def _until(condition: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# Lost admits ------------------------------------------------------------------------


async def lose_admits(
    replicated: LocalSentinel, limiter: Any, acknowledged_after_cut: int
) -> dict[str, Any]:
    """The deterministic loss: `LIMIT // 3` admits replicated, replication cut, then
    `acknowledged_after_cut` checks, then the primary killed and the replica promoted
    (and the killed server revived as its replica). Then checks go on until the new
    primary rejects. Returns every decision by phase and what the new primary held."""
    who = f"victim-{uuid.uuid4().hex[:6]}"
    key = limiter.key_for(who)
    before = [await check(limiter, who) for _ in range(LIMIT // 3)]
    replicated.wait_replicated()
    replicated.cut_replication()
    after_cut = [await check(limiter, who) for _ in range(acknowledged_after_cut)]
    old = replicated.primary_address()
    with replicated.primary().client() as admin:
        on_old_primary = admin.zcard(key)
    killed_at = time.monotonic()
    replicated.kill_primary()
    replicated.wait_for_primary(old)
    promoted_after = time.monotonic() - killed_at
    with replicated.primary().client() as admin:
        on_new_primary = admin.zcard(key)
    replicated.heal()  # a replica again: wait_replicas can be met once more
    after: list[Decision] = []
    switching = 0  # degraded answers after the promotion (the script may have run)
    deadline = time.monotonic() + 10
    while not after or after[-1].allowed:
        decision = await check(limiter, who)
        if decision.degraded:  # still switching; not counted as a decision
            assert time.monotonic() < deadline, decision
            switching += 1
            await asyncio.sleep(0.05)
            continue
        after.append(decision)
    return {
        "before": before,
        "after_cut": after_cut,
        "after": after,
        "on_old_primary": on_old_primary,
        "on_new_primary": on_new_primary,
        "promoted_after": promoted_after,
        "switching": switching,
    }


def admitted(decisions: list[Decision]) -> int:
    """Admits a caller was told about (a degraded decision is the policy's, not Redis's)."""
    return sum(d.allowed and not d.degraded for d in decisions)


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_failover_loses_the_admits_made_after_replication_stopped(healthy, mode):
    """Without `wait_replicas`: the N admits acknowledged after replication stopped
    are on the old primary only; the promoted replica has none of them and admits
    them again, so exactly N more than the limit are admitted in the window."""
    n = 4
    limiter, client = make_limiter(
        healthy.url, mode, window_seconds=60, limit=LIMIT, on_error="deny"
    )
    try:
        run = await lose_admits(healthy, limiter, n)
    finally:
        await close(client)
    replicated = admitted(run["before"])
    assert replicated == LIMIT // 3 and admitted(run["after_cut"]) == n
    assert run["on_old_primary"] == replicated + n
    assert run["on_new_primary"] == replicated  # the N admits were never replicated
    total = replicated + n + admitted(run["after"])
    lost = total - LIMIT
    assert lost == n, (total, run)
    print(
        f"\n{mode}: lost {lost} of {n} admits acknowledged after replication stopped; "
        f"promoted {run['promoted_after']:.2f} s after the kill"
    )

"""`wait_replicas`: an admit counts only once enough replicas acknowledged it.

- Validation: a non-negative int, kept by `with_options`; refused on the embedded
  fakeredis.
- On a private Redis with no replica, WAIT answers 0: every admit goes to the failure
  policy with a message saying how many of how many replicas acknowledged within how
  long; a rejection (the script wrote nothing that matters) stands. For single checks,
  auto-pipelined batches and `check_many`, async and sync.
- NOSCRIPT on the WAIT path is recovered as on the plain one.
- On a Redis Cluster each waiting check sends its script and WAIT to its key's
  master: without replicas its admits follow the policy, with one replica per master
  they are real decisions, on every node.
- The deterministic loss of `test_sentinel.py` with `wait_replicas=1`: the admits made
  after replication stopped come back degraded (denied), none is a normal admit the
  new primary forgets, so nothing is lost.
- A SENTINEL FAILOVER of a live primary, left to Sentinel: without `wait_replicas`
  the admits the old primary takes until Sentinel demotes it are lost (within the
  bound); with it, none.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms
from ratelimit._core import NotReplicated
from ratelimit.devtools.cluster import LocalCluster, slot_of
from tests.conftest import _missing
from tests.core.checks import check, check_many
from tests.core.test_sentinel import (  # noqa: F401  (the module's Sentinel set fixtures)
    GRACE,
    LIMIT,
    admitted,
    close,
    healthy,
    lose_admits,
    make_limiter,
    replicated,
)

TIMEOUT = 0.6  # WAIT then waits 200 ms (a third), and Redis may notice that 100 ms late
# Where a replica must acknowledge in time: its ack is a round trip through two more
# processes, which a busy machine can delay past 200 ms; 1 s of WAIT is still bounded.
REPLICATED_TIMEOUT = 3.0
NOBODY = "redis://127.0.0.1:1/0"  # nothing listens: construction does no I/O
MODES = pytest.mark.parametrize("mode", ["async", "sync"])


def limiter_of(algorithm: str, mode: str) -> Callable[..., Any]:
    """What builds `algorithm`'s limiter in `mode` (the log as a sorted set, whose
    members some tests read)."""
    return functools.partial(algorithms.get(algorithm).build, mode)


async def warm(limiter) -> None:
    """Load the script (on every master) and connect, with a check that does not wait:
    a cold first check meets NOSCRIPT and pays two WAITs, which with no replica to
    acknowledge can take most of TIMEOUT."""
    plain = limiter.with_options(wait_replicas=0, prefix="warm")
    assert (await check(plain, uuid.uuid4().hex)).allowed


# Validation ---------------------------------------------------------------------------


@MODES
@pytest.mark.parametrize("algorithm", algorithms.NAMES)
def test_wait_replicas_is_an_option_of_every_limiter(algorithm, mode):
    client = (redis.asyncio.Redis if mode == "async" else redis.Redis).from_url(NOBODY)
    limiter = limiter_of(algorithm, mode)(client, 60, 10, wait_replicas=2)
    assert limiter.wait_replicas == 2
    assert limiter._wait_command() == ("WAIT", 2, 333)  # a third of the default 1 s
    assert limiter.with_options(limit=5).wait_replicas == 2
    assert limiter.with_options(wait_replicas=0).wait_replicas == 0
    assert limiter_of(algorithm, mode)(client, 60, 10).wait_replicas == 0
    with pytest.raises(AttributeError, match="fixed"):
        limiter.wait_replicas = 1


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True, None, 101])
def test_bad_wait_replicas_is_a_value_error(bad):
    client = redis.asyncio.Redis.from_url(NOBODY)
    with pytest.raises(ValueError, match="wait_replicas"):
        ratelimit.SlidingWindowLimiter(client, 60, 10, wait_replicas=bad)
    with pytest.raises(ValueError, match="wait_replicas"):
        ratelimit.sync.SlidingWindowLimiter(redis.Redis.from_url(NOBODY), 60, 10, wait_replicas=bad)


def test_wait_replicas_is_refused_on_fakeredis():
    """fakeredis has no replicas: its WAIT answers 0, so every admit would fail."""
    with pytest.raises(ValueError, match="embedded fakeredis"):
        ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 60, 10, wait_replicas=1)
    with pytest.raises(ValueError, match="embedded fakeredis"):
        ratelimit.sync.SlidingWindowLimiter(fakeredis.FakeRedis(), 60, 10, wait_replicas=1)
    assert ratelimit.SlidingWindowLimiter(fakeredis.FakeAsyncRedis(), 60, 10, wait_replicas=0)


@pytest.mark.parametrize(
    ("timeout", "reply", "acked", "expected"),
    [
        (0.5, 0, 0, "WAIT: 0 of 1 replicas acknowledged within 166 ms"),
        (1.5, [1, 3, 0, 60000], 1, "WAIT: 1 of 2 replicas acknowledged within 500 ms"),
        (1.0, 0, redis.exceptions.ResponseError("boom"), "WAIT failed after an admit: boom"),
    ],
)
def test_the_message_says_how_many_of_how_many(timeout, reply, acked, expected):
    wanted = 2 if isinstance(reply, list) else 1
    limiter = ratelimit.SlidingWindowLimiter(
        redis.asyncio.Redis.from_url(NOBODY), 60, 10, timeout=timeout, wait_replicas=wanted
    )
    error = limiter._replication_error(reply, acked)
    assert isinstance(error, NotReplicated) and str(error) == expected
    # Enough replicas, or a rejection (negative one-integer reply, or allowed=0): fine.
    assert limiter._replication_error(reply, wanted) is None
    assert limiter._replication_error(-5, 0) is None
    assert limiter._replication_error([0, 0, 10, 10], 0) is None


# On a server without replicas ---------------------------------------------------------


@pytest.fixture
def lone(private_redis):
    """The private server: a primary with no replica, so WAIT 1 always answers 0."""
    return private_redis


def _client(mode: str, url: str):
    return (redis.asyncio.Redis if mode == "async" else redis.Redis).from_url(url)


@MODES
@pytest.mark.parametrize("on_error", ["deny", "raise"])
async def test_unacknowledged_admits_follow_the_policy(lone, mode, on_error, caplog):
    """Admits are not decisions when nobody acknowledged them; rejections stand."""
    client = _client(mode, lone.url)
    limiter = limiter_of("log", mode)(
        client, 60, 3, on_error=on_error, timeout=TIMEOUT, wait_replicas=1
    )
    message = re.escape("WAIT: 0 of 1 replicas acknowledged within 200 ms")
    try:
        await warm(limiter)
        with caplog.at_level(logging.WARNING, logger="ratelimit"):
            for _ in range(3):  # each admit ran (and counted) on the primary
                if on_error == "raise":
                    with pytest.raises(RateLimiterUnavailable, match=message) as info:
                        await check(limiter, "alice")
                    assert isinstance(info.value.__cause__, NotReplicated)
                else:
                    decision = await check(limiter, "alice")
                    assert decision.degraded and not decision.allowed, decision
        if on_error == "deny":
            assert re.search(message, caplog.text)
        rejected = await check(limiter, "alice")  # full: a rejection, not degraded
        assert not rejected.allowed and not rejected.degraded, rejected
        assert rejected.retry_after_ms > 1000  # the window's, not the policy's 1 s
    finally:
        await close(client)


@MODES
async def test_batches_wait_once_and_judge_each_check(lone, mode):
    """`check_many` (and for asyncio, checks auto-pipelined together) send one WAIT
    after the batch: its admits go to the policy, its rejections stand."""
    client = _client(mode, lone.url)
    limiter = limiter_of("log", mode)(
        client, 60, 3, on_error="deny", timeout=TIMEOUT, wait_replicas=1
    )
    try:
        await warm(limiter)
        decisions = await check_many(limiter, ["bob"] * 5)
        assert [d.degraded for d in decisions] == [True] * 3 + [False] * 2
        assert not any(d.allowed for d in decisions)
        if mode == "async":
            together = await asyncio.gather(*(limiter.check("carol") for _ in range(5)))
            assert [d.degraded for d in together] == [True] * 3 + [False] * 2
            # A limiter without WAIT in the same batch keeps its own decisions.
            plain = limiter.with_options(wait_replicas=0, prefix="plain")
            mixed = await asyncio.gather(limiter.check("dave"), plain.check("dave"))
            assert mixed[0].degraded and not mixed[1].degraded and mixed[1].allowed
        with lone.client() as admin:
            wait_calls = int(admin.info("commandstats")["cmdstat_wait"]["calls"])
        # asyncio: checks that wait for replicas always batch, so the checks made
        # together (the plain limiter's too) share one WAIT.
        assert wait_calls == (1 if mode == "sync" else 3), wait_calls
    finally:
        await close(client)


@MODES
async def test_noscript_is_recovered_on_the_wait_path(lone, mode):
    """A flushed script cache: the waiting check reloads and still reports WAIT."""
    client = _client(mode, lone.url)
    limiter = limiter_of("log", mode)(
        client, 60, 3, on_error="deny", timeout=2 * TIMEOUT, wait_replicas=1
    )  # two WAITs (NOSCRIPT) of 400 ms each fit in its timeout
    try:
        assert (await check(limiter, "erin")).degraded
        with lone.client() as admin:
            admin.script_flush()
        assert (await check(limiter, "erin")).degraded
        with lone.client() as admin:
            assert admin.script_exists(limiter.script_sha) == [True]
            assert admin.zcard(limiter.key_for("erin")) == 2  # both scripts ran once
    finally:
        await close(client)


# Failover -------------------------------------------------------------------------------


@MODES
async def test_wait_replicas_loses_no_admit_in_a_failover(healthy, mode):  # noqa: F811
    """The deterministic loss with `wait_replicas=1`: the admits made after
    replication stopped are degraded denials, so the callers were told of no admit
    the new primary forgets; in the whole window exactly the limit was admitted."""
    n = 4
    limiter, client = make_limiter(
        healthy.url, mode, window_seconds=60, limit=LIMIT, on_error="deny",
        timeout=TIMEOUT, wait_replicas=1,
    )  # fmt: skip
    try:
        run = await lose_admits(healthy, limiter, n)
    finally:
        await close(client)
    kept = admitted(run["before"])
    assert kept == LIMIT // 3  # a healthy replica acknowledges at once
    assert all(d.degraded and not d.allowed for d in run["after_cut"]), run["after_cut"]
    assert run["on_old_primary"] == kept + n  # they ran, but nobody was told
    assert run["on_new_primary"] == kept
    total = kept + admitted(run["after_cut"]) + admitted(run["after"])
    # A lost admit would be admitted again: more than the limit in the window. An admit
    # the new primary ran while its replica was still attaching came back degraded
    # (counted there, told to nobody), so the told admits may fall short by as many.
    assert LIMIT - run["switching"] <= total <= LIMIT, (total, run)
    assert not run["after"][-1].allowed
    print(f"\n{mode}: lost {max(0, total - LIMIT)} admits with wait_replicas=1 ({n} denied)")


async def test_sentinel_failover_of_a_live_primary(healthy):  # noqa: F811
    """SENTINEL FAILOVER as Sentinel does it: the replica is promoted at once, the old
    primary demoted only at Sentinel's next poll (INFO, about 10 s later). Clients
    still connected to the old primary keep being admitted there, and all of that is
    lost when it resyncs: at most the admits acknowledged after the failover began
    (the replica was in sync before). With `wait_replicas=1` (same load, same
    failover) those admits come back degraded instead, and none is lost."""
    plain, plain_client = make_limiter(
        healthy.url, "async", window_seconds=120, limit=10**6, on_error="deny", timeout=TIMEOUT
    )  # a check that times out during the switch is a degraded denial, not an error
    waiting, waiting_client = make_limiter(
        healthy.url, "async", window_seconds=120, limit=10**6, on_error="deny",
        timeout=TIMEOUT, wait_replicas=1,
    )  # fmt: skip
    seen: dict[Any, list[tuple[float, Decision]]] = {plain: [], waiting: []}
    stop = asyncio.Event()

    async def load(limiter: Any) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            seen[limiter].append((sent, await limiter.check("victim")))
            await asyncio.sleep(0.005)

    tasks = [asyncio.create_task(load(limiter)) for limiter in seen]
    try:
        await asyncio.sleep(0.3)
        healthy.wait_replicated()
        began = time.monotonic()
        old = healthy.primary_address()
        await asyncio.to_thread(healthy.failover, demote=False)
        await asyncio.to_thread(healthy.wait_demoted, old)
        demoted = time.monotonic()
        await asyncio.to_thread(healthy.wait_ready)  # the demoted one replicates again
        healed = time.monotonic()
        await asyncio.sleep(GRACE + 0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await close(plain_client)
        await close(waiting_client)
    with healthy.primary().client() as admin:
        kept = {limiter: admin.zcard(limiter.key_for("victim")) for limiter in seen}
    told = {limiter: admitted([d for _, d in seen[limiter]]) for limiter in seen}
    late = admitted([d for sent, d in seen[plain] if sent >= began])
    lost = told[plain] - kept[plain]
    assert 0 < lost <= late, (lost, late)  # the bound, and the loss is real
    assert told[waiting] > 0 and kept[waiting] >= told[waiting]  # nothing lost
    degraded = [sent for sent, d in seen[waiting] if d.degraded]
    # Degraded only from the failover until a replica was connected again (and its
    # acknowledgements flowing: GRACE), then real admits.
    assert degraded and min(degraded) >= began and max(degraded) < healed + GRACE
    settled = [d for sent, d in seen[waiting] if sent >= healed + GRACE]
    assert settled and all(d.allowed and not d.degraded for d in settled), settled
    print(
        f"\nSENTINEL FAILOVER, old primary demoted {demoted - began:.1f} s later: "
        f"lost {lost} of {told[plain]} admits without wait_replicas "
        f"({late} acknowledged after it began); with wait_replicas=1 lost 0 of "
        f"{told[waiting]}, {len(degraded)} degraded"
    )


# Redis Cluster --------------------------------------------------------------------------


def _cluster_client(mode: str, url: str):
    return ratelimit.connect(url) if mode == "async" else ratelimit.connect_sync(url)


def _identities_on_every_node(cluster, limiter, count: int = 30) -> list[str]:
    """Identities whose keys land on every master (by the cluster's own slot map)."""
    names = [f"user-{i}" for i in range(count)]
    owners = {cluster.slot_owner(slot_of(limiter.key_for(n))) for n in names}
    assert len(owners) == cluster.masters, owners
    return names


def _wait_calls(cluster) -> dict[int, int]:
    """WAITs each master has run so far."""
    calls = {}
    for node in cluster.nodes:
        with node.admin() as admin:
            stats = admin.info("commandstats")
        calls[node.port] = int(stats.get("cmdstat_wait", {}).get("calls", 0))
    return calls


@MODES
async def test_cluster_without_replicas_sends_admits_to_the_policy(cluster, mode):
    """The session cluster has no replicas: on every node, single checks, batches and
    `check_many` get their admits judged by WAIT (0 of 1), rejections stand."""
    client = _cluster_client(mode, cluster.url)
    # The sliding log: no window boundary can fall between the two rounds of checks.
    limiter = limiter_of("log", mode)(
        client, 60, 1, prefix=f"wait{mode}", on_error="deny", timeout=TIMEOUT, wait_replicas=1
    )
    try:
        await warm(limiter)
        names = _identities_on_every_node(cluster, limiter)[:9]
        first = [await check(limiter, n) for n in names]
        assert all(d.degraded and not d.allowed for d in first), first
        waits = _wait_calls(cluster)
        again = await check_many(limiter, names)  # each key is full: real rejections
        assert all(not d.degraded and not d.allowed for d in again), again
        after = _wait_calls(cluster)  # one WAIT per master for the whole batch
        assert {port: after[port] - waits.get(port, 0) for port in after} == dict.fromkeys(
            after, 1
        ), (waits, after)
        if mode == "async":
            fresh = [f"{n}-b" for n in names]
            together = await asyncio.gather(*(limiter.check(n) for n in fresh))
            assert all(d.degraded and not d.allowed for d in together), together
    finally:
        await close(client)


@MODES
async def test_cluster_with_replicas_admits_on_every_node(mode, tmp_path):
    """One replica per master: every node's WAIT counts its replica, so the admits
    are real decisions, on every master (single checks and `check_many`)."""
    if not LocalCluster.available():
        _missing("redis-server and redis-cli are needed for the Redis Cluster tests")
    with LocalCluster(tmp_path / "cluster", replicas=1) as replicated_cluster:
        client = _cluster_client(mode, replicated_cluster.url)
        limiter = limiter_of("log", mode)(
            client, 60, 2, on_error="raise", timeout=REPLICATED_TIMEOUT, wait_replicas=1
        )
        try:
            await warm(limiter)
            names = _identities_on_every_node(replicated_cluster, limiter)[:9]
            first = [await check(limiter, n) for n in names]
            assert all(d.allowed and not d.degraded for d in first), first
            batch = await check_many(limiter, names + names)
            assert [d.allowed for d in batch] == [True] * 9 + [False] * 9, batch
            assert not any(d.degraded for d in batch)
        finally:
            await close(client)

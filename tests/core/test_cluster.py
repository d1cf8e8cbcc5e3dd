"""The limiters on a real Redis Cluster: 3 masters on loopback (`cluster` fixture,
`ratelimit.devtools.cluster.LocalCluster`), reached through `redis+cluster://` URLs.

Every limiter, async and sync, decides on the cluster as on one server; each
identity's state is one key, so one slot, on the node that serves that slot; a batch
(`check_many`) decides like the same checks in sequence, also when a node lacks the
script; and when a master is stopped and restarted while checks run, the failure
policy answers for its slots within the timeout, the other shards keep answering,
and the same limiter works again by itself once the node is back.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms
from ratelimit.backends import bounded_client, parse_cluster_url
from ratelimit.clock import ManualClock
from ratelimit.devtools.cluster import LocalCluster
from ratelimit.scripts import source
from tests.core.checks import assert_policy, check, check_many, host_stalls, timed_check

# Every limiter class, and the sliding log's compact storage ("<class>/<storage>").
NAMES = [a.class_name for a in algorithms.ALGORITHMS] + ["SlidingWindowLimiter/compact"]
LIMITERS = pytest.mark.parametrize("name", NAMES)
MODES = pytest.mark.parametrize("mode", ["async", "sync"])

TIMEOUT = 1.0  # the limiters' timeout in the fault tests (a busy 2-core host needs it)
DECISION_TIMEOUT = 20.0  # the limiters' timeout elsewhere: they test decisions, not latency
MARGIN = 0.5  # how much longer than that a check may take, scheduling included
RECOVERY = 15.0  # bound on how long a restarted node's shard may stay unavailable
HEALTHY_TIMEOUT = 5.0  # a healthy node's checks, beside an outage, on a busy host


# Helpers -------------------------------------------------------------------------


def make_client(cluster: LocalCluster, mode: str, **kwargs: Any) -> Any:
    if mode == "async":
        return ratelimit.connect(cluster.url, **kwargs)
    return ratelimit.connect_sync(cluster.url, **kwargs)


def make_limiter(name: str, mode: str, client: Any, *args: Any, **kwargs: Any) -> Any:
    module = ratelimit if mode == "async" else ratelimit.sync
    name, _, storage = name.partition("/")
    if storage:
        kwargs["storage"] = storage
    # Tests of decisions wait for them (a busy host once took over 1 s for a batch); the
    # fault tests give their own timeout.
    kwargs.setdefault("timeout", DECISION_TIMEOUT)
    return getattr(module, name)(client, *args, **kwargs)


async def close(client: Any) -> None:
    if isinstance(client, redis.asyncio.RedisCluster):
        await client.aclose()
    else:
        client.close()


def node_of(cluster: LocalCluster, limiter: Any, identity: str) -> int:
    return cluster.slot_owner(key_slot(limiter.key_for(identity).encode()))


def identities_on(cluster: LocalCluster, limiter: Any, node: int, n: int, tag: str) -> list[str]:
    """The first `n` identities `<tag>-<i>` whose key this limiter keeps on `node`."""
    found = []
    for i in range(10_000):
        if node_of(cluster, limiter, f"{tag}-{i}") == node:
            found.append(f"{tag}-{i}")
            if len(found) == n:
                return found
    raise AssertionError(f"fewer than {n} identities on node {node}")


def keys_by_node(cluster: LocalCluster, pattern: str) -> dict[int, list[str]]:
    """Every key matching `pattern`, asked of each node itself (SCAN is per node)."""
    found = {}
    for index, node in enumerate(cluster.nodes):
        with node.admin(timeout=5) as client:
            found[index] = list(client.scan_iter(match=pattern, count=1000))
    return found


@pytest.fixture
async def clients(cluster: LocalCluster):
    """Makes cluster clients (async or sync) from the cluster's URL; closes them after."""
    made: list[Any] = []

    def make(mode: str, **kwargs: Any) -> Any:
        made.append(make_client(cluster, mode, **kwargs))
        return made[-1]

    yield make
    for client in made:
        await close(client)


# 1. Connecting ---------------------------------------------------------------------


async def test_cluster_urls_give_cluster_clients(cluster, clients, monkeypatch):
    """`redis+cluster://` URLs give RedisCluster clients with the same timeouts as a
    single server's, and REDIS_URL may name a cluster too."""
    sync = clients("sync", timeout=0.7)
    assert isinstance(sync, redis.RedisCluster)
    assert sync.nodes_manager.connection_kwargs["socket_timeout"] == 0.7
    assert sorted(node.port for node in sync.get_primaries()) == sorted(cluster.ports)
    asynchronous = clients("async", timeout=0.7)
    assert isinstance(asynchronous, redis.asyncio.RedisCluster)
    assert asynchronous.connection_kwargs["socket_timeout"] == 0.7
    assert await asynchronous.ping()

    monkeypatch.setenv("REDIS_URL", cluster.url)
    from_env = ratelimit.connect_sync()
    assert isinstance(from_env, redis.RedisCluster) and from_env.ping()
    from_env.close()


def test_seeds_after_the_first_are_used_when_it_is_down(cluster):
    """Only the second seed answers (the first is a port nobody listens on)."""
    url = f"redis+cluster://127.0.0.1:1,127.0.0.1:{cluster.ports[1]}"
    with ratelimit.connect_sync(url) as client:
        assert sorted(node.port for node in client.get_primaries()) == sorted(cluster.ports)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:7000", "not a redis\\+cluster"),
        ("redis+cluster://127.0.0.1:7000/1", "only database 0"),
        ("redis+cluster://127.0.0.1", "host:port"),
        ("redis+cluster://127.0.0.1:7000,:7001", "host:port"),
        ("redis+cluster://127.0.0.1:99999", "bad node"),
    ],
)
def test_bad_cluster_urls_are_clear_errors(url, message):
    with pytest.raises(ValueError, match=message):
        parse_cluster_url(url)


def test_cluster_url_keeps_credentials_tls_and_options():
    first, seeds = parse_cluster_url("rediss+cluster://u:p%40ss@h1:7000,[::1]:7001/0?ssl_cert_reqs=none")
    assert first == "rediss://u:p%40ss@h1:7000?ssl_cert_reqs=none"
    assert seeds == [("h1", 7000), ("::1", 7001)]


def test_sync_limiter_gets_a_bounded_cluster_client(cluster):
    """A user's RedisCluster made without timeouts (and with retries) is not what the
    sync limiter talks through: its own copy has the limiter's timeout and no retries."""
    user = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        bounded = bounded_client(user, 0.3)
        assert isinstance(bounded, redis.RedisCluster) and bounded is not user
        assert bounded.nodes_manager.connection_kwargs["socket_timeout"] == 0.3
        assert bounded.nodes_manager.connection_kwargs["socket_connect_timeout"] == 0.3
        assert bounded.retry.get_retries() == 0
        assert user.nodes_manager.connection_kwargs.get("socket_timeout") is None  # untouched
        limiter = ratelimit.sync.SlidingWindowLimiter(user, 1, 10, timeout=0.3)
        assert limiter._script.registered_client.nodes_manager.connection_kwargs[
            "socket_timeout"
        ] == 0.3
        bounded.close()
    finally:
        user.close()


# 2. The limiters decide on the cluster as on one server -----------------------------


@LIMITERS
@MODES
async def test_twelve_at_ten_per_second(name, mode, cluster, clients, prefix):
    """12 checks at 10/s: exactly 10 allowed, 2 rejected with Retry-After >= 1 s; the
    identity's one key is on the node that serves its slot, and nowhere else."""
    clock = ManualClock(1_796_000_000.25)
    limiter = make_limiter(name, mode, clients(mode), 1, 10, prefix=prefix, clock=clock)
    decisions = [await check(limiter, "alice") for _ in range(12)]  # within one ms
    assert [d.allowed for d in decisions] == [True] * 10 + [False] * 2
    assert all(d.retry_after >= 1 for d in decisions[10:])
    assert not any(d.degraded for d in decisions)

    key = limiter.key_for("alice")
    found = keys_by_node(cluster, f"{prefix}:*")
    assert {node: keys for node, keys in found.items() if keys} == {
        node_of(cluster, limiter, "alice"): [key]
    }


@LIMITERS
@MODES
async def test_fifty_concurrent_checks_admit_exactly_ten(name, mode, cluster, clients, prefix):
    limiter = make_limiter(name, mode, clients(mode), 60, 10, prefix=prefix)
    await check(limiter, "warm-up")  # a client's first burst is another test (below)
    if mode == "async":
        decisions = await asyncio.gather(*(limiter.check("bob") for _ in range(50)))
    else:
        with ThreadPoolExecutor(max_workers=16) as pool:
            decisions = list(pool.map(lambda _: limiter.check("bob"), range(50)))
    assert not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 10


async def test_a_cold_async_client_under_a_burst(cluster, clients, prefix):
    """50 checks at once on a new asyncio cluster client: redis-py recycles connections
    while it learns the topology, and a command can meet a half-closed one (an
    AttributeError inside redis-py). The limiter must turn that into a retry or its
    failure policy, never let it escape, and never admit more than the limit."""
    for attempt in range(5):
        limiter = ratelimit.SlidingWindowLimiter(
            clients("async"), 60, 10, prefix=f"{prefix}:{attempt}", on_error="deny"
        )
        decisions = await asyncio.gather(*(limiter.check("erin") for _ in range(50)))
        assert all(isinstance(d, Decision) for d in decisions)
        degraded = [d for d in decisions if d.degraded]
        admitted = sum(d.allowed for d in decisions if not d.degraded)
        # A degraded check may still have been counted (its first attempt reached
        # Redis): stricter, never more than the limit.
        assert 10 - len(degraded) <= admitted <= 10, (admitted, len(degraded))
        assert not any(d.allowed for d in degraded)


@LIMITERS
@MODES
async def test_check_many_decides_like_a_sequence(name, mode, cluster, clients, prefix):
    """A batch over identities on all three shards gets the decisions of the same
    checks in sequence, also right after one node lost its scripts (NOSCRIPT there:
    that node's share is sent again with EVAL, nothing is counted twice)."""
    client = clients(mode)
    clock = ManualClock(1_796_000_000.5)
    batched = make_limiter(name, mode, client, 1, 10, prefix=f"{prefix}:b", clock=clock)
    sequential = make_limiter(name, mode, client, 1, 10, prefix=f"{prefix}:s", clock=clock)
    people = [who for node in range(3) for who in identities_on(cluster, batched, node, 2, "p")]
    # (the digest alone places a key, so both prefixes put an identity on one node)
    assert {node_of(cluster, sequential, who) for who in people} == {0, 1, 2}
    identities = [people[(7 * i) % len(people)] for i in range(90)]
    costs = [1 + (i * 5) % 3 for i in range(90)]

    expected = [await check(sequential, w, c) for w, c in zip(identities, costs, strict=True)]
    with cluster.nodes[1].admin() as node:
        assert node.script_flush()
    assert await check_many(batched, identities, costs) == expected
    assert 0 < sum(d.allowed for d in expected) < len(expected)  # both answers occur


def test_every_script_touches_one_key_only():
    """No script names a second key: KEYS[1] is the only one, so one slot."""
    for algorithm in (*algorithms.ALGORITHMS, algorithms.COMPACT_LOG):
        script = source(algorithm.script)
        name = algorithm.name
        assert set(re.findall(r"KEYS\[(\d+)\]", script)) == {"1"}, name
        assert "redis.call('KEYS'" not in script and "SCAN" not in script


@LIMITERS
async def test_keys_of_one_limiter_map_to_one_slot(name, cluster, clients, prefix):
    """Whatever the identity (braces, newlines, 10 kB) and the cost, a limiter keeps
    one key per identity, in one slot that only the digest picks; the server agrees
    on the slot, and the key is on the node serving it."""
    limiter = make_limiter(name, "async", clients("async"), 60, 10, prefix=prefix,
                           readable_keys=True)  # fmt: skip
    identities = ["{alice}", "a\nb", "x" * 10_000, "日本", "{}", "plain"]
    for who in identities:
        for cost in (1, 3, 2):
            await limiter.check(who, cost)
    found = keys_by_node(cluster, f"{prefix}:*")
    every = [key for keys in found.values() for key in keys]
    assert sorted(every) == sorted(limiter.key_for(who) for who in identities)
    with cluster.nodes[0].admin() as admin:
        for node, keys in found.items():
            for key in keys:
                assert admin.cluster("KEYSLOT", key) == key_slot(key.encode())
                assert cluster.slot_owner(key_slot(key.encode())) == node


async def test_ten_thousand_identities_spread_evenly(cluster, clients, prefix):
    """10,000 identities, one batch: each master holds its share of the keys. A
    uniform hash puts each key on master m with probability p_m = (its slots) / 16384
    (about 1/3), so the count is Binomial(10000, p_m) with a standard deviation of
    about 47; the bound of 5 deviations (~236 keys, 7% of the share) is missed by a
    uniform hash with probability < 1e-6, and by a skewed one (say all braces in a
    readable excerpt hashed) at once."""
    n = 10_000
    limiter = ratelimit.SlidingWindowLimiter(clients("async"), 60, 10, prefix=prefix,
                                             readable_keys=True, timeout=20)  # fmt: skip
    decisions = await limiter.check_many([f"{{user}}-{i}" for i in range(n)])
    assert all(d.allowed and not d.degraded for d in decisions)

    counts = {node: len(keys) for node, keys in keys_by_node(cluster, f"{prefix}:*").items()}
    assert sum(counts.values()) == n
    with cluster.nodes[0].admin() as admin:
        slots = Counter()
        for start, end, master, *_ in admin.execute_command("CLUSTER SLOTS"):
            slots[cluster.ports.index(int(master[1]))] += int(end) - int(start) + 1
    for node, count in counts.items():
        p = slots[node] / 16384
        sd = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) < 5 * sd, (node, count, n * p, sd)


# 3. Scripts and faults on one node ---------------------------------------------------


@MODES
async def test_script_flush_on_one_node_is_invisible(mode, cluster, clients, prefix):
    """SCRIPT FLUSH on the node that holds the key, after the 5th of 12 checks: the
    limiter reloads its script there, and decides exactly as a run without flush."""
    clock = ManualClock(1_796_000_000.5)
    limiter = make_limiter("SlidingWindowLimiter", mode, clients(mode), 1, 10, prefix=prefix,
                           clock=clock)  # fmt: skip
    control = [await check(limiter, "control") for _ in range(12)]
    node = cluster.nodes[node_of(cluster, limiter, "flushed")]
    flushed = []
    for n in range(12):
        if n == 5:
            with node.admin() as admin:
                assert admin.script_flush()
                assert admin.script_exists(limiter.script_sha) == [False]
        flushed.append(await check(limiter, "flushed"))
    assert [d.allowed for d in flushed] == [True] * 10 + [False] * 2
    assert flushed == control


@MODES
async def test_a_stalled_node_costs_at_most_the_timeout(mode, cluster, prefix):
    """CLIENT PAUSE on one master holds every EVALSHA there: a check on its slots
    gives up after about `timeout` even through a user's client made without any
    timeout (the sync limiter talks through its own bounded copy), and works again
    once the pause ends."""
    if mode == "async":
        user: Any = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    else:
        user = redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    try:
        limiter = make_limiter("SlidingWindowLimiter", mode, user, 60, 5, prefix=prefix,
                               timeout=TIMEOUT)  # fmt: skip
        assert (await check(limiter, "carol")).allowed
        node = cluster.nodes[node_of(cluster, limiter, "carol")]
        with node.admin() as admin:
            admin.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
            try:
                start = time.monotonic()
                with pytest.raises(RateLimiterUnavailable), host_stalls() as stolen:
                    await check(limiter, "carol")
                elapsed = time.monotonic() - start
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        assert elapsed < TIMEOUT + MARGIN + stolen(), f"the check took {elapsed:.2f} s"
        decision = await check(limiter, "carol")
        assert decision.allowed and not decision.degraded
    finally:
        await close(user)


def flagged_failed(cluster: LocalCluster, index: int) -> bool:
    """True when every other master has flagged node `index` as FAIL (not just PFAIL)."""
    port = cluster.ports[index]
    for i, node in enumerate(cluster.nodes):
        if i == index:
            continue
        with node.admin() as admin:
            flags = admin.execute_command("CLUSTER NODES")[f"127.0.0.1:{port}"]["flags"]
        if "fail" not in flags.split(","):  # "fail?" is only a suspicion (PFAIL)
            return False
    return True


@MODES
async def test_a_restarted_master(mode, cluster, clients, prefix):
    """One master is stopped (by PID) while checks run, then started again on its port
    with its nodes.conf. Meanwhile a check on its slots applies the failure policy
    (raise / allow / deny) within timeout + margin, also once the others flag it FAIL,
    while checks on the other two shards answer normally. After the
    restart the same limiters answer for its slots again by themselves within RECOVERY
    seconds.

    The healthy shards' checks share the client but have a patient limiter (HEALTHY_TIMEOUT):
    on a busy host a healthy node, itself a process waiting for a core, can take longer than
    TIMEOUT to answer, which says nothing about the outage."""
    client = clients(mode, timeout=HEALTHY_TIMEOUT)

    def limiters_of(timeout: float) -> dict[str, Any]:
        return {
            on_error: make_limiter("SlidingWindowLimiter", mode, client, 60, 1000, prefix=prefix,
                                   on_error=on_error, timeout=timeout)  # fmt: skip
            for on_error in ("raise", "allow", "deny")
        }

    limiters, patient = limiters_of(TIMEOUT), limiters_of(HEALTHY_TIMEOUT)
    probe = limiters["raise"]
    victim = 2
    down = identities_on(cluster, probe, victim, 1, "down")[0]
    others = [identities_on(cluster, probe, node, 1, "up")[0] for node in (0, 1)]
    for limiter in limiters.values():
        for who in (down, *others):
            assert not (await check(limiter, who)).degraded

    cluster.stop_node(victim)
    try:  # however it ends, the session's cluster is left ok for later tests
        rounds, outage_began = 0, time.monotonic()
        try:
            while rounds < 2 or not flagged_failed(cluster, victim):
                assert time.monotonic() - outage_began < RECOVERY, "the node was never flagged FAIL"
                # every limiter on every shard at once (sync ones in worker threads)
                jobs = [(on_error, who) for on_error in limiters for who in (down, *others)]
                with host_stalls() as stolen:
                    results = await asyncio.gather(
                        *(timed_check((limiters if who == down else patient)[e], who)
                          for e, who in jobs)  # fmt: skip
                    )
                for (on_error, who), (outcome, elapsed) in zip(jobs, results, strict=True):
                    if who == down:
                        bound = TIMEOUT + MARGIN + stolen()
                        assert elapsed < bound, f"a check took {elapsed:.2f} s (bound {bound:.2f})"
                        assert_policy(outcome, on_error)
                    else:
                        assert isinstance(outcome, Decision) and not outcome.degraded, outcome
                if rounds == 0:  # a batch that touches the down shard: the policy answers it all
                    start = time.monotonic()
                    with host_stalls() as stolen:
                        batch = await check_many(limiters["deny"], [down, *others])
                    assert time.monotonic() - start < TIMEOUT + MARGIN + stolen()
                    assert all(d.degraded and not d.allowed for d in batch), batch
                rounds += 1
                await asyncio.sleep(0.05)
        finally:
            cluster.start_node(victim, wait=None)
        restarted = time.monotonic()
        while True:
            # Bursts, as in production: the client re-learns the topology meanwhile.
            with host_stalls() as stolen:
                results = await asyncio.gather(
                    *(timed_check(limiters[e], down) for e in limiters for _ in range(4))
                )
            for (on_error, _), (outcome, elapsed) in zip(
                [(e, i) for e in limiters for i in range(4)], results, strict=True
            ):
                bound = TIMEOUT + MARGIN + stolen()
                assert elapsed < bound, f"a check took {elapsed:.2f} s (bound {bound:.2f})"
                if not (isinstance(outcome, Decision) and not outcome.degraded):
                    assert_policy(outcome, on_error)
            if all(isinstance(o, Decision) and not o.degraded for o, _ in results):
                break
            assert time.monotonic() - restarted < RECOVERY, f"still down: {results}"
            await asyncio.sleep(0.05)
        recovered = time.monotonic() - restarted
        outcome = await check(probe, down)
        assert outcome.allowed and not outcome.degraded
        for limiter in limiters.values():
            assert not (await check(limiter, down)).degraded
        print(f"{mode}: {rounds} rounds of checks during the outage; "
              f"shard back {recovered:.2f} s after the restart")  # fmt: skip
    finally:
        cluster.wait_ready(RECOVERY)

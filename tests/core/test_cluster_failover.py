"""Failover on a real Redis Cluster with replicas: 3 masters with one replica each on
loopback (`LocalCluster(replicas=1)`, started once for this module, stopped by PID).

While asyncio tasks and threads check many identities through async and sync
limiters (about two seconds of load, bounded), the master that serves a watched
identity is replaced by its replica:

- `CLUSTER FAILOVER` (coordinated): the master stops taking writes until its replica
  has caught up, so the promoted replica holds every admit the old master
  acknowledged. Measured: no admit lost (the new master's log of the watched
  identity holds exactly the acknowledged admits, plus at most one entry per check
  whose caller was not told of its admit: see `unacknowledged_at_most`), no rolling
  window over the limit.
- SIGKILL of the master, then the cluster's own failover (the replica wins an
  election once the others flag the master FAIL): replication is asynchronous, so
  admits the old master acknowledged but never streamed can be lost. Measured and
  bounded: only admits decided before the kill can be lost, and a rolling window
  holds at most the limit plus what the new master forgot (at most one limit).

- The bound, made visible: the replica is cut off (frozen, its link dropped) while
  the master acknowledges admits, then the master is killed and the replica forced
  over (`CLUSTER FAILOVER FORCE`): exactly the admits acknowledged after the cut are
  lost, none from before, none after.

In all, no exception escapes a limiter (their failure policies answer instead),
checks resume on the promoted replica by themselves (also a client that only sends
batches), and it gets the scripts it lacked (a replica's script cache is empty:
redis-py loads scripts on masters only).

Run with `-s` to see the figures (lost admits, how long checks were degraded).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable
from ratelimit.devtools.cluster import LocalCluster, slot_of
from tests.conftest import _missing
from tests.core.checks import assert_policy, check, check_many, timed_check

TIMEOUT = 1.0  # the limiters' and clients' timeout
TASKS, THREADS = 6, 3  # asyncio tasks and threads making checks
LEAD = 0.7  # seconds of load before the fault
TAIL = 1.0  # seconds of load after the failover, at least
HARD_STOP = 30.0  # the load stops after this many seconds whatever happens
RESUME = 10.0  # bound on how long after the failover checks may stay degraded
PROMOTION = 15.0  # bound on how long the cluster may take to promote a replica
LEDGER_WINDOW_MS, LEDGER_LIMIT = 60_000, 1_000_000  # never rejects: every admit is logged
HOT_WINDOW_MS, HOT_LIMIT = 1000, 20  # hammered: most checks are rejected
CROWD = 90  # other identities, spread over every shard


# The load -----------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One check: which limiter, which identity, when (host clock, s), and what came
    back: a Decision, or the exception that escaped the limiter (a 500 in an API)."""

    kind: str
    mode: str
    who: str
    sent: float
    received: float
    outcome: Decision | BaseException

    @property
    def decision(self) -> Decision | None:
        return self.outcome if isinstance(self.outcome, Decision) else None

    @property
    def acknowledged(self) -> bool:
        """An admit the script made and the caller was told of."""
        d = self.decision
        return d is not None and d.allowed and not d.degraded


@dataclass
class Run:
    records: list[Record]
    fault_began: float  # host clock, s
    fault_ended: float  # when the replica served the watched slot in every node's view


class Load:
    """Limiters of three kinds, each async and sync, on one cluster; `run()` keeps
    TASKS asyncio tasks and THREADS threads checking until told to stop.

    - "ledger": a sliding log that never rejects (its log is the record of every
      admit of the last minute); the watched identity `ledger`;
    - "hot": a sliding log at HOT_LIMIT per second, the watched identity `hot`;
    - "crowd": a fixed window (async) and GCRA (sync) on CROWD other identities.
    """

    def __init__(self, cluster: LocalCluster, prefix: str, on_error: dict[str, str]) -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.async_client = ratelimit.connect(cluster.url, timeout=TIMEOUT)
        self.sync_client = ratelimit.connect_sync(cluster.url, timeout=TIMEOUT)
        common = {"prefix": prefix, "timeout": TIMEOUT, "clock": "redis"}
        self.limiters: dict[str, dict[str, Any]] = {}
        for mode, module, client in (
            ("async", ratelimit, self.async_client),
            ("sync", ratelimit.sync, self.sync_client),
        ):
            options = common | {"on_error": on_error[mode]}
            crowd = module.FixedWindowLimiter if mode == "async" else module.TokenBucketLimiter
            self.limiters.setdefault("ledger", {})[mode] = module.SlidingWindowLimiter(
                client, window_ms=LEDGER_WINDOW_MS, limit=LEDGER_LIMIT, storage="sorted-set",
                **options,
            )
            self.limiters.setdefault("hot", {})[mode] = module.SlidingWindowLimiter(
                client, window_ms=HOT_WINDOW_MS, limit=HOT_LIMIT, **options
            )
            self.limiters.setdefault("crowd", {})[mode] = crowd(
                client, window_ms=1000, limit=5, **options
            )
        # The watched identities, both on the shard of the first one found.
        self.ledger = "ledger-0"
        self.master = self.node_of("ledger", "async", self.ledger)
        self.hot = next(
            f"hot-{i}" for i in range(10_000)
            if self.node_of("hot", "async", f"hot-{i}") == self.master
        )  # fmt: skip
        self.crowd = [f"crowd-{i}" for i in range(CROWD)]
        # Which checks the watched master serves, fixed before any fault moves its slots.
        self.on_watched_master = {
            (kind, mode, who): self.node_of(kind, mode, who) == self.master
            for kind in ("ledger", "hot", "crowd")
            for mode in ("async", "sync")
            for who in {"ledger": [self.ledger], "hot": [self.hot], "crowd": self.crowd}[kind]
        }

    def key(self, kind: str, who: str, mode: str = "async") -> str:
        return self.limiters[kind][mode].key_for(who)

    def node_of(self, kind: str, mode: str, who: str) -> int:
        return self.cluster.slot_owner(slot_of(self.key(kind, who, mode)))

    def work(self, i: int) -> tuple[str, str]:
        """The i-th check of a worker: the watched identities often, the crowd rest."""
        if i % 3 == 0:
            return "ledger", self.ledger
        if i % 3 == 1:
            return "hot", self.hot
        return "crowd", self.crowd[(i // 3) % CROWD]

    def on_master(self, records: list[Record]) -> list[Record]:
        """The records whose key the watched master served before the fault."""
        return [r for r in records if self.on_watched_master[(r.kind, r.mode, r.who)]]

    def watched(self, run: Run, kind: str) -> list[Record]:
        """The records of the watched identity of `kind` ("ledger" or "hot")."""
        who = self.ledger if kind == "ledger" else self.hot
        return [r for r in run.records if r.kind == kind and r.who == who]

    def resends(self, kind: str) -> int:
        """Script calls of `kind`'s limiters (async and sync) sent again after a dropped
        connection (`LimiterBase.resends`): each may have been charged twice."""
        return sum(self.limiters[kind][mode].resends for mode in ("async", "sync"))

    def sha(self, kind: str, mode: str = "async") -> str:
        return self.limiters[kind][mode].script_sha

    async def run(
        self, fault: Callable[[], object], resumed: Callable[[list[Record], float], bool]
    ) -> Run:
        """LEAD seconds of load, then `fault()` in a thread (it returns once the
        replica serves the watched slot), then load until `resumed(records, end of
        the fault)` holds and at least TAIL seconds have passed (RESUME at most)."""
        records: list[Record] = []
        stop = threading.Event()
        hard_stop = time.monotonic() + HARD_STOP

        def going() -> bool:
            return not stop.is_set() and time.monotonic() < hard_stop

        async def task(first: int) -> None:
            i = first
            while going():
                kind, who = self.work(i)
                i += 1
                limiter = self.limiters[kind]["async"]
                sent = time.time()
                try:
                    outcome: Decision | BaseException = await limiter.check(who)
                except Exception as exc:  # recorded: the test fails on any
                    outcome = exc
                records.append(Record(kind, "async", who, sent, time.time(), outcome))

        def thread(first: int) -> None:
            i = first
            while going():
                kind, who = self.work(i)
                i += 1
                sent = time.time()
                try:
                    outcome: Decision | BaseException = self.limiters[kind]["sync"].check(who)
                except Exception as exc:
                    outcome = exc
                records.append(Record(kind, "sync", who, sent, time.time(), outcome))

        tasks = [asyncio.create_task(task(7 * k)) for k in range(TASKS)]
        threads = [threading.Thread(target=thread, args=(11 * k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        try:
            await asyncio.sleep(LEAD)  # the load before the fault (a duration, not a wait)
            began = time.time()
            await asyncio.to_thread(fault)
            ended = time.time()
            deadline = ended + RESUME
            while time.time() < ended + TAIL or not resumed(list(records), ended):
                if time.time() > deadline:
                    last = {(r.kind, r.mode): r.outcome for r in records}
                    raise AssertionError(f"checks did not resume within {RESUME} s: {last}")
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for t in threads:
                t.join(timeout=HARD_STOP)
        return Run(records, began, ended)

    async def close(self) -> None:
        await self.async_client.aclose()
        self.sync_client.close()


def resumed_on(load: Load, kinds: tuple[str, ...]) -> Callable[[list[Record], float], bool]:
    """True once every (kind, mode) on the watched shard had a check sent after the
    failover that the script answered."""

    def resumed(records: list[Record], after: float) -> bool:
        done = {
            (r.kind, r.mode) for r in load.on_master(records)
            if r.sent > after and r.decision is not None and not r.decision.degraded
        }  # fmt: skip
        return all((kind, mode) in done for kind in kinds for mode in ("async", "sync"))

    return resumed


# What is measured ------------------------------------------------------------------


def raw_client(cluster: LocalCluster, index: int) -> redis.Redis:
    """A plain client for one node that returns bytes (log members are raw bytes)."""
    return redis.Redis(host="127.0.0.1", port=cluster.ports[index], socket_timeout=5)


def log_scores(cluster: LocalCluster, index: int, key: str) -> list[int]:
    """The scores in a sliding log, read from node `index` itself (which must serve
    its slot: anything else would answer MOVED)."""
    with raw_client(cluster, index) as client:
        return sorted(int(score) for _, score in client.zrange(key, 0, -1, withscores=True))


def admits(records: list[Record]) -> list[int]:
    """Decision times (ms, on the script's clock) of the acknowledged admits."""
    return sorted(r.decision.decided_at_ms for r in records if r.acknowledged)  # type: ignore[union-attr, misc]


def max_in_window(stamps: list[int], window_ms: int) -> int:
    """Largest number of stamps in any window (t - W, t]."""
    stamps = sorted(stamps)
    best, first = 0, 0
    for last, t in enumerate(stamps):
        while stamps[first] <= t - window_ms:
            first += 1
        best = max(best, last - first + 1)
    return best


def degraded_span(records: list[Record]) -> tuple[int, float]:
    """How many checks were degraded, and for how long (first sent to last answered)."""
    bad = [r for r in records if r.decision is not None and r.decision.degraded]
    if not bad:
        return 0, 0.0
    return len(bad), max(r.received for r in bad) - min(r.sent for r in bad)


def longest_gap(records: list[Record]) -> float:
    """The longest time (s) between two consecutive script-answered checks."""
    times = sorted(
        r.received for r in records if r.decision is not None and not r.decision.degraded
    )
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def report(name: str, run: Run, load: Load, lost: int, extra: int) -> None:
    shard = load.on_master(run.records)
    n_bad, span = degraded_span(shard)
    watched = [r for r in shard if r.kind in ("ledger", "hot")]
    print(
        f"\n{name}: {len(run.records)} checks in "
        f"{max(r.received for r in run.records) - min(r.sent for r in run.records):.1f} s, "
        f"failover took {run.fault_ended - run.fault_began:.2f} s; on the failed shard "
        f"{n_bad} degraded checks over {span * 1000:.0f} ms, longest gap between answered "
        f"checks of the watched identities {longest_gap(watched) * 1000:.0f} ms; "
        f"ledger: {len(admits(load.watched(run, 'ledger')))} acknowledged admits, "
        f"{lost} lost, {extra} counted without acknowledgement, "
        f"{load.resends('ledger')} sent again after a dropped connection"
    )


def multiset_minus(a: list[int], b: list[int]) -> list[int]:
    return sorted((Counter(a) - Counter(b)).elements())


def unacknowledged_at_most(load: Load, ledger: list[Record]) -> int:
    """How many entries the watched ledger's log may hold beyond the acknowledged
    admits: one per check whose script may have run although its caller was not told
    of an admit, which is

    - a degraded check (its reply came too late, or not at all), and
    - a script call sent again after its connection dropped (`LimiterBase.resends`):
      the first attempt ran, the old master streamed its write to the replica, then
      the connection dropped before the reply came back (the failover closes it), and
      the call sent again was charged again. Such entries share the millisecond of the
      batch that lost its reply.

    Anything beyond this bound (a check charged more often than it was sent) fails."""
    degraded = sum(r.decision.degraded for r in ledger)  # type: ignore[union-attr]
    return degraded + load.resends("ledger")


def assert_policies_only(run: Run, load: Load) -> None:
    """No exception escaped, and the other shards kept answering: a check there may
    only have run out of time (the client busy fetching slot maps while the failed
    node refused connections, on a shared 2-core host), and rarely (1%)."""
    escaped = [r for r in run.records if r.decision is None]
    assert not escaped, f"{len(escaped)} checks raised, e.g. {escaped[0].outcome!r}"
    shard = {id(r) for r in load.on_master(run.records)}
    others = [r for r in run.records if id(r) not in shard]
    degraded = [r for r in others if r.decision.degraded]  # type: ignore[union-attr]
    assert all(r.received - r.sent >= 0.9 * TIMEOUT for r in degraded), degraded[:3]
    assert len(degraded) <= 0.01 * len(others), f"{len(degraded)} of {len(others)}"
    if degraded:
        print(f"\n{len(degraded)} of {len(others)} checks on the other shards timed out")


# The cluster ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """3 masters with one replica each, for this module only (stopped by PID after).
    Each test leaves it ok, every replica in sync (`wait_ready`)."""
    if not LocalCluster.available():
        _missing("redis-server and redis-cli are needed for the Redis Cluster failover tests")
    with LocalCluster(tmp_path_factory.mktemp("replicated"), replicas=1) as local:
        yield local


@pytest.fixture
def restore(replicated: LocalCluster) -> Iterator[None]:
    """Leaves the cluster whole for the next test, also after a failure mid-test:
    every node running, every replica in sync."""
    yield
    for index, node in enumerate(replicated.nodes):
        if not node.running:
            replicated.start_node(index, wait=None)
    replicated.wait_ready(30)


@pytest.fixture
async def load_for(replicated: LocalCluster, prefix: str, restore: None):
    made: list[Load] = []

    def make(**on_error: str) -> Load:
        made.append(Load(replicated, prefix, on_error))
        return made[-1]

    yield make
    for load in made:
        await load.close()


def test_replicas_attached_and_in_sync(replicated, prefix):
    """Three masters serve every slot, each with one online replica that receives
    its writes (WAIT: acknowledged by one replica)."""
    masters = [i for i in range(6) if replicated.master_of(i) is None]
    assert len(masters) == 3
    assert {replicated.slot_owner(slot) for slot in (0, 8000, 16383)} == set(masters)
    for master in masters:
        (replica,) = replicated.replicas_of(master)
        assert replicated.master_of(replica) == master
        key = next(f"{prefix}:{i}" for i in range(10_000)
                   if replicated.slot_owner(slot_of(f"{prefix}:{i}")) == master)  # fmt: skip
        with replicated.nodes[master].admin() as admin:
            admin.set(key, "1", px=60_000)
            assert admin.execute_command("WAIT", 1, 5000) == 1
        with replicated.nodes[replica].admin() as admin:
            admin.execute_command("READONLY")
            assert admin.get(key) == "1"


# Coordinated failover -------------------------------------------------------------


async def test_cluster_failover_under_load_loses_no_admit(replicated, load_for):
    """CLUSTER FAILOVER on the replica of the watched identity's master, mid-load."""
    load = load_for(**{"async": "deny", "sync": "allow"})
    old = load.master
    (replica,) = replicated.replicas_of(old)
    with replicated.nodes[replica].admin() as admin:  # a replica's script cache is empty
        assert admin.script_exists(load.sha("ledger"), load.sha("hot")) == [False, False]

    run = await load.run(
        lambda: replicated.failover(load.key("ledger", load.ledger)),
        resumed_on(load, ("ledger", "hot", "crowd")),
    )

    assert_policies_only(run, load)
    assert replicated.slot_owner(slot_of(load.key("ledger", load.ledger))) == replica
    assert replicated.master_of(old) == replica  # the old master now follows it
    with replicated.nodes[replica].admin() as admin:  # reloaded after NOSCRIPT there
        assert admin.script_exists(load.sha("ledger"), load.sha("hot")) == [True, True]

    # Every admit acknowledged for the watched identity, by the old master or the new,
    # is in the new master's log; an entry without acknowledgement can only come from
    # a degraded check whose script ran, or from the first attempt of a check sent again
    # after a lost reply (stricter, never more admits: the hot identity below).
    ledger = load.watched(run, "ledger")
    acknowledged = admits(ledger)
    logged = log_scores(replicated, replica, load.key("ledger", load.ledger))
    lost = multiset_minus(acknowledged, logged)
    extra = multiset_minus(logged, acknowledged)
    report("CLUSTER FAILOVER", run, load, len(lost), len(extra))
    assert any(r.received < run.fault_began for r in ledger if r.acknowledged)
    assert any(r.sent > run.fault_ended for r in ledger if r.acknowledged)
    assert lost == []
    assert len(extra) <= unacknowledged_at_most(load, ledger), (extra, load.resends("ledger"))

    # The hot identity: never more than the limit in any rolling window, and the
    # limit was reached (the load really pushed it).
    hot = load.watched(run, "hot")
    assert max_in_window(admits(hot), HOT_WINDOW_MS) == HOT_LIMIT


# A master killed ---------------------------------------------------------------------


async def test_killed_master_replica_takes_over(replicated, load_for):
    """SIGKILL of the watched identity's master mid-load; the cluster promotes its
    replica by itself (an election once the other masters flag it FAIL)."""
    load = load_for(**{"async": "allow", "sync": "deny"})
    old = load.master
    (replica,) = replicated.replicas_of(old)
    with replicated.nodes[replica].admin() as admin:
        # A replica that was a master before (the test above) still has the scripts
        # cached; empty it, as on a replica that never was one.
        assert admin.script_flush()
        assert admin.script_exists(load.sha("ledger"), load.sha("hot")) == [False, False]
    # A client that only ever sends batches (check_many), idle during the outage.
    batch_client = ratelimit.connect(replicated.url, timeout=TIMEOUT)
    batches = ratelimit.SlidingWindowLimiter(
        batch_client, window_ms=60_000, limit=1000, prefix=f"{load.prefix}:b", on_error="deny"
    )
    assert not any(d.degraded for d in await batches.check_many([load.ledger] * 3))
    killed_at: list[float] = []

    def kill() -> None:
        replicated.kill_node(old)
        killed_at.append(time.time())  # the process is gone: nothing it decided is later
        replicated.wait_serving(load.key("ledger", load.ledger), replica, PROMOTION)

    run = await load.run(kill, resumed_on(load, ("ledger", "hot", "crowd")))

    assert_policies_only(run, load)
    with replicated.nodes[replica].admin() as admin:
        assert admin.script_exists(load.sha("ledger"), load.sha("hot")) == [True, True]
    ledger = load.watched(run, "ledger")
    acknowledged = admits(ledger)
    logged = log_scores(replicated, replica, load.key("ledger", load.ledger))
    lost = multiset_minus(acknowledged, logged)
    extra = multiset_minus(logged, acknowledged)
    report("SIGKILL + automatic failover", run, load, len(lost), len(extra))
    assert any(r.sent > run.fault_ended for r in ledger if r.acknowledged)
    # Asynchronous replication may lose what the old master acknowledged last, but
    # nothing decided once it was dead: every later admit is in the new master's log.
    assert all(ms <= killed_at[0] * 1000 for ms in lost), (lost, killed_at)
    assert len(extra) <= unacknowledged_at_most(load, ledger), (extra, load.resends("ledger"))

    # The hot identity: the new master counts what it received; what it never
    # received it may admit again, so a rolling window holds at most the limit twice.
    peak = max_in_window(admits(load.watched(run, "hot")), HOT_WINDOW_MS)
    print(f"hot identity: rolling-window peak {peak} at a limit of {HOT_LIMIT}")
    assert HOT_LIMIT <= peak <= 2 * HOT_LIMIT

    # Batches alone also find the promoted replica: the first one meets the dead node
    # (the policy answers it), and the client fetches the slot map before the next.
    try:
        deadline = time.monotonic() + RESUME
        while any(d.degraded for d in await batches.check_many([load.ledger] * 3)):
            assert time.monotonic() < deadline, "batches never reached the promoted replica"
            await asyncio.sleep(0.05)
    finally:
        await batch_client.aclose()

    # Restarted (empty, no persistence), the old master learns it was replaced and
    # follows the new one.
    replicated.start_node(old, wait=30)
    assert replicated.master_of(old) == replica
    assert replicated.slot_owner(slot_of(load.key("ledger", load.ledger))) == replica


# What asynchronous replication loses ----------------------------------------------

CUT = 0.4  # seconds the master acknowledges admits that its replica never receives


async def test_admits_lost_are_those_the_replica_never_received(replicated, load_for):
    """The bound, made visible: the replica is frozen (SIGSTOP) and the master drops
    its replication link (CLIENT KILL TYPE replica), then goes on acknowledging admits
    for CUT seconds, then is killed. The replica, thawed, reads what it had been sent
    and is promoted (CLUSTER FAILOVER FORCE). Exactly the admits acknowledged after the
    cut are lost (decided within the cut, to the ms), none from before, none after."""
    load = load_for(**{"async": "deny", "sync": "deny"})
    old = load.master
    (replica,) = replicated.replicas_of(old)
    times: dict[str, float] = {}

    def cut_then_kill() -> None:
        with replicated.nodes[replica].paused():
            with replicated.nodes[old].admin() as admin:
                times["cut_sent"] = time.time()
                assert admin.execute_command("CLIENT KILL TYPE replica") == 1
                times["cut_done"] = time.time()
            time.sleep(CUT)  # the load goes on against the master alone (a duration)
            replicated.kill_node(old)
            times["killed"] = time.time()
        # Thawed, the replica reads what its socket still holds, then sees the link
        # closed; only then is it promoted (promotion drops an unread stream).
        deadline = time.monotonic() + PROMOTION
        with replicated.nodes[replica].admin() as admin:
            while admin.info("replication")["master_link_status"] != "down":
                assert time.monotonic() < deadline, "the replica never saw its link close"
                time.sleep(0.01)
        replicated.failover(load.key("ledger", load.ledger), force=True, timeout=PROMOTION)

    run = await load.run(cut_then_kill, resumed_on(load, ("ledger", "hot", "crowd")))

    assert_policies_only(run, load)
    ledger = load.watched(run, "ledger")
    acknowledged = admits(ledger)
    logged = log_scores(replicated, replica, load.key("ledger", load.ledger))
    lost = multiset_minus(acknowledged, logged)
    extra = multiset_minus(logged, acknowledged)
    report("replica cut off, master killed, FAILOVER FORCE", run, load, len(lost), len(extra))
    cut_sent, cut_done, killed = (int(times[k] * 1000) for k in ("cut_sent", "cut_done", "killed"))
    surely_lost = [ms for ms in acknowledged if cut_done < ms <= killed]
    print(f"admits acknowledged while cut off: {len(surely_lost)}; lost: {len(lost)}")
    assert len(surely_lost) > 0  # the master did acknowledge admits meanwhile
    assert multiset_minus(surely_lost, lost) == []  # every one of them is lost
    assert all(cut_sent <= ms <= killed for ms in lost), (lost, times)  # and nothing else
    assert len(extra) <= unacknowledged_at_most(load, ledger), (extra, load.resends("ledger"))
    # The hot identity's lost admits can be granted again, within one limit more.
    peak = max_in_window(admits(load.watched(run, "hot")), HOT_WINDOW_MS)
    print(f"hot identity: rolling-window peak {peak} at a limit of {HOT_LIMIT}")
    assert HOT_LIMIT <= peak <= 2 * HOT_LIMIT

    replicated.start_node(old, wait=30)
    assert replicated.master_of(old) == replica


# The opt-in: an admit waits for the replica (`wait_replicas`) ------------------------


async def until_replicas_acknowledge(limiter: Any, identities: list[str], within_s: float = 15):
    """A replica that has just attached (a previous test restarted its node) may not
    acknowledge a WAIT yet: admit each identity under a scratch prefix (same slot, same
    master) until one comes back replicated, so the checks that follow are on a
    replica that answers."""
    warm = limiter.with_options(prefix=f"{limiter.prefix}:warm", on_error="deny")
    for who in identities:
        deadline = time.monotonic() + within_s
        while (await check(warm, who)).degraded:
            assert time.monotonic() < deadline, f"no replica acknowledged {who!r}"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_wait_replicas_admits_normally_with_a_healthy_replica(replicated, prefix, mode):
    """`wait_replicas=1` on a cluster client: with every replica attached, checks
    and batches decide as without it (WAIT answers 1), and each admit is on the
    replica by the time the caller hears of it."""
    module = ratelimit if mode == "async" else ratelimit.sync
    client = (ratelimit.connect if mode == "async" else ratelimit.connect_sync)(replicated.url)
    try:
        limiter = module.SlidingWindowLimiter(
            client, window_ms=60_000, limit=5, prefix=prefix, wait_replicas=1, on_error="raise",
            storage="sorted-set",
        )
        await until_replicas_acknowledge(limiter, ["single", "batch"])
        singles = [await check(limiter, "single") for _ in range(7)]
        batch = await check_many(limiter, ["batch"] * 7)
        for decisions in (singles, batch):
            assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
            assert not any(d.degraded for d in decisions)
        for who in ("single", "batch"):
            key = limiter.key_for(who)
            (replica,) = replicated.replicas_of(replicated.slot_owner(slot_of(key)))
            with raw_client(replicated, replica) as node:
                node.execute_command("READONLY")
                assert node.zcard(key) == 5  # no polling: WAIT already saw it there
    finally:
        if mode == "async":
            await client.aclose()
        else:
            client.close()


async def test_wait_replicas_loses_no_admit_when_the_replica_is_cut_off(
    replicated, prefix, restore
):
    """The cut-off scenario with `wait_replicas=1` (on_error="deny"): while the
    replica is frozen and cut off, admits are not acknowledged by it and come back as
    degraded denials ("WAIT: 0 of 1"); the master is killed and the replica forced
    over, and the new master holds every admit a caller was told of. The price: the
    new master admits nothing until it has a replica again (the old master, back)."""
    client = ratelimit.connect(replicated.url, timeout=TIMEOUT)
    limiter = ratelimit.SlidingWindowLimiter(
        client, window_ms=60_000, limit=1000, prefix=prefix, wait_replicas=1,
        on_error="deny", timeout=TIMEOUT, clock="redis", storage="sorted-set",
    )  # fmt: skip
    key = limiter.key_for("kept")
    old = replicated.slot_owner(slot_of(key))
    (replica,) = replicated.replicas_of(old)
    try:
        before = [await limiter.check("kept") for _ in range(5)]
        with replicated.nodes[replica].paused():
            with replicated.nodes[old].admin() as admin:
                assert admin.execute_command("CLIENT KILL TYPE replica") == 1
            cut = [await limiter.check("kept") for _ in range(2)]
            replicated.kill_node(old)
        with replicated.nodes[replica].admin() as admin:
            deadline = time.monotonic() + PROMOTION
            while admin.info("replication")["master_link_status"] != "down":
                assert time.monotonic() < deadline, "the replica never saw its link close"
                time.sleep(0.01)
        replicated.failover(key, force=True, timeout=PROMOTION)
        alone = await limiter.check("kept")  # the new master has no replica
        replicated.start_node(old, wait=30)  # back, as the new master's replica
        deadline = time.monotonic() + RESUME
        while (after := await limiter.check("kept")).degraded:  # its first ACKs may lag
            assert time.monotonic() < deadline, f"no admit within {RESUME} s: {after}"
    finally:
        await client.aclose()
    assert all(d.allowed and not d.degraded for d in before), before
    assert all(d.degraded and not d.allowed for d in cut), cut
    assert alone.degraded and not alone.allowed, alone
    assert after.allowed and not after.degraded, after
    acknowledged = sorted(d.decided_at_ms for d in (*before, after))  # type: ignore[type-var]
    logged = log_scores(replicated, replica, key)
    assert multiset_minus(acknowledged, logged) == []  # none lost
    print(f"\nwait_replicas=1, replica cut off: {len(acknowledged)} acknowledged, 0 lost")


# Every node down -------------------------------------------------------------------


async def test_every_node_down_gives_the_policy_not_an_exception(replicated, prefix, restore):
    """All six nodes stopped: the cluster client reaches no node at all (redis-py
    raises RedisClusterException, which is not a RedisError). Every limiter, async
    and sync, single checks and batches, answers by its policy; once the nodes are
    back the same limiters decide again by themselves."""
    clients = {"async": ratelimit.connect(replicated.url, timeout=TIMEOUT),
               "sync": ratelimit.connect_sync(replicated.url, timeout=TIMEOUT)}  # fmt: skip
    limiters = {
        (mode, on_error): (ratelimit if mode == "async" else ratelimit.sync).SlidingWindowLimiter(
            clients[mode],
            window_ms=60_000,
            limit=100,
            prefix=prefix,
            on_error=on_error,
            timeout=TIMEOUT,
        )  # fmt: skip
        for mode in ("async", "sync")
        for on_error in ("raise", "allow", "deny")
    }
    people = [f"p-{i}" for i in range(6)]
    try:
        for limiter in limiters.values():
            assert not any(d.degraded for d in await check_many(limiter, people))
        replicated.stop()
        for _ in range(2):  # the first failure, and the next check after it
            for (_, on_error), limiter in limiters.items():
                outcomes = await asyncio.gather(*(timed_check(limiter, who) for who in people))
                for outcome, _ in outcomes:
                    assert_policy(outcome, on_error)
                try:
                    batch: Any = await check_many(limiter, people)
                except RateLimiterUnavailable as exc:
                    batch = [exc] * len(people)
                for outcome in batch:
                    assert_policy(outcome, on_error)
        for index in range(len(replicated.nodes)):
            replicated.start_node(index, wait=None)
        replicated.wait_ready(30)
        deadline = time.monotonic() + RESUME
        for limiter in limiters.values():
            while (await check(limiter, "p-0")).degraded:
                assert time.monotonic() < deadline, f"{limiter!r} did not resume"
                await asyncio.sleep(0.05)
    finally:
        await clients["async"].aclose()
        clients["sync"].close()

"""Auto-pipelining: checks made on one client while another waits for Redis share a round trip.

In an asyncio service many `await limiter.check(...)` are in flight at once. Rather
than one EVALSHA round trip each, a check made while none of its client's checks is
waiting for Redis goes at once, exactly as without auto-pipelining, and the checks
made while one is waiting are queued; a task started for them sends them as ONE
non-transactional pipeline (on a Redis Cluster, one per node) once the checks sent
alone before them are answered, so that Redis decides them after those. The tasks a
batch answers run in one turn, and their next checks share a batch again. Nothing
waits on a timer, nothing reads the event loop's internals, and any task factory
(asyncio's eager one too) batches alike. Limiters of any algorithm on the same client
share the batch.

Each check keeps its own reply, its own timeout and its own failure policy (the
limiter's `check` applies them around the future it awaits). Decisions are those of
the same checks in sequence: Redis runs a pipeline's scripts one after another in
the order they were queued, which is the order the checks were made. The round trips
of a batch (NOSCRIPT, a dropped connection) are `ratelimit.plan.batch`'s.

When a limiter with `wait_replicas` has a check in the batch, one `WAIT` follows the
batch's scripts on the same connection (it covers every write before it there):
the most replicas any of them asks for, within the shortest of their WAIT timeouts.
Each such limiter's admits are then held to its own `wait_replicas`; the checks of
limiters without it get the decisions they would get alone (after that WAIT). On a
Redis Cluster each waiting check goes on its own, with its WAIT, to its key's node.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Any

from . import cluster_client, plan
from .cluster_client import is_cluster

# At most this many checks per pipeline: a larger turn sends several. Bounds the memory
# of one batch and the size of one write.
MAX_BATCH = 1000

# One queued check: (limiter, KEYS, ARGV, the future its caller awaits).
Entry = tuple[Any, list[Any], list[Any], asyncio.Future[Any]]


class _Batch:
    __slots__ = ("loop", "entries", "deadline", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: list[Entry] = []
        self.deadline = 0.0  # loop time by which every caller has given up
        self.waiting = False  # a check of a limiter with wait_replicas is in it


class AutoPipeline:
    """The open batch of one client and the sends of its checks in flight. Holds no
    reference to the client (the registry below is keyed weakly on it): each queued
    check brings its limiter, and the limiter its client."""

    def __init__(self, cluster: bool) -> None:
        self._cluster = cluster
        self._open: _Batch | None = None
        self._flushing: set[asyncio.Task[Any]] = set()  # strong references while they run
        # What is in flight on `_loop` (the counters of a loop that is gone are dropped):
        # checks sent alone (the limiter counts them, see AsyncLimiter.check), flushes,
        # and the flushes waiting for the lone checks to be answered.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lone = 0
        self._flights = 0
        self._waiters: list[asyncio.Future[Any]] = []
        # The loop whose current turn runs the tasks a flush just answered (see `_woke`).
        self._waking: asyncio.AbstractEventLoop | None = None
        self._starting = False  # inside `submit`'s create_task (see `_flush`)

    def _here(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new loop: what the old one had in flight is gone
            self._loop, self.lone, self._flights, self._waiters = loop, 0, 0, []
        return loop

    def alone(self) -> bool:
        """True when a check made now may go at once, on its own: none of this
        client's checks is waiting for Redis, no batch is open, and this turn is not
        the one in which the tasks a flush just answered run (they make their next
        checks together). Otherwise it joins a batch (`submit`)."""
        loop = self._here()
        if self.lone or self._flights or self._waking is loop:
            return False
        batch = self._open
        return batch is None or batch.loop is not loop

    def lone_done(self) -> None:
        """A check sent alone has its answer (or gave up): the batches made meanwhile,
        which wait for it so that Redis decides it first, may go."""
        self.lone = max(0, self.lone - 1)  # (0 already if its loop was replaced)
        if not self.lone:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _after_lone(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until the checks sent alone on `loop` have their answers."""
        while self.lone and self._loop is loop:
            waiter = loop.create_future()
            self._waiters.append(waiter)
            await waiter

    def _woke(self, loop: asyncio.AbstractEventLoop) -> None:
        """Mark the next turn as the one in which the tasks just answered run: their
        wake-ups are queued already, and this call's clearing comes after them."""
        self._waking = loop
        loop.call_soon(self._woken, loop)

    def _woken(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._waking is loop:
            self._waking = None

    def submit(self, limiter: Any, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        """Queue one script call; the future gets the script's raw reply or the error
        that stopped it."""
        loop = asyncio.get_running_loop()
        batch = self._open
        if batch is None or batch.loop is not loop:  # (a batch of a closed loop is dead)
            batch = self._open = _Batch(loop)
            self._starting = True
            try:
                task = loop.create_task(self._flush(batch))
            finally:
                self._starting = False
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        future = loop.create_future()
        batch.entries.append((limiter, keys, args, future))
        deadline = loop.time() + limiter.timeout
        if deadline > batch.deadline:
            batch.deadline = deadline
        if len(batch.entries) >= MAX_BATCH:
            self._open = None  # full: the next check opens another batch
        return future

    def submit_waiting(self, limiter: Any, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        """`submit` for a limiter with `wait_replicas`: its batch ends with a WAIT."""
        batch = self._open
        future = self.submit(limiter, keys, args)
        if batch is None or batch.loop is not asyncio.get_running_loop():
            batch = self._open  # the one `submit` just opened (MAX_BATCH > 1)
        assert batch is not None
        batch.waiting = True
        return future

    async def _flush(self, batch: _Batch) -> None:
        loop = self._here()
        if self._starting:
            # An eager task factory runs a new task at once, inside `submit`: the
            # checks of this turn have not joined yet. Go on next turn, as a task
            # started the usual way does.
            await asyncio.sleep(0)
        self._flights += 1
        entries = batch.entries
        try:
            # Past the last caller's deadline nobody waits for an answer: stop, and
            # free the connection (a client without socket timeouts would hang).
            async with asyncio.timeout_at(batch.deadline):
                # Checks sent alone before this batch are decided first, as made: the
                # batch goes once they are answered (and takes in the checks made
                # meanwhile).
                await self._after_lone(loop)
                if self._open is batch:
                    self._open = None
                # A caller that gave up (timeout, cancellation) before the send is
                # left out: its request is never counted.
                entries = [e for e in batch.entries if not e[3].done()]
                if len(entries) == 1:
                    await _single(entries[0])
                elif self._cluster:
                    await _cluster(entries, batch.waiting)
                elif entries:
                    await _plain(entries, batch.waiting)
        except asyncio.CancelledError:
            for entry in entries:
                entry[3].cancel()
            raise
        except Exception as exc:  # each caller's failure policy decides
            for entry in entries:
                _settle(entry[3], exc)
        finally:
            if self._open is batch:  # (given up before it was sent)
                self._open = None
            if self._loop is loop:
                self._flights -= 1
            if entries:
                self._woke(loop)


def _settle(future: asyncio.Future[Any], reply: Any) -> None:
    """Hand a reply (or an error) to a caller that still waits."""
    if future.done():
        return
    if isinstance(reply, BaseException):
        future.set_exception(reply)
        future.exception()  # retrieved: no "never retrieved" log if its caller is gone
    else:
        future.set_result(reply)


def _answer(entries: list[Entry], results: list[Any]) -> None:
    """Each caller's reply from its (reply, WAIT's count), judged by its own limiter."""
    for (limiter, _, _, future), result in zip(entries, results, strict=True):
        if result is None:  # its caller gave up before it was sent
            continue
        try:
            reply = limiter._judge(result)
        except Exception as exc:
            reply = exc
        _settle(future, reply)


async def _single(entry: Entry) -> None:
    # A batch of one is a lone call, with the limiter's own plan.
    limiter, keys, args, future = entry
    try:
        reply = await limiter._run(keys, args)
    except Exception as exc:
        reply = exc
    _settle(future, reply)


async def _plain(entries: list[Entry], waiting: bool = False) -> None:
    calls = [(limiter._script, keys, args) for limiter, keys, args, _ in entries]
    wait = _wait_for(entries) if waiting else None
    wanted = lambda i: not entries[i][3].done()  # noqa: E731 (callers that still wait)
    batch = plan.batch(calls, wait, math.inf, wanted, _resent(entries))
    _answer(entries, await plan.arun(batch, entries[0][0]._send, None))


def _resent(entries: list[Entry]) -> plan.Resent:
    """`plan.Resent` for a batch of several limiters' checks: each limiter counts its own."""

    def count(calls: list[int]) -> None:
        for i in calls:
            entries[i][0]._count_resends([i])

    return count


def _wait_for(entries: list[Entry]) -> tuple[Any, ...] | None:
    """The WAIT for these entries: the most replicas any asks for, within the
    shortest of their WAIT timeouts; None when none of them asks."""
    waiting = [e[0] for e in entries if e[0].wait_replicas]
    if not waiting:
        return None
    return (
        "WAIT",
        max(limiter.wait_replicas for limiter in waiting),
        min(limiter._wait_ms for limiter in waiting),
    )


async def _cluster(entries: list[Entry], waiting: bool = False) -> None:
    """One pipeline per node, at once; each group is answered as soon as its node
    replies, so a stalled or lost node holds up only its own checks."""
    if waiting:  # a waiting check needs its own connection to its node: one by one
        alone = [e for e in entries if e[0].wait_replicas]
        entries = [e for e in entries if not e[0].wait_replicas]
        waits = [_single(entry) for entry in alone]
    groups: dict[Any, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(_node(entry), []).append(entry)
    batches = [_cluster_group(group) for group in groups.values()]
    await asyncio.gather(*batches, *(waits if waiting else ()))


def _node(entry: Entry) -> Any:
    try:
        return entry[0]._client.get_node_from_key(entry[1][0]).name
    except Exception:  # no slot map yet: one group, the pipeline routes it
        return None


async def _cluster_group(group: list[Entry]) -> None:
    if len(group) == 1:
        await _single(group[0])
        return
    calls: list[plan.Call] = [(limiter._script, keys, args) for limiter, keys, args, _ in group]
    try:
        results: Any = await cluster_client.arun_batch(
            group[0][0]._client, calls, None, _resent(group)
        )
    except Exception as exc:
        for entry in group:
            _settle(entry[3], exc)
        return
    _answer(group, results)


# One AutoPipeline per client, whatever limiters (and copies) use it. Weak keys: a
# client nobody uses any more is not kept alive by this table.
_BY_CLIENT: weakref.WeakKeyDictionary[Any, AutoPipeline] = weakref.WeakKeyDictionary()


def for_client(client: Any) -> AutoPipeline:
    """The AutoPipeline that every limiter on `client` shares."""
    try:
        found = _BY_CLIENT.get(client)
        if found is None:
            found = _BY_CLIENT[client] = AutoPipeline(is_cluster(client))
        return found
    except TypeError:  # not weak-referenceable: the limiter batches on its own
        return AutoPipeline(is_cluster(client))

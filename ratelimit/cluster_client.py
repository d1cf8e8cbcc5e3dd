"""What the limiters need to run through a Redis Cluster client.

`ratelimit.backends.connect()` makes the cluster clients; this module adapts them:
a sync client whose every command is bounded by the limiter's timeout, a guard for
a redis-py race in the asyncio client, and batches of script calls (`check_many`)
pipelined per node.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.cluster
import redis.exceptions
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry


def bounded_cluster(client: redis.RedisCluster, timeout: float) -> redis.RedisCluster:
    """A `redis.RedisCluster` on the same nodes whose every command gives up after
    `timeout`: socket timeouts of `timeout` and no cluster-level retries.

    A cluster client made without timeouts waits forever for a node that hangs, and
    its retries (each a topology refresh plus a new attempt) multiply even a bounded
    wait; the limiter retries a dropped connection once itself. Its connection
    options (credentials, TLS, encoding) are kept; the client's own connect hook,
    bound to the original client, is not.
    """
    manager = client.nodes_manager
    # Hooks bound to the original client are left for the copy to make its own.
    own = ("redis_connect_func", "oss_cluster_maint_notifications_handler")
    kwargs = {k: v for k, v in manager.connection_kwargs.items() if k not in own}
    kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    known = client.get_nodes() or list(manager.startup_nodes.values())
    return redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(node.host, node.port) for node in known],
        retry=Retry(NoBackoff(), 0),
        require_full_coverage=manager._require_full_coverage,
        dynamic_startup_nodes=manager._dynamic_startup_nodes,
        address_remap=manager.address_remap,
        **kwargs,
    )


# Batches of script calls on a cluster (`check_many`) --------------------------------
#
# redis-py's cluster pipelines split a batch by node and send each node its share in
# one round trip, but they do not load scripts (the sync one even refuses `evalsha()`),
# so the raw EVALSHA is queued instead, routed by its key like any keyed command. A
# node that lacks the script (new, restarted, flushed) answers NOSCRIPT to all of its
# share and runs none of it: those requests, and only those, go again with EVAL (which
# carries the script and cannot miss), in their order, after the script is loaded on
# every master for the next batch. Requests of one identity share a node, so they stay
# in order, and nothing is counted twice. A reply that is still an error (a node down)
# is raised, so the limiter's failure policy answers the batch.


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client, sync or asyncio (guarded or not)."""
    return isinstance(client, redis.RedisCluster | redis.asyncio.RedisCluster | GuardedCluster)


# redis-py's asyncio cluster client (8.1) recycles connections in the background after
# every topology refresh (its first use, a node restart). A check that picks such a
# connection at the wrong moment fails inside redis-py with AttributeError or TypeError
# on a None socket writer instead of a ConnectionError, which would escape the
# limiter's failure policy. Such errors, and only when raised inside redis-py or
# asyncio's streams, are turned into ConnectionError: the limiter then retries once on a
# fresh connection, or applies its policy.

_RACE_MODULES = ("redis.", "asyncio.")


def _race(exc: BaseException) -> bool:
    if not isinstance(exc, AttributeError | TypeError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith(_RACE_MODULES)


async def _guard(call: Any) -> Any:
    try:
        return await call
    except (AttributeError, TypeError) as exc:
        if not _race(exc):
            raise
        raise redis.exceptions.ConnectionError(f"connection recycled mid-command: {exc}") from exc


class GuardedCluster:
    """An asyncio RedisCluster whose script commands raise ConnectionError, not
    AttributeError/TypeError, when redis-py races with itself (see above)."""

    def __init__(self, client: redis.asyncio.RedisCluster) -> None:
        self.client = client

    async def evalsha(self, *args: Any) -> Any:
        return await _guard(self.client.evalsha(*args))

    async def eval(self, *args: Any) -> Any:
        return await _guard(self.client.eval(*args))

    async def script_load(self, script: Any) -> Any:
        return await _guard(self.client.script_load(script))

    def register_script(self, script: Any) -> AsyncScript:
        return AsyncScript(self, script)  # so that its registered_client is this guard

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def guarded(client: Any) -> Any:
    """`GuardedCluster(client)` for an asyncio RedisCluster; any other client as it is."""
    if isinstance(client, redis.asyncio.RedisCluster):
        return GuardedCluster(client)
    return client


Batch = list[tuple[list[Any], list[Any]]]


def _queue(pipe: Any, command: str, body: str, batch: Batch, which: list[int]) -> None:
    for i in which:
        keys, args = batch[i]
        pipe.execute_command(command, body, len(keys), *keys, *args)


def _noscript(replies: list[Any]) -> list[int]:
    missing = redis.exceptions.NoScriptError
    return [i for i, reply in enumerate(replies) if isinstance(reply, missing)]


def _raise_first_error(replies: list[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def cluster_batch(client: redis.RedisCluster, script: Any, batch: Batch) -> list[Any]:
    """Run `script` once per (keys, args) of `batch` on a sync cluster, pipelined per
    node; the replies in order (see the comment above)."""
    pipe = client.pipeline(transaction=False)
    _queue(pipe, "EVALSHA", script.sha, batch, list(range(len(batch))))
    replies = pipe.execute(raise_on_error=False)
    missing = _noscript(replies)
    if missing:
        script.sha = client.script_load(script.script)
        pipe = client.pipeline(transaction=False)
        _queue(pipe, "EVAL", script.script, batch, missing)
        for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    return _raise_first_error(replies)


async def cluster_batch_async(client: Any, script: Any, batch: Batch) -> list[Any]:
    """`cluster_batch` for an asyncio cluster client. Unlike the sync pipeline, the
    asyncio one hands back a dropped connection's share as ConnectionErrors; that
    share is sent once more (on a fresh connection) before anything else."""

    async def send(command: str, body: str, which: list[int]) -> None:
        pipe = client.pipeline(transaction=False)
        _queue(pipe, command, body, batch, which)
        answers = await _guard(pipe.execute(raise_on_error=False))
        for i, reply in zip(which, answers, strict=True):
            replies[i] = reply

    replies: list[Any] = [None] * len(batch)
    await send("EVALSHA", script.sha, list(range(len(batch))))
    dropped = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.ConnectionError)]
    if dropped:
        await send("EVALSHA", script.sha, dropped)
    missing = _noscript(replies)
    if missing:
        script.sha = await _guard(client.script_load(script.script))
        await send("EVAL", script.script, missing)
    return _raise_first_error(replies)

"""What a check, or a batch of checks, sends to Redis, round trip by round trip.

A plan is a generator. It yields the commands of one round trip (sent in order on one
connection), is sent back their replies (error replies in place) or the error that
stopped the round trip, and returns the outcome. It does no I/O: the asyncio and sync
limiters (`ratelimit.limiters`, `ratelimit.sync`) and the auto-pipeline only send what
it asks for (`run`, `arun`), so every rule here holds for all of them:

- NOSCRIPT (a restart, a failover, SCRIPT FLUSH): the script is loaded and called again
  in the next round trip; if a second flush lands in between, EVAL carries the script
  itself and cannot miss. A NOSCRIPT reply means the script did not run, so only such
  calls are sent again, and nothing is counted twice by it.
- A dropped connection: the round trip goes once more, on a fresh connection, if the
  first attempt failed within `retry_within` seconds. Had the first attempt reached
  Redis (the connection dropped after the script ran, before its reply came back), its
  requests are counted twice: stricter, never over-admitting. A script call is sent
  again so at most once, and `resent`, when given, is told of each such call (the
  limiters count them: `LimiterBase.resends`), so a request is charged at most once
  plus once per resend.
- `wait`, a WAIT command, closes every round trip that calls a script, on the same
  connection, so that its count covers the writes before it.
- A peek is a check (`check`) of the limiter's read-only script, with no WAIT (it
  writes nothing) and no resend count (a peek sent twice charges nothing); a reset is
  one UNLINK (`command`), which may run twice with the same effect.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

import redis.exceptions

Command = tuple[Any, ...]
Commands = list[Command]
# A plan: yields round trips, receives their replies (or the error), returns a result.
Plan = Generator[Commands, Any, Any]
# One script call: (the registered script, KEYS, ARGV).
Call = tuple[Any, Sequence[Any], Sequence[Any]]

_NOSCRIPT = redis.exceptions.NoScriptError
_DROPPED = redis.exceptions.ConnectionError


def _advance(plan: Plan, outcome: Any) -> Commands:
    """Hand `plan` a round trip's replies, or the error that stopped it; the next
    round trip's commands (StopIteration carries the plan's result)."""
    if isinstance(outcome, BaseException):
        return plan.throw(outcome)
    return plan.send(outcome)


def run(plan: Plan, send: Callable[[Any, Commands], Any], key: Any) -> Any:
    """Drive `plan` with a blocking `send(key, commands)` that returns the replies or
    the error that stopped them (it raises only what the plan must not see)."""
    commands = next(plan)
    try:
        while True:
            commands = _advance(plan, send(key, commands))
    except StopIteration as done:
        return done.value


async def arun(plan: Plan, send: Callable[[Any, Commands], Awaitable[Any]], key: Any) -> Any:
    """`run` with an asyncio `send`."""
    commands = next(plan)
    try:
        while True:
            commands = _advance(plan, await send(key, commands))
    except StopIteration as done:
        return done.value


# Told of the calls (their indices in a batch; [0] for a check) sent again after a
# dropped connection, just before they go.
Resent = Callable[[list[int]], object]


def check(
    script: Any,
    keys: Sequence[Any],
    args: Sequence[Any],
    wait: Command | None,
    retry_within: float,
    resent: Resent | None = None,
) -> Plan:
    """One script call: returns (its reply, WAIT's count or None); the reply may be an
    error reply, which the limiter judges (`LimiterBase._judge`)."""
    if wait:
        tail = [wait]
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args), wait]
    else:
        tail = []
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args)]
    started = time.monotonic()
    retried = False
    stage = 0
    while True:
        try:
            replies = yield commands
        except _DROPPED:
            if retried or time.monotonic() - started > retry_within:
                raise
            retried = True
            if resent is not None:
                resent([0])
            continue
        reply = replies[len(replies) - 1 - len(tail)]
        if stage == 1 and isinstance(replies[0], Exception):
            reply = replies[0]  # the load itself was refused (NOPERM, OOM...): say so
        if stage == 2 or not isinstance(reply, _NOSCRIPT):
            return reply, (replies[-1] if tail else None)
        stage += 1
        call = (len(keys), *keys, *args)
        if stage == 1:  # load it, and call it again in the same round trip
            commands = [("SCRIPT", "LOAD", script.script), ("EVALSHA", script.sha, *call), *tail]
        else:  # flushed again between the load and the call: EVAL carries the script
            commands = [("EVAL", script.script, *call), *tail]


def command(command: Command, retry_within: float) -> Plan:
    """One plain command that may safely run twice (a reset's UNLINK): sent once more,
    on a fresh connection, after a dropped connection within `retry_within` seconds.
    Returns its reply, which may be an error reply."""
    started = time.monotonic()
    try:
        replies = yield [command]
    except _DROPPED:
        if time.monotonic() - started > retry_within:
            raise
        replies = yield [command]
    return replies[0]


def batch(
    calls: Sequence[Call],
    wait: Command | None,
    retry_within: float,
    wanted: Callable[[int], bool] | None = None,
    resent: Resent | None = None,
) -> Plan:
    """Script calls on one connection (or through a cluster pipeline), in order:
    returns a list of (reply, WAIT's count or None) per call, error replies in place.

    Calls that met NOSCRIPT go again (with SCRIPT LOAD, then with EVAL); so do calls
    whose own reply is a dropped connection (a cluster pipeline's share of a node that
    went away), once. `wanted(i)`, when given, leaves out calls whose callers no longer
    wait before each round trip; `resent`, when given, is told which calls go again
    after a dropped connection."""
    out: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    tail = [wait] if wait else []
    started = time.monotonic()
    retried = False
    again_after_drop: set[int] = set()  # the calls of a round trip that dropped
    stage = "EVALSHA"
    while todo:
        if wanted is not None:
            todo = [i for i in todo if wanted(i)]
            if not todo:
                break
        if again_after_drop:
            if resent is not None:
                resent([i for i in todo if i in again_after_drop])
            again_after_drop = set()
        commands: Commands = []
        if stage == "LOAD":
            bodies = {calls[i][0].sha: calls[i][0].script for i in todo}
            commands += [("SCRIPT", "LOAD", body) for body in bodies.values()]
        for i in todo:
            script, keys, args = calls[i]
            head = ("EVAL", script.script) if stage == "EVAL" else ("EVALSHA", script.sha)
            commands.append((*head, len(keys), *keys, *args))
        try:
            replies = yield commands + tail
        except _DROPPED:
            if retried or time.monotonic() - started > retry_within:
                raise
            retried = True
            again_after_drop = set(todo)
            continue
        acked = replies[-1] if tail else None
        refused = next(
            (r for r in replies[: len(commands) - len(todo)] if isinstance(r, Exception)), None
        )
        if refused is not None:  # a load itself was refused (NOPERM, OOM...): say so
            replies = [refused] * len(todo)
        else:
            replies = replies[len(commands) - len(todo) : len(commands)]
        again, dropped = [], []
        for i, reply in zip(todo, replies, strict=True):
            if isinstance(reply, _NOSCRIPT) and stage != "EVAL":
                again.append(i)
            elif isinstance(reply, _DROPPED) and not retried:
                dropped.append(i)
            out[i] = (reply, acked)
        if dropped:  # their share again, as it was, before anything else
            retried = True
            again_after_drop = set(dropped)
            todo = dropped + again
            continue
        todo = again
        stage = "LOAD" if stage == "EVALSHA" else "EVAL"
    return out

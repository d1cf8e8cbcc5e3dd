"""A workload that makes every kind of check every limiter makes, on one client: the
four algorithms and the compact log, concurrency leases (acquire, a rejection, renew,
release, expiry), single checks, `check_many`, concurrent checks
(auto-pipelined for asyncio), peeks and resets, the rare script paths, Redis's own clock,
and recovery from SCRIPT FLUSH (also a second flush during the reload, which goes by EVAL). Its
outcomes compare across connections (an ACL user and an admin, TLS and plain TCP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import redis

import ratelimit
from ratelimit import Decision, RateLimiterUnavailable, algorithms
from ratelimit.clock import ManualClock
from tests.core.checks import check, check_many, peek, reset

SPECS = [*algorithms.NAMES, algorithms.COMPACT_LOG.name]


Outcome = Decision | RateLimiterUnavailable


class Workload:
    """Every kind of check every limiter makes, on one client, recording outcomes."""

    def __init__(self, kind: str, client: Any, admin: redis.Redis, prefix: str, on_error: str):
        self.kind, self.client, self.admin = kind, client, admin
        self.prefix, self.on_error = prefix, on_error
        self.outcomes: list[tuple[str, Any]] = []  # (step, normalised outcome)
        self.failures: list[Outcome] = []
        # Resets Redis could not carry out: RateLimiterUnavailable whatever on_error says.
        self.reset_failures: list[RateLimiterUnavailable] = []

    def limiter(self, spec: str, window: float, limit: int, **options: Any) -> Any:
        return algorithms.get(spec).build(
            self.kind,
            self.client, window, limit, self.prefix, on_error=self.on_error, timeout=5, **options,
        )  # fmt: skip

    def _record(self, step: str, outcome: Outcome, exact: bool = True) -> None:
        if isinstance(outcome, RateLimiterUnavailable) or outcome.degraded:
            self.failures.append(outcome)
            self.outcomes.append((step, "failed"))
        elif exact:
            self.outcomes.append((step, outcome))
        else:  # decided on Redis's clock: the times differ from run to run
            self.outcomes.append((step, (outcome.allowed, outcome.remaining)))

    async def one(self, step: str, limiter: Any, who: str, cost: int = 1, exact=True) -> None:
        try:
            outcome: Outcome = await check(limiter, who, cost)
        except RateLimiterUnavailable as exc:
            outcome = exc
        self._record(step, outcome, exact)

    async def peek(self, step: str, limiter: Any, who: str, cost: int = 1) -> None:
        try:
            outcome: Outcome = await peek(limiter, who, cost)
        except RateLimiterUnavailable as exc:
            outcome = exc
        self._record(step, outcome)

    async def reset(self, step: str, limiter: Any, who: str) -> None:
        try:
            done = await reset(limiter, who)
        except RateLimiterUnavailable as exc:
            self.reset_failures.append(exc)
            self.outcomes.append((step, "failed"))
            return
        self.outcomes.append((step, done))

    async def many(self, step: str, limiter: Any, who: list[str]) -> None:
        try:
            outcomes: list[Outcome] = await check_many(limiter, who)
        except RateLimiterUnavailable as exc:
            outcomes = [exc]
        for outcome in outcomes:
            self._record(step, outcome)

    async def together(self, step: str, limiter: Any, who: list[str]) -> None:
        """Concurrent checks: one auto-pipelined batch for an asyncio limiter (in the
        order made); in sequence for a sync one."""
        if self.kind == "sync":
            for name in who:
                await self.one(step, limiter, name)
            return

        async def one(name: str) -> Outcome:
            try:
                return await limiter.check(name)
            except RateLimiterUnavailable as exc:
                return exc

        for outcome in await asyncio.gather(*(one(name) for name in who)):
            self._record(step, outcome)

    async def run(self) -> None:
        admin = self.admin
        for spec in SPECS:
            clock = ManualClock(1_000_000.0)
            lim = self.limiter(spec, 1, 3, clock=clock)
            for _ in range(4):  # the fourth is rejected
                await self.one(f"{spec} a", lim, "a")
            await self.one(f"{spec} cost", lim, "b", 2)
            await self.many(f"{spec} many", lim, ["a", "b", "c", "c"])
            await self.together(f"{spec} together", lim, ["c", "d", "d", "e", "a", "d"])
            clock.advance(1.5)
            await self.one(f"{spec} later", lim, "a")
            # A peek on a full identity and on a fresh one, then a reset of each.
            await self.peek(f"{spec} peek", lim, "d")
            await self.peek(f"{spec} peek", lim, "p", 2)
            await self.reset(f"{spec} reset", lim, "d")
            await self.reset(f"{spec} reset", lim, "p")
            await self.one(f"{spec} after reset", lim, "d")
            # Redis's own clock: TIME in the script.
            on_redis = self.limiter(spec, 60, 2, clock="redis")
            for _ in range(3):
                await self.one(f"{spec} redis clock", on_redis, "r", exact=False)

        # The compact log moving its start past a chunk (HDEL), then emptying (DEL).
        clock = ManualClock(2_000_000.0)
        log = self.limiter("logc", 1, 100, clock=clock)
        await self.one("logc chunks", log, "x", 70)
        clock.advance(0.5)
        await self.one("logc chunks", log, "x", 10)
        clock.advance(0.501)
        await self.one("logc chunks", log, "x", 1)
        clock.advance(3)
        await self.one("logc chunks", log, "x", 1)

        # A key of another type (an earlier version's hash) is replaced.
        for spec in ("fw", "swc"):
            lim = self.limiter(spec, 1, 3, clock=ManualClock(3_000_000.0))
            admin.delete(lim.key_for("w"))
            admin.hset(lim.key_for("w"), "old", "state")
            await self.one(f"{spec} wrong type", lim, "w")

        # SCRIPT FLUSH by an admin: a lone check, a pipelined batch and an
        # auto-pipelined one each load the script again.
        for spec in SPECS:
            lim = self.limiter(spec, 1, 5, clock=ManualClock(4_000_000.0))
            admin.script_flush()
            await self.one(f"{spec} flushed", lim, "n")
            admin.script_flush()
            await self.peek(f"{spec} flushed peek", lim, "n")
            admin.script_flush()
            await self.many(f"{spec} flushed many", lim, ["n", "m"])
            admin.script_flush()
            await self.together(f"{spec} flushed together", lim, ["n", "m", "o"])

        # A second flush between the reload and the retry: the check goes by EVAL. The
        # reload's round trip (SCRIPT LOAD, then the call) is split here so that an
        # admin's flush lands between its two commands.
        lim = self.limiter("log", 1, 5, clock=ManualClock(5_000_000.0))
        send = lim._send

        if self.kind == "sync":

            def flush_between(key: Any, commands: list[Any]) -> Any:
                if commands[0][:2] != ("SCRIPT", "LOAD"):
                    return send(key, commands)
                loaded = send(key, commands[:1])
                admin.script_flush()
                rest = send(key, commands[1:])
                return rest if isinstance(rest, Exception) else [*loaded, *rest]
        else:

            async def flush_between(key: Any, commands: list[Any]) -> Any:
                if commands[0][:2] != ("SCRIPT", "LOAD"):
                    return await send(key, commands)
                loaded = await send(key, commands[:1])
                admin.script_flush()
                rest = await send(key, commands[1:])
                return rest if isinstance(rest, Exception) else [*loaded, *rest]

        lim._send = flush_between
        admin.script_flush()
        await self.one("flushed twice", lim, "s")

        await self.leases()

    async def leases(self) -> None:
        """Concurrency leases: every path of lua/leases.lua, on an injected clock and on
        Redis's; one lease stays held, so its key is there afterwards."""
        clock = ManualClock(6_000_000.0)
        kind = "sync" if self.kind == "sync" else "async"
        cls = algorithms.LEASES.limiter_class(kind)  # type: ignore[arg-type]
        lim = cls(self.client, 2, 5, self.prefix, clock=clock, on_error=self.on_error, timeout=5)
        leases = []
        for _ in range(3):  # the third is rejected
            leases.append(await self.acquire("lease a", lim, "a"))
        await self.end("lease renew", lim, "a", leases[0], "renew", held=True)
        await self.end("lease release", lim, "a", leases[0], "release", held=True)
        await self.many("lease many", lim, ["a", "b"])
        clock.advance(6)  # every lease has expired
        await self.acquire("lease after expiry", lim, "a")
        on_redis = cls(self.client, 1, 60, self.prefix, on_error=self.on_error, timeout=5)
        for _ in range(2):
            await self.acquire("lease redis clock", on_redis, "r", exact=False)

    async def acquire(self, step: str, limiter: Any, who: str, exact: bool = True) -> Any:
        """One acquire, recorded like a check; the lease id it holds (or None)."""
        try:
            outcome: Outcome = await check(limiter, who)
        except RateLimiterUnavailable as exc:
            outcome = exc
        self._record(step, outcome, exact)
        return getattr(outcome, "lease", None)

    async def end(self, step: str, limiter: Any, who: str, lease: Any, how: str, held: bool):
        """A release or renew of `lease`, which is `held`. Under allow/deny a False is
        the failure policy's answer (it logged why): counted as that policy's degraded
        answer. (So the workload ends only held leases: a False there proves nothing.)"""
        if lease is None:  # the acquire failed: nothing to end
            return
        method = getattr(limiter, how)
        try:
            if self.kind == "sync":
                ended = await asyncio.to_thread(method, who, lease)
            else:
                ended = await method(who, lease)
        except RateLimiterUnavailable as exc:
            self._record(step, exc)
            return
        if ended != held:
            allow = self.on_error == "allow"
            self._record(step, Decision(allow, limiter.limit, 0, 0, 0, degraded=True))
            return
        self.outcomes.append((step, ended))


def connect(kind: str, url: str) -> Any:
    return ratelimit.connect_sync(url) if kind == "sync" else ratelimit.connect(url)


async def close(client: Any) -> None:
    result = client.close() if not hasattr(client, "aclose") else client.aclose()
    if isinstance(result, Awaitable):
        await result


async def run_workload(kind: str, url: str, admin: redis.Redis, prefix: str, on_error: str):
    stale = list(admin.scan_iter(match=f"{prefix}:*"))
    if stale:  # every run starts from no state, so its checks write
        admin.delete(*stale)
    client = connect(kind, url)
    try:
        work = Workload(kind, client, admin, prefix, on_error)
        await work.run()
        return work
    finally:
        await close(client)

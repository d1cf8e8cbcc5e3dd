"""What the sync and async Redis limiters share: the script, its arguments, decoding
its reply and the failure policy. No I/O happens here."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import redis.exceptions

from . import acl, algorithms, lanes, nearcache, plan, scripts, validation
from . import clock as clocks
from .backends import is_embedded, require_kind
from .cluster_client import guarded, is_cluster
from .decision import Decision
from .errors import RateLimiterUnavailable
from .policy import OnError, Policy
from .rates import Rate
from .validation import non_negative_int

log = logging.getLogger("ratelimit")

# What "Redis could not answer" looks like: refused or dropped connections, replies
# that are errors (OOM, READONLY, LOADING...), and timeouts; and a cluster client that
# reaches no node at all (redis-py raises RedisClusterException, not a RedisError).
UNAVAILABLE = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,
    OSError,
    TimeoutError,
)

DEGRADED_RETRY_AFTER_MS = 1000

MAX_WAIT_REPLICAS = 100  # more replicas than any deployment has: a configuration slip


class NotReplicated(redis.exceptions.RedisError):
    """An admit that fewer replicas acknowledged (WAIT) than `wait_replicas` asked."""


def admits(reply: Any) -> bool:
    """True when a script's raw reply admits the request (see lua/epilogue.lua)."""
    return reply >= 0 if type(reply) is int else bool(int(reply[0]))


_monotonic = time.monotonic  # the near-cache's clock under clock="redis" (tests replace it)


class LimiterBase(Policy):
    """A policy bound to a Redis client and its algorithm's Lua script."""

    # Whether the client is an asyncio one (the shells say; see `backends.require_kind`).
    _asyncio: ClassVar[bool]
    # Set by the shells: how long a failed attempt may be retried within, the client's
    # lane for lone checks (None: none) and what sends a round trip elsewhere.
    _retry_within: float
    _lane: Any
    _elsewhere: Any

    def __init__(
        self,
        redis: Any,
        window_seconds: int | str | Rate | None = None,
        limit: int | None = None,
        prefix: str = "rl",
        *,
        window_ms: int | None = None,
        clock: clocks.Clock = clocks.DEFAULT,
        on_error: OnError = "raise",
        timeout: float = 1.0,
        readable_keys: bool = False,
        plain_keys: bool = False,
        key_secret: bytes | None = None,
        ttl_slack_ms: int | None = None,
        clock_tolerance_ms: int | None = None,
        near_cache: bool | int = False,
        wait_replicas: int = 0,
    ) -> None:
        # The wrong kind of client is refused here, before it is used anywhere.
        require_kind(redis, self._asyncio, type(self))
        super().__init__(
            window_seconds, limit, prefix, window_ms=window_ms, clock=clock,
            on_error=on_error, timeout=timeout, readable_keys=readable_keys, plain_keys=plain_keys,
            key_secret=key_secret, ttl_slack_ms=ttl_slack_ms,
            clock_tolerance_ms=clock_tolerance_ms,
        )  # fmt: skip
        self.redis = redis
        self._options["wait_replicas"] = wait_replicas
        self.wait_replicas = self._validate_wait(redis, wait_replicas)
        # WAIT's own timeout: a third of the check's. Redis notices a WAIT's timeout
        # at its `hz` rate (up to 100 ms late by default), and a check that meets
        # NOSCRIPT sends two WAITs; both must end before the check's own timeout, so
        # that a replica that does not acknowledge is reported as such (WAIT's count).
        self._wait_ms = max(1, int(self.timeout * 1000 / 3))
        # Opt-in local memory of rejections (see ratelimit.nearcache); None when off.
        size = nearcache.max_entries(near_cache)
        self._options["near_cache"] = near_cache
        self.near_cache = (
            None if size is None else nearcache.NearCache(self.algorithm, self.limit, size)
        )
        # The script carries this limiter's options as constants (see scripts.py); a
        # real Redis gets it behind the shebang.
        constants = self._constants()
        script_client = self._client_for_script(redis)
        self._script = script_client.register_script(self._script_text(redis, constants))
        # A peek runs the same script with `dry` = 1: the same decision, no write, and
        # declared read-only to Redis (see lua/prelude.lua).
        self._peek_script = script_client.register_script(
            self._script_text(redis, {**constants, "dry": 1})
        )
        # The hot path calls EVALSHA on the client itself (see `_call`) and reads the
        # host's clock directly.
        self._client = self._script.registered_client
        self._host_clock = self.clock is clocks.DEFAULT
        self._opener = self.algorithm.opener(self)
        # The radixes of a one-integer reply (lua/epilogue.lua).
        self._limit_base, self._retry_base = int(constants["L1"]), int(constants["R"])
        self._wait = self._wait_command() if self.wait_replicas else None
        # A cluster sends a waiting check to the key's master itself (cluster_client).
        self._on_cluster = is_cluster(self._client)
        # Script calls sent again after a dropped connection (see `resends`).
        self.resends = 0
        self._resends_lock = threading.Lock()

    # `resends`: how many of this limiter's script calls it sent again because the
    # connection dropped before their reply came (`ratelimit.plan`: once at most per
    # call). A connection that drops after Redis ran the script loses its reply, and the
    # call sent again is charged again: Redis may hold one entry more per resend than
    # the admits its callers were told of (stricter, never more admits). Nothing else the
    # limiter sends is charged twice: NOSCRIPT means the script did not run, and a
    # redirected call (MOVED, ASK) did not run where it was refused. Not counted: what
    # the client sends again by itself, where it does (a client made with redis-py's
    # `retry=` on, unlike those of `connect()`; a sync cluster's pipeline, which
    # `check_many` goes through, sends a command that met an error once more).

    def _count_resends(self, calls: list[int]) -> None:
        """`plan.Resent` for this limiter's own checks and batches."""
        with self._resends_lock:  # sync limiters are shared by threads
            self.resends += len(calls)

    def _constants(self) -> dict[str, scripts.Constant]:
        """What the script reads as constants (see lua/prelude.lua)."""
        return self.algorithm.constants(self)

    def _script_text(self, redis: Any, constants: dict[str, scripts.Constant]) -> str:
        """The script this limiter loads, with `constants` (a peek's: `dry` = 1)."""
        return scripts.for_client(self.algorithm.script, redis, constants)

    @property
    def script(self) -> str:
        """The Lua script this limiter runs, as its client loads it: its options as
        constants in front, behind the `#!lua` line on a real Redis."""
        script: str = self._script.script
        return script

    @property
    def script_sha(self) -> str:
        """The script's SHA1, the name EVALSHA calls it by (to preload or look it up)."""
        sha: str = self._script.sha
        return sha

    def _rebuild(self, options: dict[str, Any]) -> Any:
        return type(self)(self.redis, **options)

    @staticmethod
    def _validate_wait(redis: Any, wait_replicas: Any) -> int:
        value = non_negative_int("wait_replicas", wait_replicas, MAX_WAIT_REPLICAS)
        if value and is_embedded(redis):
            raise ValueError(
                "wait_replicas needs a real Redis with replicas: the embedded fakeredis has "
                "none (its WAIT always answers 0), so every admit would fail"
            )
        return value

    def _wait_command(self) -> tuple[Any, ...]:
        """The WAIT that follows a check's script on the same connection."""
        return ("WAIT", self.wait_replicas, self._wait_ms)

    def _replication_error(self, reply: Any, acked: Any) -> Exception | None:
        """Why a script's reply, followed by WAIT's `acked`, is not a decision: the
        script's own error, or an admit acknowledged by fewer replicas than asked (a
        rejection wrote nothing that matters, so it stands); None when it is one."""
        if isinstance(reply, Exception):
            return reply
        if not admits(reply):
            return None
        if isinstance(acked, Exception):
            return NotReplicated(f"WAIT failed after an admit: {acked}")
        if acked < self.wait_replicas:
            return NotReplicated(
                f"WAIT: {acked} of {self.wait_replicas} replicas acknowledged "
                f"within {self._wait_ms} ms"
            )
        return None

    def _check_plan(self, keys: list[str], args: list[Any]) -> plan.Plan:
        """The round trips of one check (see `ratelimit.plan`)."""
        return plan.check(
            self._script, keys, args, self._wait, self._retry_within, self._count_resends
        )

    def _peek_plan(self, keys: list[str], args: list[Any]) -> plan.Plan:
        """The round trips of one peek: a check of the read-only script, with no WAIT
        (it writes nothing) and no resend count (sent twice, it charges nothing)."""
        return plan.check(self._peek_script, keys, args, None, self._retry_within)

    def _reset_plan(self, keys: list[str]) -> plan.Plan:
        """The round trip of one reset: UNLINK the identity's keys (one for every
        algorithm, one per tier for tiers; UNLINK frees a large log off Redis's main
        thread)."""
        return plan.command(("UNLINK", *keys), self._retry_within)

    def _peek_reply(self, result: tuple[Any, Any]) -> Any:
        """A peek's raw reply; raises its error reply."""
        reply = result[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _peek_unavailable(self, exc: BaseException, what: str | None = None) -> Decision:
        """The failure policy for a peek, exactly as for a check."""
        return self._unavailable(
            exc, what or acl.describe(exc, self._peek_script.script, self.prefix)
        )

    def _peeked(self, reply: Any, keys: list[str], args: list[Any], sent: float) -> Decision:
        """The `Decision` in a peek's reply. A rejection is remembered by the near-cache
        as a check's would be: the state it was decided on is the one a check finds (a
        rejected check writes nothing either). An admission forgets nothing: unlike a
        check's, it added no entry, so a cached rejection's retry is not stale."""
        decision = self._decision(reply, args[0])
        cache = self.near_cache
        if cache is not None and not decision.allowed:
            cache.remember(keys[0], args[1], decision, sent, self._local_ms(args[0]))
        return decision

    def _reset_keys(self, identity: str | bytes) -> list[str]:
        key = self.key_for(identity)
        if self.near_cache is not None:
            # Before Redis is asked: a cached rejection must not outlive the state it
            # was decided on, even if the reset fails.
            self.near_cache.forget(key)
        return [key]

    def _reset_done(self, reply: Any) -> bool:
        """Whether a reset's UNLINK removed any key; raises its error reply."""
        if isinstance(reply, Exception):
            raise reply
        return bool(reply)

    def _reset_failed(self, exc: BaseException, what: str | None = None) -> RateLimiterUnavailable:
        """A reset Redis could not carry out: always an error, whatever `on_error` says,
        since a reset that silently did nothing would leave the identity limited."""
        what = what or acl.describe(exc, "", self.prefix)
        log.warning("rate limiter reset failed: %s", what)
        return RateLimiterUnavailable(f"rate limiter could not reset in Redis: {what}")

    def _route(self) -> Any:
        """What sends a round trip now, as `send(key, commands)`: the client's lane while
        the client sends as redis-py does (see `ratelimit.lanes`), else `_elsewhere`,
        which the shells set: the cluster's routing, or the client itself (a lone
        command through its `execute_command`, so that a wrapper sees every check)."""
        lane = self._lane
        if lane is not None and lanes.untouched(self._client):
            return lane.send
        return self._elsewhere

    @staticmethod
    def _pipelines(commands: plan.Commands) -> bool:
        """Whether a round trip through the client itself goes as its pipeline: a batch,
        or a WAIT (which must follow on the same connection). A lone check's call, and
        its reload, go one command at a time through `execute_command`, so that a
        wrapper of that method sees every check."""
        if len(commands) == 1 or (len(commands) == 2 and commands[0][0] == "SCRIPT"):
            return bool(commands[-1][0] == "WAIT")
        return True

    def _pipeline_of(self, commands: plan.Commands) -> Any:
        """The client's own pipeline with `commands` queued (nothing sent yet): how a
        round trip of several commands goes where no lane serves."""
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe

    def _calls(self, batch: list[tuple[list[str], list[Any]]]) -> list[plan.Call]:
        script = self._script
        return [(script, keys, args) for keys, args in batch]

    def _judge(self, result: tuple[Any, Any]) -> Any:
        """A script's raw reply from (reply, WAIT's count); raises its error reply, or
        NotReplicated for an admit too few replicas acknowledged."""
        reply, acked = result
        if type(reply) is int and not self.wait_replicas:
            return reply  # the usual case: a decision
        error = self._replication_error(reply, acked) if self.wait_replicas else None
        if error is None and isinstance(reply, Exception):
            error = reply
        if error is not None:
            raise error
        return reply

    def _judged(self, results: list[tuple[Any, Any]]) -> list[Any]:
        """A batch's raw replies, NotReplicated in place of an admit too few replicas
        acknowledged; any other error is raised, for the failure policy to answer the
        whole batch."""
        replies = []
        for result in results:
            try:
                replies.append(self._judge(result))
            except NotReplicated as exc:
                replies.append(exc)
        return replies

    def _lookup(self, keys: list[str], args: list[Any]) -> tuple[Decision | None, float]:
        """A rejection the near-cache still holds for this check (None: ask Redis), and
        the check's time on the cache's clock, to pass on to `_decided`."""
        if self.near_cache is None:
            return None, 0.0
        sent = self._local_ms(args[0])
        return self.near_cache.lookup(keys[0], args[1], sent), sent

    def _decided(self, reply: Any, keys: list[str], args: list[Any], sent: float) -> Decision:
        """The `Decision` in `reply`, which the near-cache learns."""
        decision = self._decision(reply, args[0])
        cache = self.near_cache
        if cache is not None:
            if decision.allowed:  # new entries: a cached rejection's retry is stale
                cache.forget(keys[0])
            else:
                cache.remember(keys[0], args[1], decision, sent, self._local_ms(args[0]))
        return decision

    def _decisions(
        self, replies: list[Any], batch: list[tuple[list[str], list[Any]]]
    ) -> list[Decision]:
        """A batch's decisions, where a reply may be NotReplicated."""
        return [
            self._unavailable(reply)
            if isinstance(reply, Exception)
            else self._decision(reply, args[0])
            for reply, (_, args) in zip(replies, batch, strict=True)
        ]

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, on_error={self.on_error!r})"

    def _client_for_script(self, redis: Any) -> Any:
        return guarded(redis)  # an asyncio RedisCluster gets a guard; see cluster_client

    def _local_ms(self, now_arg: Any) -> float:
        """The near-cache's time for a check: the script's own `now` when the limiter
        sends it, else (clock="redis") the host's monotonic clock in ms."""
        return now_arg if now_arg != b"" else _monotonic() * 1000

    def _prepare(self, identity: str | bytes, cost: Any) -> tuple[list[str], list[Any]]:
        """Validate a request and build the script's KEYS and ARGV."""
        key = self.key_for(identity)
        if type(cost) is not int or not 0 < cost <= self._max_cost:
            cost = self.validate_cost(cost)  # raises the ValueError that names the problem
        if self._host_clock:
            now_arg: Any = int(self.clock() * 1000)  # type: ignore[operator]  # == to_ms
        else:
            now = clocks.now_ms(self.clock)
            now_arg = b"" if now is None else now
        return [key], self.script_args(now_arg, cost)

    def script_args(self, now_arg: Any, cost: int) -> list[Any]:
        """ARGV of a check of `cost` sent at `now_arg` (ms, or b"" for Redis's clock):
        see lua/prelude.lua."""
        opener = self._opener
        if opener is None:
            return [now_arg, cost]
        return [now_arg, cost, b"" if now_arg == b"" else opener(now_arg, cost)]

    def _prepare_many(
        self, identities: Iterable[str | bytes], costs: int | Iterable[int]
    ) -> list[tuple[list[str], list[Any]]]:
        """Validate a whole batch (nothing reaches Redis if any request is bad)."""
        identities = list(identities)
        if isinstance(costs, int) and not isinstance(costs, bool):
            costs = [costs] * len(identities)
        else:
            costs = list(costs)  # type: ignore[arg-type]
            if len(costs) != len(identities):
                raise ValueError(
                    f"costs must be one int or one per identity: {len(costs)} costs "
                    f"for {len(identities)} identities"
                )
        return [self._prepare(who, cost) for who, cost in zip(identities, costs, strict=True)]

    def _decision(self, reply: Any, now: Any = None) -> Decision:
        """The `Decision` in a script's reply; `now` is the time the check sent (its
        ARGV[1]), the decision time of a reply that is one integer."""
        if type(reply) is int:
            # One integer: see lua/epilogue.lua.
            if reply >= 0:
                reset, remaining = divmod(reply, self._limit_base)
                return Decision(True, self.limit, remaining, 0, reset, decided_at_ms=now)
            rest, remaining = divmod(-1 - reply, self._limit_base)
            reset, retry = divmod(rest, self._retry_base)
            return Decision(False, self.limit, remaining, retry, reset, decided_at_ms=now)
        allowed, remaining, retry_after_ms, reset_after_ms = (int(v) for v in reply[:4])
        return Decision(
            allowed=bool(allowed),
            limit=self.limit,
            remaining=remaining,
            retry_after_ms=retry_after_ms,
            reset_after_ms=reset_after_ms,
            decided_at_ms=int(reply[4]) if len(reply) > 4 else None,
        )

    def _unavailable(self, exc: BaseException, what: str | None = None) -> Decision:
        """Apply the failure policy when Redis could not answer."""
        what = what or acl.describe(exc, self._script.script, self.prefix)  # names ACL refusals
        if self.on_error == "raise":
            raise RateLimiterUnavailable(f"rate limiter could not reach Redis: {what}") from exc
        log.warning("rate limiter degraded (on_error=%s): %s", self.on_error, what)
        if self.on_error == "allow":
            return Decision(True, self.limit, 0, 0, 0, degraded=True)
        return Decision(
            False, self.limit, 0, DEGRADED_RETRY_AFTER_MS, DEGRADED_RETRY_AFTER_MS, degraded=True
        )


# What a lease script call does with its lease (ARGV[2], see lua/leases.lua).
LEASE_ACQUIRE, LEASE_RENEW, LEASE_RELEASE = 1, 2, 0
DEFAULT_LEASE_SECONDS = 30


def new_lease_id() -> str:
    """A lease id: 96 random bits, so two holders never share one."""
    return secrets.token_urlsafe(12)


class LeaseCore(LimiterBase):
    """What the asyncio and sync `ConcurrencyLimiter`s share: options, the script's
    arguments, and the lease on a decision. A lease is a check of the lease script
    (`ratelimit/lua/leases.lua`), so NOSCRIPT, the retry of a dropped connection, the
    timeout, the auto-pipeline, the cluster and the failure policy are the limiters'."""

    algorithm = algorithms.LEASES

    def __init__(
        self,
        redis: Any,
        limit: int = 4,
        lease_seconds: float | None = None,
        prefix: str = "rl",
        *,
        lease_ms: int | None = None,
        clock: clocks.Clock = "redis",
        **kwargs: Any,
    ) -> None:
        if lease_ms is None:
            lease_ms = lease_seconds_to_ms(
                DEFAULT_LEASE_SECONDS if lease_seconds is None else lease_seconds
            )
        elif lease_seconds is not None:
            raise ValueError("give lease_seconds or lease_ms, not both")
        if kwargs.get("near_cache"):
            raise ValueError("near_cache does not apply to leases: a release frees a slot")
        if kwargs.get("plain_keys"):
            # A plain key names no algorithm: a route's rate limit on the same prefix
            # would write its log into the leases' set.
            raise ValueError("plain_keys does not apply to leases: their key must name them")
        super().__init__(redis, None, limit, prefix, window_ms=lease_ms, clock=clock, **kwargs)
        self._max_cost = 1

    @property
    def lease_ms(self) -> int:
        """How long a lease lasts unless released or renewed."""
        return int(self.window_ms)

    def _rebuild(self, options: dict[str, Any]) -> Any:
        options = dict(options)
        options["lease_ms"] = options.pop("window_ms")
        options["lease_seconds"] = None
        return type(self)(self.redis, **options)

    def validate_cost(self, cost: Any) -> int:
        if cost != 1 or type(cost) is not int:
            raise ValueError(f"cost must be 1 for a lease (one request in flight), got {cost!r}")
        return 1

    def script_args(self, now_arg: Any, cost: int) -> list[Any]:
        # A fresh lease id per acquire; the same id if the plan sends the call again.
        return [now_arg, LEASE_ACQUIRE, new_lease_id()]

    def _lease_call(
        self, identity: str | bytes, lease: Any, op: int
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV that release or renew `lease`."""
        if not isinstance(lease, str) or not lease:
            raise ValueError(f"lease must be the lease id an acquire gave, got {lease!r}")
        keys, args = self._prepare(identity, 1)
        args[1], args[2] = op, lease
        if op == LEASE_RELEASE:
            args[0] = 0  # a release needs no time: no TIME call under clock="redis"
        return keys, args

    def _decided(self, reply: Any, keys: list[str], args: list[Any], sent: float) -> Decision:
        return with_lease(self._decision(reply, args[0]), args[2])

    def _decisions(
        self, replies: list[Any], batch: list[tuple[list[str], list[Any]]]
    ) -> list[Decision]:
        decisions = super()._decisions(replies, batch)
        return [with_lease(d, args[2]) for d, (_, args) in zip(decisions, batch, strict=True)]

    def _ended(self, reply: Any) -> bool:
        """Whether a release or renew found its lease held."""
        return self._decision(reply).allowed

    def _unreleased(self, exc: BaseException, what: str | None = None) -> bool:
        """A release or renew Redis could not answer: raise under on_error="raise",
        else log it and say False (the lease expires by itself after `lease_ms`)."""
        self._unavailable(exc, what)  # raises RateLimiterUnavailable under "raise"
        return False

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(limit={self.limit}, lease_ms={self.window_ms}, "
            f"prefix={self.prefix!r}, on_error={self.on_error!r})"
        )


def lease_seconds_to_ms(lease_seconds: Any) -> int:
    """`lease_seconds` (a number > 0, to the millisecond) in ms; ValueError otherwise."""
    if (
        isinstance(lease_seconds, bool)
        or not isinstance(lease_seconds, int | float)
        or not 0.001 <= lease_seconds <= validation.MAX_WINDOW_MS // 1000
    ):
        raise ValueError(
            f"lease_seconds must be a number of seconds from 0.001 to "
            f"{validation.MAX_WINDOW_MS // 1000}, got {lease_seconds!r}"
        )
    return round(lease_seconds * 1000)


def with_lease(decision: Decision, lease: str) -> Decision:
    """An admitted, Redis-made decision with the lease it holds."""
    if decision.allowed and not decision.degraded:
        return dataclasses.replace(decision, lease=lease)
    return decision

"""A bounded load generator: many concurrent checks on one identity, every answer recorded.

    from tests.core.loadgen import LoadConfig, run_load
    result = run_load(LoadConfig("redis://127.0.0.1:6379/0", limit=50, window_ms=1000,
                                 processes=3, tasks=20, duration=2.0, clock="redis"))
    result.max_admitted()          # most admits in any rolling window, on the limiter's clock
    result.checks_per_second

`run_load` starts `processes` fresh Python processes (multiprocessing "spawn"), each
running `tasks` asyncio tasks that check the same identity back to back for `duration`
seconds through one limiter per process, as separate API replicas would. Each process
can run its application clock `offsets_ms[i]` ms off the true time, to play a replica
with a skewed clock; with `clock="redis"` the limiter reads Redis's TIME instead and
the offsets change nothing (which is the point of that option).

`hammer` is the same loop inside the current process and event loop (asyncio or sync
limiters), for tests that break the server while the load runs.

Every check becomes one row of `LoadResult.checks` (see `CHECK_COLUMNS`): when it was
sent and answered on the true local clock, how long it took, the decision and the time
the script decided at (`Decision.decided_at_ms`), or the error. The `time` column is
that decision time in seconds, so the decided rows feed `ratelimit.lab.metrics` directly
(`metrics.overshoot(result.decided, limit, window)`).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ratelimit import algorithms, keys, limiters, validation
from ratelimit.errors import RateLimiterUnavailable

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# numpy and pandas are imported where they are used: a spawned worker process only
# records plain lists, and starts a second sooner without them.

__all__ = [
    "CHECK_COLUMNS",
    "LoadConfig",
    "LoadResult",
    "hammer",
    "run_load",
]


CHECK_COLUMNS = (
    "process",  # which worker process (also `replica`, for ratelimit.lab.metrics)
    "task",  # which task in it
    "identity",
    "cost",
    "sent",  # true local wall-clock seconds just before the check
    "received",  # ... and just after it returned
    "latency",  # seconds, by time.perf_counter
    "allowed",  # the decision (False for errors)
    "degraded",  # decided by the failure policy, not by Redis
    "error",  # exception class name, "" when the check returned a Decision
    "decided_ms",  # Decision.decided_at_ms: the limiter's clock when the script ran
    "remaining",
    "time",  # decided_ms in seconds (mid-millisecond), NaN when not decided by Redis
)

MAX_DURATION = 3600.0
_READY_TIMEOUT = 60.0  # for a spawned worker to import and connect, on a busy machine


# ---------------------------------------------------------------- one process


class _Recorder:
    """Columns of check records, appended to by the tasks of one process."""

    def __init__(self, process: int, identity: str, cost: int) -> None:
        self.process = process
        self.identity = identity
        self.cost = cost
        derived = ("identity", "cost", "time")  # filled in by `frame`
        self.rows: dict[str, list[Any]] = {c: [] for c in CHECK_COLUMNS if c not in derived}

    def add(self, task: int, sent: float, latency: float, outcome: Any, error: str) -> None:
        rows = self.rows
        rows["process"].append(self.process)
        rows["task"].append(task)
        rows["sent"].append(sent)
        rows["received"].append(time.time())
        rows["latency"].append(latency)
        rows["error"].append(error)
        rows["allowed"].append(bool(getattr(outcome, "allowed", False)))
        rows["degraded"].append(bool(getattr(outcome, "degraded", False)))
        rows["decided_ms"].append(getattr(outcome, "decided_at_ms", None))
        rows["remaining"].append(getattr(outcome, "remaining", None))

    def frame(self) -> pd.DataFrame:
        return _frame(self.rows, self.identity, self.cost)


def _frame(rows: dict[str, list[Any]], identity: str, cost: int) -> pd.DataFrame:
    """The records as a typed table, with `time` from `decided_ms`, sorted by send time."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.insert(2, "identity", identity)
    frame.insert(3, "cost", np.full(len(frame), cost, dtype=np.int64))
    for column in ("decided_ms", "remaining"):  # None (no decision from Redis) -> <NA>
        frame[column] = pd.array(rows[column], dtype="Int64")
    # Mid-millisecond: metrics.seconds_to_ms floors time * 1000 and must get decided_ms
    # back exactly, which decided_ms / 1000 does not always give in floats.
    frame["time"] = (frame["decided_ms"].astype("Float64") + 0.5).to_numpy(
        dtype=np.float64, na_value=np.nan
    ) / 1000.0
    for column in ("allowed", "degraded"):
        frame[column] = frame[column].astype(bool)
    frame["replica"] = frame["process"]
    return frame.sort_values("sent", kind="stable").reset_index(drop=True)


async def hammer(
    limiter: Any,
    identity: str,
    *,
    tasks: int,
    duration: float,
    cost: int = 1,
    think_time: float = 0.0,
    process: int = 0,
    stop: asyncio.Event | None = None,
) -> pd.DataFrame:
    """Check `identity` from `tasks` concurrent tasks for `duration` seconds; one row per
    check (columns `CHECK_COLUMNS` plus `replica`), sorted by send time.

    `limiter` is an asyncio limiter (`ratelimit`) or a sync one (`ratelimit.sync`,
    whose checks then run on `tasks` threads of their own). `think_time` is how long a
    task waits between two checks; `stop`, when set, ends the load before `duration`
    (for a caller that decides when its scenario is over). A check that raises is
    recorded with the exception's class name in `error` and the load goes on, so a
    report counts failures rather than ending at the first one. Checks in flight at
    the end are awaited and recorded.
    """
    recorder = await _hammer(limiter, identity, tasks, duration, cost, think_time, process, stop)
    return recorder.frame()


async def _hammer(
    limiter: Any,
    identity: str,
    tasks: int,
    duration: float,
    cost: int,
    think_time: float,
    process: int,
    stop: asyncio.Event | None = None,
) -> _Recorder:
    tasks = validation.positive_int("tasks", tasks, 10_000)
    duration = _duration(duration)
    think_time = validation.non_negative("think_time", think_time)
    recorder = _Recorder(process, identity, cost)
    is_async = isinstance(limiter, limiters.AsyncLimiter) or inspect.iscoroutinefunction(
        limiter.check
    )
    executor = None if is_async else ThreadPoolExecutor(tasks, thread_name_prefix="hammer")
    loop = asyncio.get_running_loop()
    end = time.perf_counter() + duration

    async def one_check() -> Any:
        if executor is None:
            return await limiter.check(identity, cost)
        return await loop.run_in_executor(executor, limiter.check, identity, cost)

    async def worker(task: int) -> None:
        while time.perf_counter() < end and not (stop is not None and stop.is_set()):
            sent, start = time.time(), time.perf_counter()
            outcome: Any = None
            error = ""
            try:
                outcome = await one_check()
            except RateLimiterUnavailable:
                error = "RateLimiterUnavailable"
            except Exception as exc:  # a bug to report, not a reason to stop the load
                error = type(exc).__name__
            recorder.add(task, sent, time.perf_counter() - start, outcome, error)
            # Yield even when every check fails at once (a refused connection), so
            # that the other tasks and the caller's fault injection get to run.
            await asyncio.sleep(think_time)

    try:
        await asyncio.gather(*(worker(n) for n in range(tasks)))
    finally:
        if executor is not None:
            executor.shutdown(wait=True)
    return recorder


# ---------------------------------------------------------------- many processes


@dataclass(frozen=True)
class LoadConfig:
    """What `run_load` does: who hammers which limiter, how hard and for how long.

    - `url`: any Redis URL that `ratelimit.connect` accepts.
    - `algorithm`: a tag of `ratelimit.algorithms` ("log", "fw", "swc", "gcra");
      `window_ms`, `limit`, `cost` as for the limiter.
    - `clock`: "app" (each process's own clock plus its offset) or "redis" (TIME).
    - `offsets_ms`: one clock offset per process (empty: all 0), to simulate skew.
    - `timeout`, `on_error`: the limiter's failure options; `ttl_slack_ms` as for it
      (extra key lifetime, so that the key can be inspected after the run).
    - `think_time`: seconds each task waits between two checks (0: back to back).
    """

    url: str
    algorithm: str = "log"
    window_ms: int = 1000
    limit: int = 50
    processes: int = 2
    tasks: int = 10
    duration: float = 2.0
    clock: Literal["app", "redis"] = "app"
    offsets_ms: tuple[int, ...] = ()
    identity: str = "load"
    prefix: str = "load"
    cost: int = 1
    timeout: float = 1.0
    on_error: str = "raise"
    think_time: float = 0.0
    ttl_slack_ms: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url:
            raise ValueError(f"url must be a Redis URL, got {self.url!r}")
        algorithms.get(self.algorithm)  # ValueError naming the known tags
        if self.clock not in ("app", "redis"):
            raise ValueError(f'clock must be "app" or "redis", got {self.clock!r}')
        validation.positive_int("processes", self.processes, 64)
        validation.positive_int("tasks", self.tasks, 10_000)
        _duration(self.duration)
        offsets = tuple(self.offsets_ms)
        if offsets and len(offsets) != self.processes:
            raise ValueError(
                f"offsets_ms needs one offset per process ({self.processes}), got {len(offsets)}"
            )
        for offset in offsets:
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"offsets_ms must be whole ms, got {offset!r}")
        object.__setattr__(self, "offsets_ms", offsets)
        keys.identity_bytes(self.identity)
        # The limiter validates the rest (window, limit, cost, timeout, on_error);
        # build one on a throw-away client so that bad options fail before any
        # process starts.
        import fakeredis

        validation.cost(self.cost, self.limiter(fakeredis.FakeAsyncRedis()).limit)
        validation.non_negative("think_time", self.think_time)

    def offset_ms(self, process: int) -> int:
        return self.offsets_ms[process] if self.offsets_ms else 0

    def limiter(self, client: Any, process: int = 0) -> limiters.AsyncLimiter:
        """The limiter process `process` uses, on `client`."""
        spec = algorithms.get(self.algorithm)
        if self.clock == "redis":
            clock: Any = "redis"
        else:
            shift = self.offset_ms(process) / 1000

            def clock() -> float:
                return time.time() + shift

        return spec.build(
            "async",
            client,
            prefix=self.prefix,
            window_ms=self.window_ms,
            limit=self.limit,
            clock=clock,
            timeout=self.timeout,
            on_error=self.on_error,
            # A shifted real clock still runs in real time: no virtual-clock TTL slack
            # unless asked for (to read the key after the run without an expiry race).
            ttl_slack_ms=self.ttl_slack_ms,
        )

    @property
    def key(self) -> str:
        """The Redis key every process's checks go to."""
        return keys.make_key(self.prefix, self.algorithm, self.identity, window_ms=self.window_ms)


@dataclass(frozen=True, eq=False)  # a DataFrame has no single truth value for ==
class LoadResult:
    """Every check of a load run (`checks`, one row each) and summaries of them."""

    config: LoadConfig
    checks: pd.DataFrame
    elapsed: float  # seconds from the first check sent to the last answer received

    @classmethod
    def from_checks(cls, config: LoadConfig, checks: pd.DataFrame) -> LoadResult:
        """A result for checks recorded elsewhere (e.g. by `hammer` in this process)."""
        elapsed = float(checks["received"].max() - checks["sent"].min()) if len(checks) else 0.0
        return cls(config, checks, elapsed)

    @property
    def decided(self) -> pd.DataFrame:
        """The checks the script answered (not degraded, no error): input for metrics."""
        c = self.checks
        return c[c["decided_ms"].notna() & ~c["degraded"] & (c["error"] == "")]

    @property
    def admitted(self) -> pd.DataFrame:
        decided = self.decided
        return decided[decided["allowed"]]

    @property
    def n_checks(self) -> int:
        return len(self.checks)

    @property
    def n_admitted(self) -> int:
        return len(self.admitted)

    @property
    def n_errors(self) -> int:
        return int((self.checks["error"] != "").sum())

    @property
    def n_degraded(self) -> int:
        return int(self.checks["degraded"].sum())

    @property
    def checks_per_second(self) -> float:
        return self.n_checks / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def max_latency(self) -> float:
        return float(self.checks["latency"].max()) if len(self.checks) else 0.0

    def max_admitted(self) -> int:
        """Largest admitted cost in any rolling window (t - W, t] of the limiter's width,
        on the limiter's own clock (the script's `now`): what the algorithm promises
        about. With clock="redis" that is also true time on this host."""
        import numpy as np

        from ratelimit.lab import metrics

        admitted = self.admitted
        ms = admitted["decided_ms"].to_numpy(dtype=np.int64)
        weights = admitted["cost"].to_numpy(dtype=np.int64)
        return metrics.max_in_window_ms(ms, self.config.window_ms, weights)

    def true_peak(self) -> tuple[int, int]:
        """(at least, at most): the largest admitted cost that ran in one true window.

        Redis ran each check somewhere between `sent` and `received` on this host's
        clock, in whole ms (TIME and time.time() read the same clock; a stamp is its
        floor). Checks whose whole interval lies in a window (T - W, T] certainly ran
        in it; those whose interval meets it possibly did. The first number is a
        lower bound on the true peak whatever the limiter's clock (a replica's skewed
        one included), the second an upper bound.
        """
        import numpy as np

        admitted = self.admitted
        if admitted.empty:
            return 0, 0
        window = self.config.window_ms
        sent = np.floor(admitted["sent"].to_numpy() * 1000).astype(np.int64)
        received = np.floor(admitted["received"].to_numpy() * 1000).astype(np.int64)
        cost = admitted["cost"].to_numpy(dtype=np.int64)

        def up_to(times: np.ndarray, weights: np.ndarray, at: np.ndarray) -> np.ndarray:
            """Total weight of the times <= each of `at`."""
            order = np.argsort(times, kind="stable")
            total = np.concatenate(([0], np.cumsum(weights[order])))
            return total[np.searchsorted(times[order], at, side="right")]

        # Certainly in (T - W, T], T at an answer: answered by T, sent after T - W.
        # Only intervals shorter than W fit; for them, sent <= T - W implies
        # received <= T, so a difference of two counts is the count of both.
        short = received - sent < window
        s, r, c = sent[short], received[short], cost[short]
        at_least = up_to(r, c, r) - up_to(s, c, r - window) if len(r) else np.zeros(1)
        # Possibly in (T - W, T], T at a send: sent by T, answered after T - W.
        at_most = up_to(sent, cost, sent) - up_to(received, cost, sent - window)
        return int(at_least.max()), int(at_most.max())

    def expected_log(self) -> np.ndarray:
        """Scores a sliding log must hold right after the run, sorted: each admitted
        unit decided after (last decision - window), the last trim. Exact when the
        decision times follow the order Redis ran the checks in (clock="redis")."""
        import numpy as np

        decided = self.decided
        if decided.empty:
            return np.empty(0, dtype=np.int64)
        ms = decided["decided_ms"].to_numpy(dtype=np.int64)
        keep = decided["allowed"].to_numpy() & (ms > ms.max() - self.config.window_ms)
        return np.sort(np.repeat(ms[keep], decided["cost"].to_numpy(dtype=np.int64)[keep]))

    def summary(self) -> dict[str, Any]:
        """The figures a report needs, as plain numbers."""
        return {
            "algorithm": self.config.algorithm,
            "clock": self.config.clock,
            "offsets_ms": list(self.config.offsets_ms),
            "processes": self.config.processes,
            "tasks": self.config.tasks,
            "seconds": round(self.elapsed, 2),
            "checks": self.n_checks,
            "checks_per_second": round(self.checks_per_second),
            "admitted": self.n_admitted,
            "errors": self.n_errors,
            "degraded": self.n_degraded,
            "max_latency_ms": round(self.max_latency * 1000, 1),
            "limit": self.config.limit,
            "window_ms": self.config.window_ms,
            "max_admitted": self.max_admitted(),
            "true_peak": self.true_peak(),
        }


def _duration(duration: Any) -> float:
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise ValueError(f"duration must be a number of seconds, got {duration!r}")
    if not 0 < duration <= MAX_DURATION or not math.isfinite(duration):
        raise ValueError(f"duration must be > 0 and <= {MAX_DURATION} s, got {duration!r}")
    return float(duration)


def _worker(config: LoadConfig, process: int, start: Any, results: Any) -> None:
    """One spawned process: connect, report ready, wait for the start signal, hammer."""
    try:
        rows = asyncio.run(_work(config, process, start, results))
        results.put(("done", process, rows))
    except BaseException:  # the parent must hear about it, whatever it was
        results.put(("failed", process, traceback.format_exc()))


async def _work(config: LoadConfig, process: int, start: Any, results: Any) -> dict[str, list[Any]]:
    from ratelimit.backends import connect

    client = connect(config.url, timeout=max(config.timeout, 1.0))
    try:
        limiter = config.limiter(client, process)
        await client.ping()  # connected and answering before the clock starts
        results.put(("ready", process, None))
        if not await asyncio.to_thread(start.wait, _READY_TIMEOUT):
            raise RuntimeError("no start signal")
        recorder = await _hammer(
            limiter,
            config.identity,
            config.tasks,
            config.duration,
            config.cost,
            config.think_time,
            process,
        )
        return recorder.rows
    finally:
        await client.aclose()


def run_load(config: LoadConfig) -> LoadResult:
    """Run the load described by `config` and return every check it made.

    The processes connect first and all start together; the call returns once each
    has finished (about `duration` plus start-up). A process that fails raises
    RuntimeError with its traceback; every process started here is stopped by then.
    """
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(config, n, start, results), daemon=True)
        for n in range(config.processes)
    ]
    rows: dict[int, dict[str, list[Any]]] = {}
    try:
        for worker in workers:
            worker.start()
        _wait_for(results, workers, "ready", _READY_TIMEOUT, rows)
        start.set()
        limit = config.duration + 2 * config.timeout + _READY_TIMEOUT
        _wait_for(results, workers, "done", limit, rows)
        for worker in workers:
            worker.join(timeout=10)
    finally:
        for worker in workers:  # only ours, by their own handles
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5)
        results.close()
    merged = {column: [v for n in sorted(rows) for v in rows[n][column]] for column in rows[0]}
    return LoadResult.from_checks(config, _frame(merged, config.identity, config.cost))


def _wait_for(
    results: Any, workers: Sequence[Any], kind: str, within: float, rows: dict[int, Any]
) -> None:
    """Collect one `kind` message per worker; RuntimeError on a failure or a silent death."""
    pending = set(range(len(workers)))
    deadline = time.monotonic() + within
    dead_seen = False
    while pending:
        try:
            what, process, payload = results.get(timeout=0.2)
        except queue.Empty:
            what = None
        if what is None:
            dead = [n for n in pending if workers[n].exitcode is not None]
            # A process flushes its last message before it exits, but that message
            # can still be in the pipe: give it one more turn before giving up.
            if dead and dead_seen:
                raise RuntimeError(f"load process {dead[0]} exited without a result")
            dead_seen = bool(dead)
            if time.monotonic() > deadline:
                raise RuntimeError(f"load processes {sorted(pending)} did not report {kind!r}")
            continue
        if what == "failed":
            raise RuntimeError(f"load process {process} failed:\n{payload}")
        if what == kind:
            pending.discard(process)
            if kind == "done":
                rows[process] = payload


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.core.loadgen",
        description="Hammer one identity from several processes and report what got in.",
    )
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--algorithm", choices=algorithms.NAMES, default="log")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--window-ms", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--clock", choices=["app", "redis"], default="app")
    parser.add_argument("--offsets-ms", default="", help="one per process, e.g. 0,150,-150")
    parser.add_argument("--prefix", default=f"load:{os.getpid()}")
    args = parser.parse_args(argv)
    try:
        offsets = tuple(int(v) for v in args.offsets_ms.split(",") if v.strip())
        config = LoadConfig(
            args.url,
            algorithm=args.algorithm,
            window_ms=args.window_ms,
            limit=args.limit,
            processes=args.processes,
            tasks=args.tasks,
            duration=args.duration,
            clock=args.clock,
            offsets_ms=offsets,
            prefix=args.prefix,
        )
    except ValueError as exc:  # bad options: a usage message, not a traceback
        parser.error(str(exc))
    result = run_load(config)
    for name, value in result.summary().items():
        print(f"{name:>22}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

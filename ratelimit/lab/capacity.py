"""Capacity arithmetic: what a limit policy costs Redis for a fleet of API keys.

    from ratelimit.lab import capacity, memory

    table = memory.load_table(memory.STORED_TABLE)                    # chapter 3's measurements
    server = capacity.server_time_from_bench("bench/record.json")     # what `make bench` measured
    # or: capacity.measure_server_time(redis.Redis(...))              # your Redis, measured now
    steady = capacity.Scenario.uniform("steady", 10**6, 0.05)          # keys, rate, peak factor
    capacity.plan_scenario(
        "log", steady, limit=1_000, window_s=3_600, table=table,
        us_per_check=server.us_per_check["log"], shard_memory_bytes=16 * 2**30,
        headroom=0.5, key_overhead_bytes=64,
    )                                                                 # a CapacityPlan

The model, in plain terms:

- One traffic assumption, a `Scenario` (active keys, their per-key request rates, a
  peak factor), gives both the memory and the operations, so that a plan never pairs
  full keys with traffic too light to fill them.
- Memory: every active key (an identity that sent a request within one window, so its
  key has not expired) holds `bytes_per_key`, read from a measured `memory_table` at
  what the scenario's traffic puts in it, plus `key_overhead_bytes` of server
  bookkeeping that `MEMORY USAGE` leaves out.
- Operations: every request is one check, admitted or not, and every check is one
  EVALSHA, so a fleet of N keys sending R requests per second each makes N * R checks
  per second. Inside the script each check issues a few more commands
  (`script_commands`), which cost Redis CPU but no extra round trip.
- One Redis (a shard) runs commands on one thread, so it can do at most one second of
  work per second: at most 1e6 / `us_per_check` checks per second on script time
  alone, and never more than an end-to-end throughput measured for it, when one is
  given (`shard_checks_per_second`). It holds at most `shard_memory_bytes` of data.
  `us_per_check` is measured, never assumed: `server_time_from_bench` reads what the
  latest `make bench` recorded, `measure_server_time` measures a Redis you may write to
  (both from `INFO commandstats`).
- `headroom` is the share of each shard's memory and throughput kept free (peaks,
  fragmentation, failover, a fork for persistence). A Redis Cluster of k shards
  spreads the keys (hash-tagged per identity, so evenly) over k shards; one
  identity's key always lives on one shard.

Every function validates its input and raises ValueError naming the parameter.
"""

from __future__ import annotations

import json
import math
import uuid
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratelimit import algorithms, validation

if TYPE_CHECKING:  # pandas is only needed by `bytes_per_key` (the "sim" extra)
    import pandas as pd

__all__ = [
    "CapacityPlan",
    "Scenario",
    "ServerTime",
    "bytes_per_key",
    "checks_per_second",
    "fleet_memory_bytes",
    "keys_per_shard",
    "log_members",
    "mean_script_commands",
    "measure_server_time",
    "plan_fleet",
    "plan_scenario",
    "scenario_bytes_per_key",
    "redis_cpu_cores",
    "script_commands",
    "shard_checks_per_second",
    "server_time_from_bench",
    "shards_needed",
]

# --- input checks -------------------------------------------------------------------


def _share(name: str, value: Any) -> float:
    value = validation.number(name, value)
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return value


def headroom_share(value: Any) -> float:
    """`value` as the share of a shard kept free: a number in [0, 1), else ValueError."""
    value = validation.number("headroom", value)
    if not 0 <= value < 1:
        raise ValueError(f"headroom must be >= 0 and < 1 (a share kept free), got {value!r}")
    return value


# --- Redis commands per check ---------------------------------------------------------


def script_commands(
    algorithm: str,
    allowed: bool,
    cost: int = 1,
    *,
    redis_clock: bool = False,
    opens: bool = False,
) -> int:
    """Redis commands the script of `algorithm` issues for one check, besides the
    EVALSHA that runs it: `allowed` picks the path, `cost` (>= 1) the log's ZADDs,
    `redis_clock` adds the TIME of a `clock="redis"` limiter, and `opens` marks an
    admitted check on a key that holds nothing (fewer for some algorithms)."""
    counts = algorithms.get(algorithm).commands
    if not isinstance(allowed, bool):
        raise ValueError(f"allowed must be True or False, got {allowed!r}")
    if not isinstance(opens, bool):
        raise ValueError(f"opens must be True or False, got {opens!r}")
    cost = validation.count("cost", cost)
    extra = 1 if redis_clock else 0
    if not allowed:
        return counts.reject + extra
    first = counts.opening if opens else counts.admit
    return first + counts.per_extra_unit * (cost - 1) + extra


def mean_script_commands(
    algorithm: str,
    admitted_share: float,
    mean_admitted_cost: float = 1.0,
    *,
    redis_clock: bool = False,
) -> float:
    """Expected script commands per check when `admitted_share` (0..1) of the checks
    are admitted, with mean cost `mean_admitted_cost` (>= 1) among those."""
    counts = algorithms.get(algorithm).commands
    share = _share("admitted_share", admitted_share)
    cost = validation.number("mean_admitted_cost", mean_admitted_cost)
    if cost < 1:
        raise ValueError(f"mean_admitted_cost must be >= 1, got {mean_admitted_cost!r}")
    admit = counts.admit + counts.per_extra_unit * (cost - 1)
    return share * admit + (1 - share) * counts.reject + (1 if redis_clock else 0)


# --- memory ---------------------------------------------------------------------------


def log_members(
    limit: int, rate_per_key: float | None = None, window_s: float | None = None
) -> float:
    """Members a sliding-log key holds: `limit` when full (no rate given, the worst
    case), else the steady state of a client sending `rate_per_key` requests per
    second (cost 1) over a window of `window_s` seconds, `min(rate * window, limit)`."""
    limit = validation.count("limit", limit)
    if rate_per_key is None and window_s is None:
        return float(limit)
    if rate_per_key is None or window_s is None:
        raise ValueError("give both rate_per_key and window_s, or neither (a full key)")
    return min(
        validation.positive("rate_per_key", rate_per_key)
        * validation.positive("window_s", window_s),
        limit,
    )


def bytes_per_key(
    table: pd.DataFrame, algorithm: str, entries: float, *, member_format: str = "script"
) -> float:
    """`MEMORY USAGE` of one key holding `entries`, from a measured `memory_table`.

    For the sliding log `entries` is its members (>= 1; see `log_members`), looked up
    among the rows of `member_format` ("script" or "classic"); for the O(1)
    algorithms it is the units their counts stand for, which hardly changes their size.
    Between measured rows the bytes are interpolated linearly (the table measures both
    sides of the listpack threshold, so the step there is kept); beyond the largest
    row a log key grows at that row's bytes per member and an O(1) key stays as it is.
    """
    spec = algorithms.get(algorithm)
    algorithm = spec.name
    entries = validation.number("entries", entries)
    if entries < 1:
        raise ValueError(f"entries must be >= 1 (an empty key does not exist), got {entries!r}")
    columns = ("algorithm", "member_format", "entries", "bytes_per_key")
    missing = [c for c in columns if c not in getattr(table, "columns", ())]
    if missing:
        raise ValueError(f"table must be a memory_table; it lacks {', '.join(missing)}")
    fmt = member_format if spec.state_per_unit else ""
    rows = table[(table["algorithm"] == algorithm) & (table["member_format"] == fmt)]
    if rows.empty:
        label = f"{algorithm} ({fmt})" if fmt else algorithm
        raise ValueError(f"the table has no {label} rows")
    rows = rows.sort_values("entries")
    xs = [float(x) for x in rows["entries"]]
    ys = [float(y) for y in rows["bytes_per_key"]]
    if entries >= xs[-1]:
        return ys[-1] * entries / xs[-1] if spec.state_per_unit else ys[-1]
    if entries <= xs[0]:
        return ys[0]
    i = bisect_right(xs, entries)  # xs[i - 1] <= entries < xs[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (entries - x0) / (x1 - x0)


def fleet_memory_bytes(
    active_keys: int, bytes_per_key: float, *, key_overhead_bytes: float = 0.0
) -> float:
    """Memory for `active_keys` keys of `bytes_per_key` each, plus `key_overhead_bytes`
    of bookkeeping per key: `active_keys * (bytes_per_key + key_overhead_bytes)`."""
    keys = validation.count("active_keys", active_keys)
    per_key = validation.positive("bytes_per_key", bytes_per_key)
    overhead = validation.non_negative("key_overhead_bytes", key_overhead_bytes)
    return keys * (per_key + overhead)


# --- operations -----------------------------------------------------------------------


def checks_per_second(active_keys: int, rate_per_key: float) -> float:
    """Checks (EVALSHA calls) per second: every request is checked, admitted or not."""
    return validation.count("active_keys", active_keys) * validation.non_negative(
        "rate_per_key", rate_per_key
    )


def redis_cpu_cores(checks_per_s: float, us_per_check: float) -> float:
    """Redis CPU the scripts use, in cores busy: `checks_per_s * us_per_check / 1e6`."""
    checks = validation.non_negative("checks_per_s", checks_per_s)
    return checks * validation.positive("us_per_check", us_per_check) / 1e6


def shard_checks_per_second(throughput_ceiling: float, us_per_check: float) -> float:
    """Checks per second one Redis can serve: the measured end-to-end
    `throughput_ceiling`, or fewer when script time alone (`us_per_check`
    microseconds of its single thread per check) fills a second first."""
    ceiling = validation.positive("throughput_ceiling", throughput_ceiling)
    return min(ceiling, 1e6 / validation.positive("us_per_check", us_per_check))


def shards_needed(demand: float, capacity_per_shard: float, headroom: float = 0.0) -> int:
    """Shards (one Redis each) needed so that none runs above `1 - headroom` of
    `capacity_per_shard`: `ceil(demand / (capacity * (1 - headroom)))`, at least 1.
    Demand and capacity in the same unit (bytes, or checks per second)."""
    demand = validation.non_negative("demand", demand)
    usable = validation.positive("capacity_per_shard", capacity_per_shard) * (
        1 - headroom_share(headroom)
    )
    # Rounded first, so that 0.1 * 3 / 0.3 style float noise does not add a shard.
    return max(1, math.ceil(round(demand / usable, 9)))


def keys_per_shard(
    bytes_per_key: float,
    rate_per_key: float,
    *,
    shard_memory_bytes: float,
    shard_checks_per_s: float,
    headroom: float = 0.0,
    key_overhead_bytes: float = 0.0,
) -> int:
    """The most active keys one shard carries within its headroom: the smaller of what
    fits its memory and what its checks per second allow (no rate limit on keys that
    send nothing: then memory alone decides)."""
    free = 1 - headroom_share(headroom)
    per_key = validation.positive("bytes_per_key", bytes_per_key) + validation.non_negative(
        "key_overhead_bytes", key_overhead_bytes
    )
    by_memory = validation.positive("shard_memory_bytes", shard_memory_bytes) * free / per_key
    rate = validation.non_negative("rate_per_key", rate_per_key)
    ops = validation.positive("shard_checks_per_s", shard_checks_per_s) * free
    by_ops = ops / rate if rate > 0 else math.inf
    return math.floor(round(min(by_memory, by_ops), 9))


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """What a fleet costs under one algorithm, and how many shards carry it."""

    algorithm: str
    active_keys: int
    rate_per_key: float  # requests per second per active key
    bytes_per_key: float  # MEMORY USAGE of one key plus the per-key overhead
    memory_bytes: float  # the whole fleet
    checks_per_s: float  # EVALSHA calls per second
    commands_per_s: float  # Redis commands inside the scripts per second
    redis_cpu_cores: float  # script time, cores busy
    shard_checks_per_s: float  # what one shard serves at most
    shards_for_memory: int
    shards_for_checks: int
    shards: int  # the larger of the two: 1 means one Redis is enough
    keys_per_shard: int  # the most active keys one shard carries within the headroom


@dataclass(frozen=True)
class Shard:
    """One Redis of the cluster: its data memory, the share of memory and time kept
    free, the per-key bookkeeping `MEMORY USAGE` leaves out, and optionally an
    end-to-end ceiling in checks per second you measured (None: the server time per
    check alone decides, one thread busy at most 100%)."""

    memory_gib: float = 14
    headroom: float = 0.5
    key_overhead_bytes: float = 64
    checks_per_s: float | None = None

    def plan_options(self) -> dict[str, Any]:
        """This shard as the keyword arguments of `capacity.plan_fleet` / `plan_scenario`,
        so the tables and the figure plan with the same shard."""
        return {
            "shard_memory_bytes": self.memory_gib * 2**30,
            "shard_checks_per_s": self.checks_per_s,
            "headroom": self.headroom,
            "key_overhead_bytes": self.key_overhead_bytes,
        }


DEFAULT_SHARD = Shard()
"""A 14 GiB shard with half of it kept free and 64 B of bookkeeping per key."""


def plan_fleet(
    algorithm: str,
    *,
    active_keys: int,
    rate_per_key: float,
    bytes_per_key: float,
    us_per_check: float,
    shard_memory_bytes: float,
    shard_checks_per_s: float | None = None,
    headroom: float = 0.5,
    key_overhead_bytes: float = 0.0,
    commands_per_check: float | None = None,
) -> CapacityPlan:
    """Memory, checks, commands, Redis CPU and shards for `active_keys` keys of
    `algorithm`, each sending `rate_per_key` requests per second.

    `bytes_per_key`: one key's `MEMORY USAGE` (see `bytes_per_key`); `us_per_check`:
    Redis CPU per script call, microseconds; `shard_memory_bytes` and
    `shard_checks_per_s`: one Redis's data memory and measured end-to-end throughput
    (None: no such ceiling, script time alone decides); `headroom`: the share of both
    kept free; `commands_per_check`: script commands per
    check, by default the admit path (`script_commands(algorithm, True)`), the costlier.
    """
    algorithm = algorithms.get(algorithm).name
    keys = validation.count("active_keys", active_keys)
    rate = validation.non_negative("rate_per_key", rate_per_key)
    headroom = headroom_share(headroom)
    memory = fleet_memory_bytes(keys, bytes_per_key, key_overhead_bytes=key_overhead_bytes)
    checks = checks_per_second(keys, rate)
    if commands_per_check is None:
        commands_per_check = script_commands(algorithm, True)
    commands = validation.non_negative("commands_per_check", commands_per_check)
    if shard_checks_per_s is None:
        per_shard = 1e6 / validation.positive("us_per_check", us_per_check)
    else:
        per_shard = shard_checks_per_second(shard_checks_per_s, us_per_check)
    shard_memory = validation.positive("shard_memory_bytes", shard_memory_bytes)
    for_memory = shards_needed(memory, shard_memory, headroom)
    for_checks = shards_needed(checks, per_shard, headroom)
    return CapacityPlan(
        algorithm=algorithm,
        active_keys=keys,
        rate_per_key=rate,
        bytes_per_key=memory / keys,
        memory_bytes=memory,
        checks_per_s=checks,
        commands_per_s=checks * commands,
        redis_cpu_cores=redis_cpu_cores(checks, us_per_check),
        shard_checks_per_s=per_shard,
        shards_for_memory=for_memory,
        shards_for_checks=for_checks,
        shards=max(for_memory, for_checks),
        keys_per_shard=keys_per_shard(
            bytes_per_key,
            rate,
            shard_memory_bytes=shard_memory_bytes,
            shard_checks_per_s=per_shard,
            headroom=headroom,
            key_overhead_bytes=key_overhead_bytes,
        ),
    )


# --- one traffic assumption for memory and operations alike --------------------------


@dataclass(frozen=True)
class Scenario:
    """One traffic assumption for a fleet, from which a plan derives both its memory
    and its operations: `active_keys` keys, split into classes of `(share of the keys,
    mean requests per second per key)` (the shares sum to 1), all sending
    `peak_factor` times their mean rate at the peak the plan is sized for. A peak is
    assumed to last at least one window, so a log key holds what the peak rate puts in
    one window (at most the limit)."""

    name: str
    active_keys: int
    rates: tuple[tuple[float, float], ...]
    peak_factor: float = 1.0

    def __post_init__(self) -> None:
        validation.count("active_keys", self.active_keys)
        validation.positive("peak_factor", self.peak_factor)
        rates = tuple((float(share), float(rate)) for share, rate in self.rates)
        if not rates:
            raise ValueError("rates must hold at least one (share, rate) class")
        for share, rate in rates:
            _share("share", share)
            validation.non_negative("rate", rate)
        if abs(sum(share for share, _ in rates) - 1) > 1e-9:
            raise ValueError(f"the shares of rates must sum to 1, got {rates!r}")
        object.__setattr__(self, "rates", rates)

    @classmethod
    def uniform(
        cls, name: str, active_keys: int, rate_per_key: float, peak_factor: float = 1.0
    ) -> Scenario:
        """Every key at the same mean rate."""
        return cls(name, active_keys, ((1.0, rate_per_key),), peak_factor)

    @classmethod
    def every_key_full(cls, name: str, active_keys: int, limit: int, window_s: float) -> Scenario:
        """The consistent worst case for memory: every key sends `limit` per `window_s`,
        the least rate that fills its log; that rate is also its checks."""
        rate = validation.count("limit", limit) / validation.positive("window_s", window_s)
        return cls.uniform(name, active_keys, rate)

    @property
    def peak_rate_per_key(self) -> float:
        """Mean requests per second per key at the peak, over all classes."""
        return self.peak_factor * sum(share * rate for share, rate in self.rates)

    def checks_per_second(self) -> float:
        """Checks per second at the peak: every request is one check."""
        return checks_per_second(self.active_keys, self.peak_rate_per_key)

    def log_members(self, limit: int, window_s: float) -> list[tuple[float, float]]:
        """(share, members) per class: what a sliding-log key holds at the peak."""
        return [
            (share, max(1.0, log_members(limit, rate * self.peak_factor, window_s)))
            if rate > 0
            else (share, 1.0)
            for share, rate in self.rates
        ]

    def mean_log_members(self, limit: int, window_s: float) -> float:
        """Members of a sliding-log key, averaged over the keys."""
        return sum(share * members for share, members in self.log_members(limit, window_s))


def scenario_bytes_per_key(
    table: pd.DataFrame,
    algorithm: str,
    scenario: Scenario,
    limit: int,
    window_s: float,
    *,
    member_format: str = "script",
) -> float:
    """`MEMORY USAGE` of one key of `algorithm` at `scenario`'s peak, averaged over the
    keys: a log key at the members each rate class puts in it, an O(1) key at `limit`."""
    spec = algorithms.get(algorithm)
    name = spec.name
    limit = validation.count("limit", limit)
    if not spec.state_per_unit:
        return bytes_per_key(table, name, limit)
    return sum(
        share * bytes_per_key(table, name, members, member_format=member_format)
        for share, members in scenario.log_members(limit, window_s)
    )


def plan_scenario(
    algorithm: str,
    scenario: Scenario,
    *,
    limit: int,
    window_s: float,
    table: pd.DataFrame,
    us_per_check: float,
    shard_memory_bytes: float,
    shard_checks_per_s: float | None = None,
    headroom: float = 0.5,
    key_overhead_bytes: float = 0.0,
    member_format: str = "script",
) -> CapacityPlan:
    """`plan_fleet` for `scenario` under a limit of `limit` per `window_s`: a key's
    bytes are read from the measured `table` at what the scenario's peak puts in it
    (a log key's members per rate class, averaged over the keys; an O(1) key at the
    limit), and the checks are the same peak's requests."""
    name = algorithms.get(algorithm).name
    per_key = scenario_bytes_per_key(
        table, name, scenario, limit, window_s, member_format=member_format
    )
    return plan_fleet(
        name,
        active_keys=scenario.active_keys,
        rate_per_key=scenario.peak_rate_per_key,
        bytes_per_key=per_key,
        us_per_check=us_per_check,
        shard_memory_bytes=shard_memory_bytes,
        shard_checks_per_s=shard_checks_per_s,
        headroom=headroom,
        key_overhead_bytes=key_overhead_bytes,
    )


# --- server time per check: measured, never typed in ---------------------------------

# Script calls: in Redis 7 their time includes the commands they run, which are also
# counted on their own, so only these are summed.
_SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


@dataclass(frozen=True)
class ServerTime:
    """Redis time per check (one script call), microseconds, by algorithm tag, and
    where the figures come from, in words."""

    us_per_check: Mapping[str, float]
    source: str
    date: str = ""  # when it was measured, as the source gives it

    def __post_init__(self) -> None:
        for tag, usec in self.us_per_check.items():
            algorithms.get(tag)
            validation.positive(f"us_per_check[{tag!r}]", usec)


def bench_case(algorithm: str, storages: dict[str, Any] | None = None) -> str:
    """The name of `make bench`'s admit case for `algorithm` in its record; for the log,
    the case its record's `log_storages` names for that storage (the default log is
    measured as the plain class name), else the name this build would give it."""
    spec = algorithms.get(algorithm)
    name = spec.class_name
    if spec.storage is not None:
        found = (storages or {}).get(spec.storage, {})
        if "case" in found:
            return f"{found['case']} 10k keys"
        if spec.storage != algorithms.DEFAULT_LOG_STORAGE:
            name = f"{name} storage={spec.storage}"
    return f"{name} 10k keys"


def server_time_from_bench(
    path: str | Path, names: Iterable[str] = algorithms.NAMES, *, shown_as: str | None = None
) -> ServerTime:
    """Server time per check of each algorithm in `names`, from the record the latest
    `make bench` wrote (`bench/record.json`): its admit case (10,000 keys, every check
    admitted, on a key that holds nothing yet), median over its rounds. The source names
    the file as `shown_as` (default: `path` as given)."""
    record = json.loads(Path(path).read_text())
    cost = record.get("server_cost", {})
    results = cost.get("results", {})
    figures = {}
    for name in names:
        case = bench_case(name, cost.get("log_storages"))
        if case not in results:
            raise ValueError(f"{path} has no server-time case {case!r}: run `make bench`")
        figures[algorithms.get(name).name] = float(results[case]["usec_per_check"])
    where = cost.get("server", "a Redis")
    source = (
        f"`make bench` of {record.get('date', 'an unknown date')} ({shown_as or path}): Redis "
        f"{record.get('redis_version', '?')}, {where}, median of {cost.get('rounds', '?')} "
        f"rounds of {cost.get('checks_per_case_per_round', '?')} admitted checks, "
        "each on a key of its own"
    )
    return ServerTime(figures, source, str(record.get("date", "")))


def _script_usec(client: Any) -> tuple[int, int]:
    stats = client.info("commandstats")
    calls = usec = 0
    for name, figures in stats.items():
        if name.removeprefix("cmdstat_").lower() in _SCRIPT_CALLS:
            calls += int(figures["calls"])
            usec += int(figures["usec"])
    return calls, usec


def measure_server_time(
    client: Any,
    names: Iterable[str] = algorithms.NAMES,
    checks: int = 2_000,
    prefix: str | None = None,
    where: str = "this Redis",
) -> ServerTime:
    """Measure server time per check on `client` (a synchronous redis-py client of a
    Redis this process may write to): for each algorithm, `checks` admitted checks,
    each on a key of its own under a fresh scratch `prefix`, between two readings of
    `INFO commandstats` (the script calls' usec over the checks, as `make bench`
    reads it). Every key under the prefix is deleted afterwards. Another client's
    script calls during the measurement would be counted too: measure on a quiet Redis.
    """
    checks = validation.count("checks", checks)
    prefix = prefix or f"capacity-probe:{uuid.uuid4().hex[:12]}"
    if next(iter(client.scan_iter(match=f"{prefix}:*", count=1000)), None) is not None:
        raise ValueError(f"prefix {prefix!r} already holds keys: choose a scratch prefix")
    try:
        stats = client.info("commandstats")
    except Exception as exc:  # an embedded fake has no INFO
        raise ValueError(f"this server reports no INFO commandstats ({exc})") from exc
    if not stats:
        raise ValueError("this server reports no INFO commandstats")
    figures = {}
    try:
        for name in names:
            spec = algorithms.get(name)
            # Every check admitted: a limit far above what one key sees, a long window.
            limiter = spec.build("sync", client, 60, 1_000, prefix=f"{prefix}:{spec.name}")
            limiter.check("warm-up")  # loads the script outside the measurement
            calls0, usec0 = _script_usec(client)
            admitted = sum(limiter.check(f"k{i}").allowed for i in range(checks))
            calls1, usec1 = _script_usec(client)
            if admitted != checks:
                raise RuntimeError(f"{spec.name}: {checks - admitted} checks were rejected")
            if calls1 - calls0 < checks:
                raise RuntimeError("INFO commandstats did not count the checks' script calls")
            figures[spec.name] = (usec1 - usec0) / (calls1 - calls0)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    source = (
        f"measured now on {where} ({checks:,} admitted checks per algorithm, INFO commandstats)"
    )
    return ServerTime(figures, source)

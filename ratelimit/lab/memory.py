"""What one limiter key costs in Redis memory: fill a key, ask the server, delete it.

    import redis
    from ratelimit.lab.memory import probe, listpack_threshold

    client = redis.Redis()                        # a real server; fakeredis cannot tell
    probe(client, "log", 128)                     # sliding log, 128 members: listpack
    probe(client, "log", 129)                     # one above the threshold: skiplist
    probe(client, "log", 128, member_format="classic")   # "<ms>:<perf_counter_ns>"
    probe(client, "log", 1000, member_format="compact")  # storage="compact": a hash
    probe(client, "gcra", 10_000)                 # O(1): one small string whatever the limit
    listpack_threshold(client)                    # zset-max-listpack-entries, e.g. 128

    # A tidy table of full keys, measured when a real Redis answers, else read back
    # from the CSV the last measurement wrote (needs pandas):
    result = measured_or_stored(client, STORED_TABLE, [10, 128, 129, 1000])
    result.table, result.source                   # DataFrame, "measured" or "stored"
    fleet_memory(result.table, [10**3, 10**6], limits=[10])   # N keys x bytes per key

Figures come from the server itself: `MEMORY USAGE <key> SAMPLES 0` (every element
counted, key name and overhead included) and `OBJECT ENCODING <key>`. The embedded
fakeredis has neither command nor Redis's memory layout, so on it `probe` raises
`MemoryNotMeasurableError` instead of inventing a number.

How a sliding-log key is filled: `entries` admitted requests of cost 1 at consecutive
milliseconds, in a window long enough that nothing is trimmed, each decided by the
real sliding-log script on a virtual clock, so the members are exactly the ones it
writes. The log's `member_format` says how it holds its entries: "script" and
"classic" are sorted sets (`storage="sorted-set"`, with the members our script picks
or the classic recipe's strings), "compact" is `storage="compact"` (a hash of 6-byte
entries, `ratelimit/lua/compact_log.lua`), filled by its own script the same way.
With `fill="limiter"` every request is one `check` round trip (about 15 s per 100,000
entries); with the default `fill="pipeline"` the same script calls are sent in
pipelined batches.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
import redis.asyncio
import redis.exceptions

from ratelimit import algorithms, sync, validation
from ratelimit.algorithms import SLIDING_LOG_MAX_LIMIT
from ratelimit.backends import is_embedded
from ratelimit.clock import ManualClock

from .classic import classic_members

if TYPE_CHECKING:  # pandas is only needed by the table functions (the "sim" extra)
    import pandas as pd

STORED_TABLE = Path(__file__).resolve().parent / "data" / "memory_per_key.csv"
"""Chapter 3's last measured table, shipped in the package so that an installed lab plans
with it: the one copy the chapters, the planner and the capacity code read, and that
`make refresh` rewrites when chapter 3 measures."""

__all__ = [
    "STORED_TABLE",
    "TABLE_COLUMNS",
    "MeasuredOrStored",
    "MemoryNotMeasurableError",
    "MemoryProbe",
    "fleet_memory",
    "format_bytes",
    "listpack_threshold",
    "load_table",
    "measured_or_stored",
    "memory_table",
    "probe",
    "redis_version",
    "save_table",
]


class MemoryNotMeasurableError(RuntimeError):
    """The backend cannot report Redis memory (the embedded fakeredis)."""


@dataclass(frozen=True, slots=True)
class MemoryProbe:
    """One measured key."""

    algorithm: str  # "log", "fw", "swc" or "gcra" (as in the key)
    member_format: str | None  # "script", "classic" or "compact" for the log, None otherwise
    limit: int
    window_ms: int
    entries: int  # the log's entries (members), or units of cost the O(1) state accounts for
    memory_usage: int  # bytes: MEMORY USAGE key SAMPLES 0
    encoding: str  # OBJECT ENCODING: listpack, skiplist, int, embstr, ...
    bytes_per_entry: float  # memory_usage / entries


DEFAULT_WINDOW_MS = 10**9  # ~11.6 days: nothing expires while a key is filled
DEFAULT_START_MS = 1_796_000_000_000  # virtual time of the first entry (a whole second)
_CHUNK = 10_000  # members per pipelined ZADD


def _check_measurable(client: Any) -> None:
    if is_embedded(client) or type(client).__module__.startswith("fakeredis"):
        raise MemoryNotMeasurableError(
            "memory is not measurable on the embedded fakeredis backend: it has no "
            "MEMORY USAGE or OBJECT ENCODING and does not store data the way Redis does. "
            "Connect to a real Redis (REDIS_URL) to measure key sizes."
        )
    if isinstance(client, redis.asyncio.Redis):
        raise TypeError("probe needs a synchronous redis.Redis client, not redis.asyncio")


@contextmanager
def _answered(what: str) -> Iterator[None]:
    """A server that does not know `what` (a command) cannot be measured: say so."""
    try:
        yield
    except redis.exceptions.ResponseError as exc:
        if "unknown command" in str(exc).lower():
            raise MemoryNotMeasurableError(f"this server does not answer {what} ({exc})") from exc
        raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def listpack_threshold(client: Any) -> int:
    """The server's `zset-max-listpack-entries` (`zset-max-ziplist-entries` before
    Redis 7): the most members a sorted set may hold and stay a compact listpack."""
    _check_measurable(client)
    for name in ("zset-max-listpack-entries", "zset-max-ziplist-entries"):
        with _answered("CONFIG GET"):
            reply = client.config_get(name)
        for key, value in reply.items():
            if _text(key) == name:
                return int(_text(value))
    raise RuntimeError("the server reports neither zset-max-listpack-entries nor -ziplist-")


def _zadd_all(client: Any, key: str, members: list[tuple[str, int]]) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(members), _CHUNK):
        pipe.zadd(key, dict(members[i : i + _CHUNK]))
    pipe.execute()


def _fill_log(
    client: Any,
    limiter: sync.SyncLimiter,
    identity: str,
    clock: ManualClock,
    entries: int,
    start_ms: int,
    member_format: str,
    fill: str,
) -> None:
    key = limiter.key_for(identity)
    if member_format == "classic":
        _zadd_all(client, key, classic_members(start_ms, entries))
        client.pexpire(key, limiter.window_ms)
        return
    if fill == "limiter":
        for i in range(entries):
            clock.set_ms(start_ms + i)
            if not limiter.check(identity).allowed:
                raise RuntimeError(f"the limiter rejected entry {i + 1} while filling the probe")
        return
    # The same script calls as `check` makes (its KEYS and ARGV, one ms apart), sent
    # as EVALSHA in pipelined batches, and their replies read as `check` reads them.
    clock.set_ms(start_ms)
    keys, _ = limiter._prepare(identity, 1)
    sha = client.script_load(limiter.script)
    for first in range(0, entries, _CHUNK):
        pipe = client.pipeline(transaction=False)
        sent = range(start_ms + first, start_ms + min(first + _CHUNK, entries))
        for now in sent:
            pipe.evalsha(sha, 1, *keys, *limiter.script_args(now, 1))
        replies = pipe.execute()
        if not all(limiter._decision(r, now).allowed for r, now in zip(replies, sent, strict=True)):
            raise RuntimeError("the sliding-log script rejected a request while filling the probe")


def _entries_held(client: Any, key: str, member_format: str) -> int:
    """The entries a log key holds: a sorted set's members, or for the compact log
    s - b from its header (the first two 6-byte numbers of field "h", see
    ratelimit/lua/compact_log.lua)."""
    if member_format != "compact":
        return int(client.zcard(key))
    header = client.hget(key, "h") or b""
    if len(header) < 12:
        return 0
    return int.from_bytes(header[0:6], "big") - int.from_bytes(header[6:12], "big")


def _fill_constant(
    limiter: sync.SyncLimiter, identity: str, clock: ManualClock, entries: int, start_ms: int
) -> None:
    """One admitted request of cost `entries` (at a whole second: a window start)."""
    clock.set((start_ms + 0.5) / 1000)
    if not limiter.check(identity, entries).allowed:
        raise RuntimeError("the limiter rejected the probe's request")


def probe(
    client: redis.Redis,
    algorithm: Any,
    entries: int,
    *,
    limit: int | None = None,
    member_format: str = "script",
    fill: str = "pipeline",
    window_ms: int = DEFAULT_WINDOW_MS,
    prefix: str = "rl",
    start_ms: int = DEFAULT_START_MS,
) -> MemoryProbe:
    """Fill one fresh key of `algorithm` with `entries`, measure it, delete it.

    - `algorithm`: "log", "fw", "swc", "gcra" (tags of `ratelimit.algorithms`), an
      `Algorithm`, or a limiter class or instance (only its algorithm is used);
      "logc" (`algorithms.COMPACT_LOG`) is the log with `member_format="compact"`.
    - `entries`: for the sliding log, admitted requests of cost 1 (= members), at
      consecutive ms from `start_ms`; for the O(1) algorithms, the cost of one
      admitted request, so the state accounts for `entries` units (for the
      sliding-window counter the previous window's count is then 0; its value does
      not change the hash's size class).
    - `limit`: the limiter's limit, default `entries`; must be >= `entries`.
    - `member_format`: how the log holds its entries: sorted-set members as the script
      writes them ("script"), "classic" strings "<ms>:<perf_counter_ns>" (always
      written by pipeline), or "compact": `storage="compact"`, the compact log's hash,
      filled by its own script. The measured key is then a hash (OBJECT ENCODING
      "hashtable"), not a sorted set.
    - `fill`: "pipeline" (the script's calls in pipelined batches, fast) or "limiter"
      (every entry through `check`, one round trip each). Only matters for the log.
    - `window_ms`: long by default, so nothing is trimmed or expires during the fill.
    - `prefix`: the key prefix; the identity is random, so the key is new and the
      key name has the same length as the limiter's real keys under that prefix.

    Raises `MemoryNotMeasurableError` on fakeredis. The key is deleted afterwards,
    also when something fails.
    """
    _check_measurable(client)
    alg = algorithms.get(algorithm)
    if alg == algorithms.COMPACT_LOG:
        if member_format not in ("script", "compact"):
            raise ValueError(f"the compact log has no member_format {member_format!r}")
        alg, member_format = algorithms.SLIDING_LOG, "compact"
    entries = validation.count("entries", entries)
    limit = entries if limit is None else validation.count("limit", limit)
    if entries > limit:
        raise ValueError(f"entries ({entries}) must be <= limit ({limit})")
    if member_format not in MEMBER_FORMATS:
        raise ValueError(
            f"member_format must be one of {', '.join(MEMBER_FORMATS)}, got {member_format!r}"
        )
    if fill not in ("pipeline", "limiter"):
        raise ValueError(f'fill must be "pipeline" or "limiter", got {fill!r}')
    is_log = alg == algorithms.SLIDING_LOG
    if not is_log and member_format != "script":
        raise ValueError(f"member_format applies to the sliding log only, not {alg.name!r}")
    if member_format == "classic" and fill == "limiter":
        raise ValueError('the limiter never writes classic members: use fill="pipeline"')
    if is_log and window_ms < entries:
        raise ValueError(f"window_ms ({window_ms}) must be >= entries, or entries are trimmed")

    clock = ManualClock()
    options: dict[str, Any] = {"storage": "compact"} if member_format == "compact" else {}
    limiter = alg.build(
        "sync", client, None, limit, prefix=prefix, window_ms=window_ms, clock=clock, **options
    )
    identity = f"memory-probe-{uuid.uuid4().hex}"
    key = limiter.key_for(identity)
    if client.exists(key):
        raise RuntimeError(f"probe key {key!r} already exists; refusing to touch it")
    try:
        if is_log:
            _fill_log(client, limiter, identity, clock, entries, start_ms, member_format, fill)
            held = _entries_held(client, key, member_format)
            if held != entries:
                raise RuntimeError(f"probe key holds {held} entries, expected {entries}")
        else:
            _fill_constant(limiter, identity, clock, entries, start_ms)
        with _answered("MEMORY USAGE / OBJECT ENCODING"):
            usage = client.memory_usage(key, samples=0)
            encoding = _text(client.object("encoding", key))
        if usage is None:
            raise RuntimeError(f"probe key {key!r} vanished before it was measured")
    finally:
        client.delete(key)
    return MemoryProbe(
        algorithm=alg.name,
        member_format=member_format if is_log else None,
        limit=limit,
        window_ms=window_ms,
        entries=entries,
        memory_usage=int(usage),
        encoding=encoding,
        bytes_per_entry=int(usage) / entries,
    )


# Tables ------------------------------------------------------------------------------

# One row per measured key (a `MemoryProbe`). `bytes_per_key` is its MEMORY USAGE
# (named so as not to clash with `DataFrame.memory_usage`). `member_format` is how the
# sliding log holds its entries, "script" or "classic" (sorted-set members) or
# "compact" (the compact log's hash), and "" for the O(1) algorithms (so that the
# column survives a CSV round trip). `entries` and `bytes_per_entry` are then per
# admitted unit of cost. `redis_version` and `listpack_threshold` say
# which server the figures come from.
TABLE_COLUMNS = (
    "algorithm",
    "member_format",
    "limit",
    "entries",
    "encoding",
    "bytes_per_key",
    "bytes_per_entry",
    "redis_version",
    "listpack_threshold",
)
_TABLE_DTYPES = {
    "algorithm": str,
    "member_format": str,
    "limit": "int64",
    "entries": "int64",
    "encoding": str,
    "bytes_per_key": "int64",
    "bytes_per_entry": "float64",
    "redis_version": str,
    "listpack_threshold": "int64",
}
MEMBER_FORMATS = ("script", "classic", "compact")

Limits = Sequence[int] | Callable[[int], Iterable[int]]


def redis_version(client: Any) -> str:
    """The server's version, e.g. "7.0.15" (`INFO server`)."""
    _check_measurable(client)
    return _text(client.info("server")["redis_version"])


def _limits(limits: Any, maximum: int) -> list[int]:
    if isinstance(limits, str | bytes) or not isinstance(limits, Iterable):
        raise ValueError(f"limits must be a sequence of positive integers, got {limits!r}")
    values = sorted({validation.count("limit", value) for value in limits})
    if not values:
        raise ValueError("limits must not be empty")
    if values[-1] > maximum:
        raise ValueError(f"limit {values[-1]} is above the sliding log's maximum {maximum}")
    return values


def _variants(specs: Any, member_formats: Any) -> list[tuple[str, str]]:
    if isinstance(specs, str) or not isinstance(specs, Iterable):
        specs = [specs]
    names = list(dict.fromkeys(algorithms.get(a).name for a in specs))
    if not names:
        raise ValueError("algorithms must not be empty")
    formats = [member_formats] if isinstance(member_formats, str) else list(member_formats)
    if not formats or any(f not in MEMBER_FORMATS for f in formats):
        raise ValueError(f"member_formats must be some of {MEMBER_FORMATS}, got {member_formats!r}")
    log = algorithms.SLIDING_LOG.name
    variants: list[tuple[str, str]] = []
    for name in names:
        if name == log:
            variants += [(name, f) for f in dict.fromkeys(formats)]
        elif name == algorithms.COMPACT_LOG.name:
            variants.append((log, "compact"))
        else:
            variants.append((name, ""))
    return list(dict.fromkeys(variants))


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS)).astype(_TABLE_DTYPES)


def memory_table(
    client: redis.Redis,
    limits: Limits,
    algorithms: Any = algorithms.NAMES,
    *,
    member_formats: Any = MEMBER_FORMATS,
    window_ms: int = DEFAULT_WINDOW_MS,
    prefix: str = "rl",
) -> pd.DataFrame:
    """Measure one full key per (algorithm, member format, limit): a tidy DataFrame.

    Each row is `probe(client, algorithm, limit, member_format=...)`: a key holding a
    whole limit's worth (the log: `limit` members; the O(1) algorithms: one request of
    cost `limit`), i.e. what a client at its limit costs. Columns: `TABLE_COLUMNS`.

    - `limits`: positive integers (duplicates dropped, sorted; at most the log's
      maximum), or a function of the server's `listpack_threshold` returning them,
      e.g. `lambda t: [10, t, t + 1, 1000]`.
    - `algorithms`: names ("log", "fw", "swc", "gcra"), `Algorithm`s or limiter classes;
      "logc" is the log with member format "compact" only.
    - `member_formats`: for the log, "script" (ours), "classic" members and/or "compact"
      (`storage="compact"`).

    Raises `MemoryNotMeasurableError` on fakeredis; bad arguments raise `ValueError`
    before anything is sent. Every probe key is deleted again.
    """
    variants = _variants(algorithms, member_formats)
    fixed = None if callable(limits) else _limits(limits, SLIDING_LOG_MAX_LIMIT)
    _check_measurable(client)
    threshold = listpack_threshold(client)
    version = redis_version(client)
    values = fixed if fixed is not None else _limits(limits(threshold), SLIDING_LOG_MAX_LIMIT)
    rows = []
    for name, member_format in variants:
        for limit in values:
            result = probe(
                client,
                name,
                limit,
                member_format=member_format or "script",
                window_ms=max(window_ms, limit),
                prefix=prefix,
            )
            rows.append(
                {
                    "algorithm": result.algorithm,
                    "member_format": member_format,
                    "limit": result.limit,
                    "entries": result.entries,
                    "encoding": result.encoding,
                    "bytes_per_key": result.memory_usage,
                    "bytes_per_entry": result.bytes_per_entry,
                    "redis_version": version,
                    "listpack_threshold": threshold,
                }
            )
    return _frame(rows)


def _checked_table(table: Any) -> pd.DataFrame:
    import pandas as pd

    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(table).__name__}")
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"the table lacks the column(s) {', '.join(missing)}")
    return table


def save_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Write a `memory_table` as CSV (creating the directory); returns the path."""
    table = _checked_table(table)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.loc[:, list(TABLE_COLUMNS)]
    # bytes_per_entry is rounded for people reading the file; `load_table` recomputes it.
    table = table.assign(bytes_per_entry=table["bytes_per_entry"].round(3))
    table.to_csv(path, index=False, lineterminator="\n")
    return path


def load_table(path: str | Path) -> pd.DataFrame:
    """Read a table written by `save_table`, with the same columns and dtypes."""
    import pandas as pd

    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table = _checked_table(table).loc[:, list(TABLE_COLUMNS)]
    table = table.astype({c: t for c, t in _TABLE_DTYPES.items() if c != "bytes_per_entry"})
    # Recomputed rather than parsed, so that a loaded table equals the measured one.
    table["bytes_per_entry"] = table["bytes_per_key"] / table["entries"]
    return table.astype(_TABLE_DTYPES).reset_index(drop=True)


class MeasuredOrStored(NamedTuple):
    table: pd.DataFrame
    source: str  # "measured" (and saved, unless save=False) or "stored"
    reason: str  # why the stored table was used; "" when measured


def measured_or_stored(
    client: redis.Redis | None,
    path: str | Path,
    limits: Limits,
    algorithms: Any = algorithms.NAMES,
    *,
    member_formats: Any = MEMBER_FORMATS,
    save: bool = True,
    **kwargs: Any,
) -> MeasuredOrStored:
    """`memory_table` on `client` when it can measure, else the table stored at `path`.

    With a real Redis the table is measured and (with `save=True`) written to `path`,
    refreshing what is stored there. With `client=None` or a backend that cannot
    report memory (the embedded fakeredis, a server refusing MEMORY USAGE) the table
    last stored at `path` is returned as it is, with the reason; if there is none,
    `FileNotFoundError`. Connection errors of a real client are not hidden. Other
    keyword arguments go to `memory_table`.
    """
    path = Path(path)
    reason = "no Redis server to measure on"
    if client is not None:
        try:
            table = memory_table(
                client, limits, algorithms, member_formats=member_formats, **kwargs
            )
        except MemoryNotMeasurableError as exc:
            reason = str(exc)
        else:
            if save:
                save_table(table, path)
            return MeasuredOrStored(table, "measured", "")
    if not path.exists():
        raise FileNotFoundError(f"{reason}, and no stored table at {path} to fall back on")
    return MeasuredOrStored(load_table(path), "stored", reason)


def fleet_memory(
    table: pd.DataFrame,
    active_keys: Iterable[int],
    limits: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Memory for a fleet of identities that each hold one full key: N x bytes per key.

    For every row of `table` (a `memory_table`) whose limit is in `limits` (default:
    all), and every N in `active_keys`: columns `algorithm`, `member_format`, `limit`,
    `active_keys`, `bytes_per_key`, `total_bytes`. A lower bound for sizing: MEMORY
    USAGE leaves out the server's own per-key bookkeeping (hash-table slots, the
    expiry entry) and allocator fragmentation.
    """
    import pandas as pd

    table = _checked_table(table)
    counts = sorted({validation.count("active_keys", n) for n in active_keys})
    if not counts:
        raise ValueError("active_keys must not be empty")
    if limits is not None:
        wanted = sorted({validation.count("limit", v) for v in limits})
        for (name, member_format), group in table.groupby(
            ["algorithm", "member_format"], sort=False
        ):
            missing = sorted(set(wanted) - set(group["limit"]))
            if missing:
                label = f"{name} ({member_format})" if member_format else name
                raise ValueError(f"the table has no {label} key at limit(s) {missing}")
        table = table[table["limit"].isin(wanted)]
    keys = pd.DataFrame({"active_keys": pd.Series(counts, dtype="int64")})
    fleet = table.loc[:, ["algorithm", "member_format", "limit", "bytes_per_key"]].merge(
        keys, how="cross"
    )
    fleet["total_bytes"] = fleet["bytes_per_key"] * fleet["active_keys"]
    return fleet.reset_index(drop=True)


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float) -> str:
    """A byte count for people, in powers of 1024 to 3 significant digits:
    `format_bytes(88_000)` is "85.9 KiB", `format_bytes(1.02e12)` is "950 GiB"."""
    if isinstance(n, bool) or not isinstance(n, int | float) or not n >= 0:
        raise ValueError(f"expected a non-negative number of bytes, got {n!r}")
    value, unit = float(n), 0
    while unit < len(_UNITS) - 1 and float(f"{value:.3g}") >= 1000:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{value:.0f} B"
    digits = 0 if value >= 99.95 else 1 if value >= 9.995 else 2
    return f"{value:.{digits}f} {_UNITS[unit]}"

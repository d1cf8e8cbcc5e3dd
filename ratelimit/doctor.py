"""A health check of the Redis a limiter uses: what matters for rate limits, graded.

    report = ratelimit.doctor("redis://127.0.0.1:6379/0")   # or a sync client, or None
    print(report)                                           # one line per finding
    report.level                                            # "ok", "warn" or "error"

or from a shell, `python -m ratelimit doctor [URL]` (exit status 0: all ok, 1: warnings,
2: errors or Redis unreachable). Each `Finding` has a topic, a level and one line that
says what the setting means for the limits. The doctor only reads (PING, INFO, CONFIG
GET, TIME, ACL WHOAMI, CLUSTER INFO) and loads the limiters' scripts (SCRIPT LOAD, which
changes no key); a command the user may not run becomes a "could not read" finding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import redis
import redis.asyncio
import redis.exceptions

from . import algorithms, backends, scripts

Level = Literal["ok", "warn", "error"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "error")

# Above this offset between this host's clock and Redis's TIME (beyond what the round
# trip leaves uncertain), limiters on the host's clock (the default) and those on
# clock="redis", or hosts whose clocks differ by as much, put the same request in
# windows that far apart: 50 ms is 5 % of a one-second window.
CLOCK_THRESHOLD_MS = 50.0
CLOCK_SAMPLES = 5  # TIME round trips; the shortest bounds the offset best
USED_MEMORY_WARN = 0.9  # share of maxmemory in use above which a full Redis is near

# What the eviction tests measured (tests/core/test_full_redis.py): a client whose key
# is evicted gets its whole limit again.
_EVICTION_COST = "a client whose key is evicted is admitted a whole limit again"

_UNREACHABLE = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)

# Settings read with CONFIG GET; INFO has some of them when CONFIG is not allowed.
_SETTINGS = (
    "maxmemory",
    "maxmemory-policy",
    "save",
    "appendonly",
    "appendfsync",
    "min-replicas-to-write",
    "min-replicas-max-lag",
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One graded observation: `topic` (e.g. "memory"), `level`, a one-line `message`,
    and the cluster node it is about (None for a single server)."""

    topic: str
    level: Level
    message: str
    node: str | None = None

    def line(self) -> str:
        where = f"[{self.node}] " if self.node else ""
        return f"{self.level:<5}  {self.topic:<12} {where}{self.message}"


@dataclass
class Report:
    """What `doctor` found about `target` (a URL without its password, or "embedded")."""

    target: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def level(self) -> Level:
        """The worst level among the findings ("ok" when there are none)."""
        return max((f.level for f in self.findings), key=LEVELS.index, default="ok")

    @property
    def exit_code(self) -> int:
        """0 when every finding is ok, 1 with warnings, 2 with errors."""
        return LEVELS.index(self.level)

    @property
    def reachable(self) -> bool:
        """False when Redis could not be reached at all (a cluster node that cannot be
        is one finding among the others)."""
        return not any(
            f.topic == "connection" and f.level == "error" and f.node is None for f in self.findings
        )

    def about(self, topic: str) -> list[Finding]:
        """The findings on `topic`."""
        return [f for f in self.findings if f.topic == topic]

    def add(self, topic: str, level: Level, message: str, node: str | None = None) -> None:
        self.findings.append(Finding(topic, level, message, node))

    def __str__(self) -> str:
        if not self.reachable:  # one line: nothing else could be examined
            return next(f.message for f in self.findings if f.topic == "connection")
        counts = {lv: sum(f.level == lv for f in self.findings) for lv in LEVELS}
        summary = ", ".join(f"{n} {lv}" for lv, n in counts.items() if n)
        lines = [f"ratelimit doctor: {self.target}", *(f"  {f.line()}" for f in self.findings)]
        return "\n".join([*lines, f"overall: {self.level} ({summary})"])


def doctor(
    client_or_url: Any = None,
    *,
    timeout: float = 2.0,
    clock_threshold_ms: float = CLOCK_THRESHOLD_MS,
) -> Report:
    """Examine the Redis at `client_or_url`: a URL (any `ratelimit.connect_sync` takes),
    a synchronous `redis.Redis` or `redis.RedisCluster`, or None for `REDIS_URL` (the
    embedded fakeredis when it is unset). Never raises for what it finds, an
    unreachable server included; ValueError for an argument it cannot use."""
    if isinstance(client_or_url, redis.asyncio.Redis | redis.asyncio.RedisCluster):
        raise ValueError("client_or_url must be a URL or a synchronous client, not an asyncio one")
    if not isinstance(clock_threshold_ms, int | float) or clock_threshold_ms <= 0:
        raise ValueError(
            f"clock_threshold_ms must be a positive number, got {clock_threshold_ms!r}"
        )
    if client_or_url is None or isinstance(client_or_url, str):
        url = backends.configured_url(client_or_url)
        target = _safe(url) if url else "embedded fakeredis"
        try:
            # The report itself says when it examined the embedded Redis (a warning).
            client = backends.connect_sync(url, timeout=timeout, embedded=url is None)
        except RuntimeError as exc:  # no Redis named, and no fakeredis to fall back on
            report = Report(target)
            report.add("connection", "error", str(exc))
            return report
        except _UNREACHABLE as exc:  # a cluster client asks for the slot map at once
            report = Report(target)
            report.add("connection", "error", f"could not reach Redis at {target}: {_why(exc)}")
            return report
        try:
            return _examine(client, target, clock_threshold_ms)
        finally:
            client.close()
    if not isinstance(client_or_url, redis.Redis | redis.RedisCluster):
        raise ValueError(
            "client_or_url must be a Redis URL, a redis.Redis or redis.RedisCluster, or "
            f"None, got {type(client_or_url).__name__}"
        )
    return _examine(client_or_url, _describe(client_or_url), clock_threshold_ms)


def _examine(client: Any, target: str, clock_threshold_ms: float) -> Report:
    report = Report(target)
    if backends.is_embedded(client):
        report.add(
            "backend", "warn", "embedded fakeredis: the limits live in this process only "
            "(each process counts on its own) and vanish when it exits; set REDIS_URL "
            "for a real Redis",
        )  # fmt: skip
        _scripts(report, client, None)
        return report
    if isinstance(client, redis.RedisCluster):
        return _examine_cluster(client, report, clock_threshold_ms)
    try:
        client.ping()  # connects
        started = time.perf_counter()
        client.ping()
        rtt_ms = (time.perf_counter() - started) * 1000
    except redis.exceptions.AuthenticationError as exc:
        report.add("connection", "error", f"Redis at {target} refused the login: {_why(exc)}")
        return report
    except redis.exceptions.NoPermissionError:
        rtt_ms = None  # connected, but PING is not allowed: each reading says what it can
    except (redis.exceptions.RedisError, OSError) as exc:
        report.add("connection", "error", f"could not reach Redis at {target}: {_why(exc)}")
        return report
    _server(report, client, rtt_ms, clock_threshold_ms, node=None, in_cluster=False)
    return report


def _examine_cluster(client: Any, report: Report, clock_threshold_ms: float) -> Report:
    try:
        info = client.cluster_info()
        primaries = client.get_primaries()
    except _UNREACHABLE as exc:
        report.add("connection", "error", f"could not reach Redis at {report.target}: {_why(exc)}")
        return report
    state = info.get("cluster_state")
    level: Level = "ok" if state == "ok" else "error"
    detail = "" if state == "ok" else ": some slots are not served, and checks on them fail"
    report.add(
        "cluster", level,
        f"Redis Cluster, {len(primaries)} primaries, cluster_state {state}{detail}",
    )  # fmt: skip
    for node in primaries:
        name = f"{node.host}:{node.port}"
        try:
            node_client = client.get_redis_connection(node)
            node_client.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            report.add("connection", "error", f"could not reach {name}: {_why(exc)}", name)
            continue
        _server(report, node_client, None, clock_threshold_ms, node=name, in_cluster=True)
    return report


def _server(
    report: Report,
    client: redis.Redis,
    rtt_ms: float | None,
    clock_threshold_ms: float,
    *,
    node: str | None,
    in_cluster: bool,
) -> None:
    """Every finding about one server."""
    info, info_error = _read(client.info)
    settings, config_error = _config(client)
    if config_error:
        report.add(
            "config", "warn", f"could not read the configuration (CONFIG GET): {config_error}; "
            "the findings below come from INFO where it has them",
            node,
        )  # fmt: skip
    if info_error:
        report.add("info", "warn", f"could not read INFO: {info_error}", node)
        info = {}
    _connection(report, client, info, rtt_ms, node)
    _version(report, info, node)
    _memory(report, info, settings, node)
    _persistence(report, info, settings, node)
    _replication(report, info, settings, node)
    if not in_cluster and str(info.get("cluster_enabled", "0")) == "1":
        report.add(
            "cluster", "error", "this server is a Redis Cluster node, but the client is "
            "not a cluster client: checks of keys in other slots fail (MOVED); use a "
            "redis+cluster:// URL",
            node,
        )  # fmt: skip
    _clock(report, client, clock_threshold_ms, node)
    _scripts(report, client, node)


def _connection(
    report: Report, client: redis.Redis, info: dict[str, Any], rtt_ms: float | None, node: Any
) -> None:
    user, _ = _read(lambda: client.acl_whoami())
    parts = [f"as user {_text(user)}" if user else None]
    if rtt_ms is not None:
        parts.append(f"round trip {rtt_ms:.1f} ms")
    if info.get("connected_clients") is not None:
        parts.append(f"connected clients: {info['connected_clients']}")
    said = ", ".join(p for p in parts if p)
    report.add("connection", "ok", f"connected{' ' + said if said else ''}", node)


def _version(report: Report, info: dict[str, Any], node: Any) -> None:
    version = info.get("redis_version")
    if version is None:
        report.add("version", "warn", "could not read the Redis version (INFO server)", node)
        return
    need = ".".join(map(str, scripts.MIN_REDIS_VERSION[:2]))
    if _version_tuple(str(version)) < scripts.MIN_REDIS_VERSION:
        report.add(
            "version", "error", f"Redis {version}: the limiters need Redis {need} or later "
            "(their scripts carry a #!lua shebang so that a full Redis refuses a check whole)",
            node,
        )  # fmt: skip
    else:
        report.add("version", "ok", f"Redis {version} (the limiters need {need} or later)", node)


def _memory(report: Report, info: dict[str, Any], settings: dict[str, str], node: Any) -> None:
    maxmemory = settings.get("maxmemory", info.get("maxmemory"))
    policy = settings.get("maxmemory-policy", info.get("maxmemory_policy"))
    if maxmemory is None or policy is None:
        report.add("memory", "warn", "could not read maxmemory and maxmemory-policy", node)
        return
    maxmemory, policy = int(maxmemory), str(policy)
    used = info.get("used_memory")
    if maxmemory == 0:  # without a maxmemory the policy never applies
        report.add(
            "memory", "ok", "no maxmemory: limiter keys are never evicted, and Redis grows "
            "until the host runs out of memory (a Redis killed then forgets every limit); "
            "a maxmemory with noeviction makes a full Redis refuse checks instead",
            node,
        )  # fmt: skip
        return
    if policy.startswith("allkeys-"):
        report.add(
            "memory", "warn", f"maxmemory-policy {policy}: a full Redis evicts any key, "
            f"limiter keys included, and {_EVICTION_COST}; use noeviction (then a full "
            "Redis refuses checks and the failure policy decides)",
            node,
        )  # fmt: skip
    elif policy.startswith("volatile-"):
        report.add(
            "memory", "warn", f"maxmemory-policy {policy}: every limiter key carries a "
            f"TTL, so a full Redis evicts them too, and {_EVICTION_COST}; use noeviction",
            node,
        )  # fmt: skip
    share = used / maxmemory if isinstance(used, int) else None
    in_use = f", {share:.0%} in use" if share is not None else ""
    if policy == "noeviction":
        report.add(
            "memory", "ok", f"maxmemory {_size(maxmemory)}, noeviction{in_use}: a full "
            "Redis refuses every check, and the limiters' failure policy decides",
            node,
        )  # fmt: skip
    if share is not None and share >= USED_MEMORY_WARN:
        report.add(
            "memory", "warn", f"{_size(used)} of maxmemory {_size(maxmemory)} in use "
            f"({share:.0%}): near full",
            node,
        )  # fmt: skip


def _persistence(report: Report, info: dict[str, Any], settings: dict[str, str], node: Any) -> None:
    aof = settings.get("appendonly")
    if aof is None and "aof_enabled" in info:
        aof = "yes" if int(info["aof_enabled"]) else "no"
    save = settings.get("save")
    if aof is None:
        report.add("persistence", "warn", "could not read appendonly and save", node)
        return
    if aof == "yes":
        fsync = settings.get("appendfsync", "everysec")
        lost = {"always": "no admit", "everysec": "about the last second of admits"}.get(
            fsync, "the admits the OS had not yet written"
        )
        report.add(
            "persistence", "ok", f"append-only file (appendfsync {fsync}): a restart "
            f"keeps the limits and loses {lost}",
            node,
        )  # fmt: skip
    elif save is None:
        report.add(
            "persistence", "warn", "no append-only file, and the snapshot schedule could "
            "not be read: a restart may forget every limit",
            node,
        )  # fmt: skip
    elif save.strip():
        report.add(
            "persistence", "ok", f"snapshots only (save {save}): a restart goes back to "
            "the last snapshot, so admits made since are forgotten and those clients can "
            "be admitted again, up to a whole limit each",
            node,
        )  # fmt: skip
    else:
        report.add(
            "persistence", "warn", "no persistence (save '' and appendonly no): a restart "
            "forgets every limit, so every client can be admitted a whole limit again "
            "right after it",
            node,
        )  # fmt: skip


def _replication(report: Report, info: dict[str, Any], settings: dict[str, str], node: Any) -> None:
    role = info.get("role")
    if role is None:
        report.add("replication", "warn", "could not read the replication role (INFO)", node)
        return
    if role != "master":
        report.add(
            "replication", "error", f"this server is a replica of "
            f"{info.get('master_host')}:{info.get('master_port')}: it refuses the "
            "limiters' scripts (READONLY); point them at the primary, or use a "
            "redis+sentinel:// URL",
            node,
        )  # fmt: skip
        return
    replicas = int(info.get("connected_slaves", 0))
    wanted = settings.get("min-replicas-to-write")
    if wanted is None:
        report.add(
            "replication", "ok" if replicas == 0 else "warn",
            f"primary with {replicas} connected replicas; could not read "
            "min-replicas-to-write",
            node,
        )  # fmt: skip
        return
    wanted_n, lag = int(wanted), settings.get("min-replicas-max-lag", "?")
    if lag == "0":
        wanted_n = 0  # a max lag of 0 turns the requirement off
    if wanted_n > replicas:
        report.add(
            "replication", "error", f"min-replicas-to-write {wanted_n} but {replicas} "
            "replicas connected: Redis refuses writes (NOREPLICAS), so every check gets "
            "the failure policy",
            node,
        )  # fmt: skip
    elif replicas == 0:
        report.add(
            "replication", "ok", "primary with no replicas: if this server is lost, so "
            "are the limits, and checks get the failure policy until it is back",
            node,
        )  # fmt: skip
    elif wanted_n == 0:
        report.add(
            "replication", "warn", f"primary with {replicas} replicas, replicated "
            "asynchronously, and min-replicas-to-write 0: a failover can lose the last "
            "admits (the new primary admits them again), by as much as the replicas lag; "
            "set min-replicas-to-write, or wait_replicas= on the limiters",
            node,
        )  # fmt: skip
    else:
        report.add(
            "replication", "ok", f"primary with {replicas} replicas, min-replicas-to-write "
            f"{wanted_n} (max lag {lag} s): a failover loses at most the admits of the "
            "last seconds of lag",
            node,
        )  # fmt: skip


def _clock(report: Report, client: redis.Redis, threshold_ms: float, node: Any) -> None:
    samples = []
    for _ in range(CLOCK_SAMPLES):
        sent = _wall()
        reply, error = _read(client.time)
        back = _wall()
        if error:
            report.add("clock", "warn", f"could not read Redis's clock (TIME): {error}", node)
            return
        seconds, micros = reply
        samples.append((back - sent, seconds + micros / 1e6 - (sent + back) / 2))
    rtt, offset = min(samples)  # the shortest round trip pins Redis's time best
    offset_ms, within_ms = offset * 1000, rtt * 1000 / 2
    side = "ahead of" if offset_ms < 0 else "behind"
    said = (
        f"this host's clock is {abs(offset_ms):.1f} ms {side} Redis's TIME (± {within_ms:.1f} ms)"
    )
    if abs(offset_ms) - within_ms > threshold_ms:
        report.add(
            "clock", "warn", f"{said}: limiters on the host's clock (the default) here and "
            "elsewhere count the same moment in windows that far apart; sync the clocks "
            "(NTP) or use clock='redis'",
            node,
        )  # fmt: skip
    else:
        report.add("clock", "ok", f"{said}, within {threshold_ms:g} ms", node)


def _scripts(report: Report, client: Any, node: Any) -> None:
    kinds = [*algorithms.ALGORITHMS, algorithms.COMPACT_LOG]
    failed: dict[str, list[str]] = {}  # why -> the scripts that failed for that reason
    for kind in kinds:
        _, error = _read(lambda k=kind: client.script_load(scripts.for_client(k.script, client)))
        if error:
            failed.setdefault(error, []).append(kind.name)
    if failed:
        count = sum(map(len, failed.values()))
        reasons = "; ".join(f"{', '.join(names)}: {why}" for why, names in failed.items())
        report.add(
            "scripts", "error", f"{count} of {len(kinds)} scripts do not load (SCRIPT LOAD), "
            f"so checks get the failure policy: {reasons}",
            node,
        )  # fmt: skip
    else:
        names = ", ".join(k.name for k in kinds)
        report.add("scripts", "ok", f"all {len(kinds)} scripts load ({names})", node)


# Helpers -----------------------------------------------------------------------------

_wall = time.time  # this host's clock (tests replace it)


def _read(call: Any) -> tuple[Any, str | None]:
    """A command's reply and None, or None and why it failed (in one line)."""
    try:
        return call(), None
    except redis.exceptions.NoPermissionError as exc:
        return None, f"no permission ({_why(exc)})"
    except (redis.exceptions.RedisError, OSError) as exc:
        return None, _why(exc)


def _config(client: redis.Redis) -> tuple[dict[str, str], str | None]:
    settings: dict[str, str] = {}
    for name in _SETTINGS:
        reply, error = _read(lambda n=name: client.config_get(n))
        if error:
            return {}, error
        settings.update({_text(k): _text(v) for k, v in reply.items()})
    return settings, None


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _size(n: Any) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _safe(url: str) -> str:
    """`url` without its password."""
    return backends.redact_url(url)


def _describe(client: Any) -> str:
    if backends.is_embedded(client):
        return "embedded fakeredis"
    if isinstance(client, redis.RedisCluster):
        nodes = client.get_nodes()
        return f"Redis Cluster via {nodes[0].host}:{nodes[0].port}" if nodes else "Redis Cluster"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

"""A throw-away replicated Redis on loopback: one primary, one replica and three
Sentinels, started and stopped by PID.

    from ratelimit.devtools.sentinel import LocalSentinel

    with LocalSentinel() as replicated:           # primary + replica + 3 Sentinels
        client = ratelimit.connect(replicated.url)   # redis+sentinel://.../ratelimit
        ...
        replicated.failover()                     # SENTINEL FAILOVER, wait for the new primary
        replicated.kill_primary()                 # SIGKILL; then
        replicated.wait_for_primary(other_than=old)  # ... until Sentinel promotes the replica
        replicated.heal()                         # the killed server back, as a replica

Both data servers are `redis-server`s with no snapshots and no append-only file. The
replica authenticates to its primary as a user of its own (`repl`, allowed only the
replication commands; `masteruser`/`masterauth` on both servers, so either can be the
replica after a failover). That lets `cut_replication()` stop replication while
clients and Sentinels still reach the primary: the way to make the writes a failover
loses deterministic in a test.

Each Sentinel is `redis-server <dir>/sentinel.conf --sentinel` in a working directory
of its own (Sentinel rewrites its config file), monitoring the service with quorum 2,
`down-after-milliseconds` 1000 and a short `failover-timeout`, so that a killed
primary is replaced within a few seconds.

From the command line (`make sentinel-up` / `make sentinel-down`):

    python -m ratelimit.devtools.sentinel up   [--dir build/sentinel]
    python -m ratelimit.devtools.sentinel down [--dir build/sentinel]

`up` leaves everything running and records the URL, ports and PIDs in
`<dir>/state.json`; `down` stops exactly those PIDs and removes what `up` wrote. Both
are idempotent.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import recorded
from .process import Managed
from .server import EXECUTABLE, RedisServer

__all__ = ["LocalSentinel", "SentinelServer", "main"]

SERVICE = "ratelimit"
REPL_USER = "repl"
DEFAULT_DIR = Path("build/sentinel")
WHAT = "local Sentinel set"
Address = tuple[str, int]


def _admin(port: int, timeout: float = 1.0) -> redis.Redis:
    """A plain client for one process on loopback: no retries, decoded replies."""
    return redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=True,
    )  # fmt: skip


class SentinelServer(RedisServer):
    """One `redis-server <conf> --sentinel`, its config file in its own workdir."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        service: str,
        primary_port: int,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        executable: str = EXECUTABLE,
    ) -> None:
        super().__init__(workdir, executable=executable)
        self.service = service
        self.primary_port = primary_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def config_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "sentinel.conf"

    def _options(self) -> list[str]:
        # Written at each start: a port swapped for a free one needs a new file. (Sentinel
        # rewrites the file as it learns the topology; a restart starts it afresh.)
        assert self.workdir is not None
        name = self.service
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f'dir "{self.workdir}"',
            f"sentinel monitor {name} 127.0.0.1 {self.primary_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        self.config_file.write_text("\n".join(lines) + "\n")
        return [str(self.config_file), "--sentinel"]

    def admin(self, timeout: float = 1.0) -> redis.Redis:
        """A plain client for this Sentinel (SENTINEL commands)."""
        assert self.port is not None
        return _admin(self.port, timeout)


class LocalSentinel(Managed):
    """A primary, a replica and `sentinels` Sentinels on free loopback ports.

    - `workdir`: the data servers' logs, and one subdirectory per Sentinel; by default
      a temporary directory of its own, removed by `close()`.
    - `service`: the name the Sentinels monitor (the URL's last part).
    - `down_after_ms`, `failover_timeout_ms`: Sentinel's timings, small so that tests
      see a failover within seconds.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        service: str = SERVICE,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        executable: str = EXECUTABLE,
    ) -> None:
        if not isinstance(sentinels, int) or sentinels < 1:
            raise ValueError(f"sentinels must be an int >= 1, got {sentinels!r}")
        if not isinstance(quorum, int) or not 1 <= quorum <= sentinels:
            raise ValueError(f"quorum must be an int from 1 to {sentinels}, got {quorum!r}")
        if not service or any(c in service for c in " /,?@#:"):
            raise ValueError(f"service must be a plain name, got {service!r}")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.service = service
        self.sentinel_count = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.executable = executable
        self.repl_password = os.urandom(12).hex()
        self.servers: list[RedisServer] = []  # data servers: [first primary, first replica]
        self.sentinels: list[SentinelServer] = []
        self.start_seconds: float | None = None

    # Queries -----------------------------------------------------------------------

    @staticmethod
    def available(executable: str = EXECUTABLE) -> bool:
        """True when `redis-server` is on PATH (it is also the Sentinel)."""
        return shutil.which(executable) is not None

    @property
    def url(self) -> str:
        """`redis+sentinel://127.0.0.1:<s1>,127.0.0.1:<s2>,127.0.0.1:<s3>/<service>`."""
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{seeds}/{self.service}"

    @property
    def pids(self) -> list[int | None]:
        """PIDs of the data servers, then of the Sentinels."""
        return [p.pid for p in (*self.servers, *self.sentinels)]

    @property
    def ports(self) -> list[int]:
        return [p.port for p in (*self.servers, *self.sentinels) if p.port is not None]

    def _announced_by(self, sentinel: Any) -> Address:
        """The primary one Sentinel announces (TypeError when it announces none)."""
        with sentinel.admin() as client:
            host, port = client.sentinel_get_master_addr_by_name(self.service)
        return host, int(port)

    def primary_address(self) -> Address:
        """The primary the Sentinels announce (the first that answers)."""
        errors = []
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            try:
                return self._announced_by(sentinel)
            except (redis.exceptions.RedisError, TypeError) as exc:
                errors.append(f"{sentinel.port}: {exc!r}")
        raise LookupError(f"no Sentinel announces a primary for {self.service!r}: {errors}")

    def server_at(self, address: Address) -> RedisServer:
        """The data server listening on `address`."""
        for server in self.servers:
            if server.port == address[1]:
                return server
        raise LookupError(f"no data server of this set listens on {address}")

    def primary(self) -> RedisServer:
        """The data server the Sentinels announce as primary."""
        return self.server_at(self.primary_address())

    def replica(self) -> RedisServer:
        """The running data server that is not the announced primary."""
        primary = self.primary()
        return next(s for s in self.servers if s is not primary and s.running)

    def role(self, server: RedisServer) -> str:
        """`master` or `slave`, as the server itself says."""
        assert server.port is not None
        with _admin(server.port) as client:
            return str(client.info("replication")["role"])

    def _role_or_none(self, server: RedisServer) -> str | None:
        """`role`, or None while the server drops its clients (as it does when Sentinel
        turns it into a replica)."""
        try:
            return self.role(server)
        except redis.exceptions.ConnectionError:
            return None

    # Life cycle --------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Start the primary, the replica and the Sentinels; return once the Sentinels
        agree on the primary and see the replica and each other."""
        if self.servers:
            return self
        if not self.available(self.executable):
            raise FileNotFoundError(f"{self.executable} is not on PATH")
        began = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ratelimit-sentinel-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            primary = self._data_server(())
            self.servers.append(primary)
            primary.start()
            replica = self._data_server(("--replicaof", "127.0.0.1", str(primary.port)))
            self.servers.append(replica)
            replica.start()
            for i in range(self.sentinel_count):
                sentinel = SentinelServer(
                    self.workdir / f"sentinel-{i + 1}", service=self.service,
                    primary_port=primary.port or 0, quorum=self.quorum,
                    down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms, executable=self.executable,
                )  # fmt: skip
                self.sentinels.append(sentinel)
                sentinel.start()
            self.wait_ready(timeout - (time.monotonic() - began))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _data_server(self, extra: tuple[str, ...]) -> RedisServer:
        # A replication user allowed only what a replica sends, used by whichever
        # server is the replica (the roles swap on failover).
        secret = self.repl_password
        args = (
            "--user", REPL_USER, "on", f">{secret}", "-@all", "+psync", "+sync",
            "+replconf", "+ping",
            "--masteruser", REPL_USER, "--masterauth", secret,
            # A full sync starts at once (not after the default 5 s wait for more
            # replicas), and the replica loads it from the socket, writing no file.
            "--repl-diskless-sync-delay", "0", "--repl-diskless-load", "swapdb", *extra,
        )  # fmt: skip
        return RedisServer(self.workdir, args=args, executable=self.executable)

    def wait_ready(self, timeout: float = 20.0) -> float:
        """Wait until every running Sentinel announces the same primary, which says it
        is one, sees the replica with its link up, and knows the other Sentinels;
        return the seconds waited. RuntimeError (with what is missing) otherwise."""
        began = time.monotonic()
        deadline = began + max(timeout, 0.0)
        while True:
            problem = self._not_ready()
            if problem is None:
                return time.monotonic() - began
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"not ready within {timeout:.1f} s: {problem}"))
            time.sleep(0.05)

    def _not_ready(self) -> str | None:
        running = [s for s in self.sentinels if s.running]
        announced = set()
        for sentinel in running:
            try:
                with sentinel.admin() as client:
                    master = client.sentinel_master(self.service)
                    seen = client.sentinel_slaves(self.service)
                    peers = client.sentinel_sentinels(self.service)
            except redis.exceptions.RedisError as exc:
                return f"Sentinel {sentinel.port}: {exc!r}"
            if _down(master) or "failover_in_progress" in str(master.get("flags")):
                return f"Sentinel {sentinel.port} sees the primary as {master.get('flags')}"
            announced.add((master["ip"], int(master["port"])))
            known = {int(r["port"]) for r in seen if not _down(r)}
            if len([p for p in peers if not _down(p)]) < len(running) - 1:
                return f"Sentinel {sentinel.port} knows {len(peers)} other Sentinel(s)"
        if len(announced) != 1:
            return f"the Sentinels announce different primaries: {announced}"
        address = announced.pop()
        try:
            primary = self.server_at(address)
            if self.role(primary) != "master":
                return f"{address} is announced but is not a primary yet"
        except (redis.exceptions.RedisError, LookupError) as exc:
            return f"announced primary {address}: {exc!r}"
        # A server that was just started may still drop connections (loading, syncing):
        # that is "not ready yet", asked again, not a failure.
        try:
            with _admin(address[1]) as client:
                info = client.info("replication")
        except redis.exceptions.RedisError as exc:
            return f"primary {address}: {exc!r}"
        # Online on the primary's side too: after a full sync a replica counts for WAIT
        # only once the primary has its first REPLCONF ACK (up to a second later).
        online = {
            int(v["port"]) for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        }  # fmt: skip
        for server in self.servers:
            if server is primary or not server.running:
                continue
            try:
                with _admin(server.port or 0) as client:
                    info = client.info("replication")
            except redis.exceptions.RedisError as exc:
                return f"replica {server.port}: {exc!r}"
            if info.get("master_port") != address[1] or info.get("master_link_status") != "up":
                return f"replica {server.port} is not in sync with {address}: {info}"
            if server.port not in online:
                return f"the primary does not count replica {server.port} as online yet"
            if server.port not in known:
                return f"a Sentinel does not list replica {server.port} yet"
        return None

    def wait_for_primary(self, other_than: Address, timeout: float = 30.0) -> float:
        """Wait until every running Sentinel announces a primary other than
        `other_than`, and that server says it is a primary; return the seconds
        waited (RuntimeError after `timeout`)."""
        began = time.monotonic()
        deadline = began + timeout
        while True:
            addresses = set()
            for sentinel in self.sentinels:
                if not sentinel.running:
                    continue
                try:
                    addresses.add(self._announced_by(sentinel))
                except (redis.exceptions.RedisError, TypeError):
                    addresses.add(None)  # type: ignore[arg-type]
            if len(addresses) == 1:
                (address,) = addresses
                if address is not None and address != tuple(other_than):
                    try:
                        if self.role(self.server_at(address)) == "master":
                            return time.monotonic() - began
                    except (redis.exceptions.RedisError, LookupError):
                        pass
            if time.monotonic() > deadline:
                what = f"no new primary within {timeout:.1f} s (announced: {addresses})"
                raise RuntimeError(self._failure(what))
            time.sleep(0.02)

    def failover(self, timeout: float = 30.0, *, demote: bool = True) -> Address:
        """`SENTINEL FAILOVER`: the replica is promoted; return the new primary's
        address once every Sentinel announces it.

        Sentinel itself demotes a healthy old primary only when it next polls it (INFO,
        every 10 s); until then the old primary still accepts writes from clients
        connected to it, and loses them when it resyncs. With `demote` (the default)
        this helper demotes it at once (`REPLICAOF` the new primary, as Sentinel will),
        so a test need not wait; `demote=False` leaves it to Sentinel
        (`wait_demoted()` waits for that).
        """
        old = self.primary_address()
        sentinel = next(s for s in self.sentinels if s.running)
        with sentinel.admin() as client:
            client.sentinel_failover(self.service)
        self.wait_for_primary(old, timeout)
        new = self.primary_address()
        if demote:
            with _admin(old[1]) as client:
                client.replicaof(*new)
        return new

    def wait_demoted(self, address: Address, timeout: float = 30.0) -> float:
        """Wait until the data server at `address` is a replica; return the seconds."""
        began = time.monotonic()
        server = self.server_at(address)
        while self._role_or_none(server) != "slave":
            if time.monotonic() - began > timeout:
                raise RuntimeError(self._failure(f"{address} still a primary after {timeout} s"))
            time.sleep(0.05)
        return time.monotonic() - began

    def kill_primary(self) -> RedisServer:
        """SIGKILL the announced primary by its PID (no shutdown, nothing flushed);
        return that server, now stopped."""
        server = self.primary()
        process = server.process
        if process is None or server.pid is None:
            raise RuntimeError(f"the primary {server!r} is not running")
        os.kill(server.pid, signal.SIGKILL)
        process.wait()
        server.stop()  # forget the dead process (a no-op for it)
        return server

    def revive(self, server: RedisServer, timeout: float = 20.0) -> None:
        """Start a stopped data server again, empty, as a replica of the announced
        primary (what Sentinel would make of it), and wait until the set is ready."""
        primary = self.primary_address()
        args = list(server.args)
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        server.args = (*args, "--replicaof", primary[0], str(primary[1]))
        server.start()
        self.wait_ready(timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """Undo what tests do: replication enabled again, every stopped data server
        revived as a replica; return once the set is ready."""
        with _admin(self.primary().port or 0) as client:
            client.acl_setuser(REPL_USER, enabled=True)
        for server in self.servers:
            if not server.running:
                self.revive(server, timeout)
        self.wait_ready(timeout)

    def cut_replication(self, timeout: float = 10.0) -> None:
        """Stop replication while clients and Sentinels still reach the primary: the
        replication user is disabled and its connection killed, so the replica cannot
        resync. Returns once the replica reports its link down."""
        with _admin(self.primary().port or 0) as client:
            client.acl_setuser(REPL_USER, enabled=False)
            client.execute_command("CLIENT", "KILL", "USER", REPL_USER)
        self._wait_link("down", timeout)

    def restore_replication(self, timeout: float = 10.0) -> None:
        """Enable the replication user again; return once the replica's link is up."""
        with _admin(self.primary().port or 0) as client:
            client.acl_setuser(REPL_USER, enabled=True)
        self._wait_link("up", timeout)

    def _wait_link(self, status: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        replica = self.replica()
        while True:
            with _admin(replica.port or 0) as client:
                info = client.info("replication")
            if info.get("master_link_status") == status:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"replica link not {status}: {info}"))
            time.sleep(0.02)

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Wait until the replica has applied every write the primary has made."""
        deadline = time.monotonic() + timeout
        primary, replica = self.primary(), self.replica()
        while True:
            with _admin(primary.port or 0) as p, _admin(replica.port or 0) as r:
                wanted = int(p.info("replication")["master_repl_offset"])
                info = r.info("replication")
            if info.get("master_link_status") == "up" and int(info["slave_repl_offset"]) >= wanted:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"replica behind offset {wanted}: {info}"))
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop every process this object started, by PID (Sentinels first, so that
        none reacts to the data servers going away)."""
        for process in (*self.sentinels, *self.servers):
            process.stop()

    def close(self) -> None:
        """Stop everything and remove the working directory if this object made it."""
        self.stop()
        self.servers, self.sentinels = [], []
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def detach(self) -> None:
        """Leave the processes running when this object goes away or Python exits (for
        `make sentinel-up`; `make sentinel-down` stops them later by PID)."""
        for process in (*self.servers, *self.sentinels):
            process._finalizer.detach()
            process._box[0] = None
        self._own_workdir = False

    def __repr__(self) -> str:
        running = sum(p.running for p in (*self.servers, *self.sentinels))
        total = len(self.servers) + len(self.sentinels)
        return f"LocalSentinel(service={self.service!r}, {running}/{total} running)"

    def _failure(self, what: str) -> str:
        logs = "\n".join(
            f"--- 127.0.0.1:{p.port}:\n{p._log_tail(6)}" for p in (*self.servers, *self.sentinels)
        )
        return f"local Sentinel set: {what}\n{logs}"


def _down(state: dict[str, Any]) -> bool:
    """True when Sentinel flags an instance as down or unreachable."""
    flags = str(state.get("flags", ""))
    return any(f in flags.split(",") for f in ("s_down", "o_down", "disconnected"))


# Command line ----------------------------------------------------------------------


def _remove_files(directory: Path) -> None:
    """Remove what `up` wrote: state, logs, snapshots and the Sentinels' configs."""
    patterns = ("sentinel.conf", "redis-*.log", "dump.rdb", "temp-*.rdb")
    recorded.remove_files(directory, patterns, subdirs="sentinel-*")


def up(directory: Path) -> dict[str, Any]:
    """Start a set that outlives this process (a no-op if the recorded one runs)."""
    state = recorded.running(directory, WHAT)
    if state is not None:
        return state
    if recorded.read_state(directory) is not None:
        down(directory, quiet=True)  # a stale or half-dead one: clear it first
    _remove_files(directory)  # an old Sentinel config would carry an old topology
    replicated = LocalSentinel(directory)
    replicated.start()
    replicated.detach()
    state = {
        "url": replicated.url,
        "service": replicated.service,
        "primary": list(replicated.primary_address()),
        "ports": replicated.ports,
        "pids": replicated.pids,
        "workdir": str(directory.resolve()),
        "start_seconds": round(replicated.start_seconds or 0.0, 3),
    }
    recorded.record(directory, state, WHAT, "sentinel-down")
    return state


def down(directory: Path, *, quiet: bool = False) -> list[int]:
    """Stop exactly the recorded PIDs and remove what `up` wrote (a no-op if none)."""
    # Sentinels first (they are recorded last), so that none starts a failover.
    return recorded.down(directory, WHAT, _remove_files, quiet=quiet, last_first=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ratelimit.devtools.sentinel",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state, configs and logs")
    args = parser.parse_args(argv)
    if args.command == "up":
        up(args.dir)
    else:
        down(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

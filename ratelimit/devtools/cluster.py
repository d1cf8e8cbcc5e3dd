"""A throw-away Redis Cluster on loopback: N masters (and replicas) started, joined
with `redis-cli --cluster create`, and stopped by PID.

    from ratelimit.devtools.cluster import LocalCluster

    with LocalCluster() as cluster:               # 3 masters, no replicas
        client = ratelimit.connect(cluster.url)   # redis+cluster://127.0.0.1:p1,...
        ...
        cluster.restart_node(0)                   # same port, nodes.conf kept: it rejoins

    with LocalCluster(replicas=1) as cluster:     # 3 masters, each with one replica
        old = cluster.slot_owner(slot_of("k"))    # the master serving key "k"
        new = cluster.failover("k")               # CLUSTER FAILOVER on its replica; waits
        cluster.kill_node(new)                    # SIGKILL; the old master, now its
        cluster.wait_serving("k", old)            # replica, takes over by itself
        cluster.start_node(new)                   # rejoins as a replica, resyncs

Every node is a `redis-server --cluster-enabled yes` on a free port, with a cluster bus
port of its own (`--cluster-port`, also free; the default port + 10000 may not be), no
snapshots and no append-only file. Cluster mode still needs one file per node, its
`nodes-<port>.conf`, kept in the working directory so that a restarted node rejoins
with its identity and its slots (its data is gone: nothing else is persisted).

A replica gets its data by a full sync from its master, without the 5 s that Redis
waits by default for more replicas to join a diskless sync; each node names its own
`dump-<port>.rdb` for the copy a replica receives, since they share one directory and
two replicas syncing at once must not load each other's file. `start()` returns once
every replica is attached, done syncing and listed online by its master.

`--cluster-require-full-coverage no`: while one master is down, the shards that are
up keep answering for their own slots (with the default, the whole cluster would
refuse every command once the down master is flagged FAIL).

From the command line (`make cluster-up` / `make cluster-down`):

    python -m ratelimit.devtools.cluster up   [--dir build/cluster] [--masters 3] [--replicas 0]
    python -m ratelimit.devtools.cluster down [--dir build/cluster]
    python -m ratelimit.devtools.cluster failover (--key KEY | --slot N) [--force] [--dir ...]

`up` leaves the cluster running and records its URL, ports and PIDs (replicas'
included, and which master each replica follows) in `<dir>/state.json`; `down` stops
exactly those PIDs and removes `<dir>`. Both are idempotent. `failover` promotes the
replica of the master that serves a key (or slot) of that cluster, as
`LocalCluster.failover` does, and returns once every node agrees.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from . import recorded
from .process import Managed, free_port
from .server import EXECUTABLE, RedisServer

__all__ = ["CLI", "LocalCluster", "NodeServer", "main", "slot_of"]

CLI = "redis-cli"
SLOTS = 16384
DEFAULT_DIR = Path("build/cluster")
WHAT = "local Redis Cluster"


def slot_of(key: str | bytes) -> int:
    """The hash slot of `key` (hash tags included), as every cluster node computes it."""
    if isinstance(key, str):
        key = key.encode("utf-8", "surrogatepass")
    if not isinstance(key, bytes):
        raise ValueError(f"key must be str or bytes, got {type(key).__name__}")
    return key_slot(key)


class NodeServer(RedisServer):
    """One redis-server in cluster mode; its nodes.conf lives in the shared workdir."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        node_timeout_ms: int = 1000,
        args: Sequence[str] = (),
        executable: str = EXECUTABLE,
    ) -> None:
        super().__init__(workdir, args=tuple(args), executable=executable)
        self.node_timeout_ms = node_timeout_ms
        self.bus_port = 0
        self._bus_for: int | None = None  # the port the bus port was picked for

    @property
    def config_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"nodes-{self.port}.conf"

    def _options(self) -> list[str]:
        # A new port (first start, or the first pick was taken) gets a new bus port;
        # a restart keeps both, as the other nodes know the node by them.
        if self._bus_for != self.port:
            self.bus_port = free_port()
            while self.bus_port == self.port:
                self.bus_port = free_port()
            self._bus_for = self.port
        cluster = {
            "cluster-enabled": "yes",
            "cluster-port": str(self.bus_port),
            "cluster-config-file": self.config_file.name,  # relative to --dir
            "cluster-node-timeout": str(self.node_timeout_ms),
            "cluster-require-full-coverage": "no",
            # Replication (see the module doc): sync at once, one RDB file per node.
            "repl-diskless-sync-delay": "0",
            "dbfilename": f"dump-{self.port}.rdb",
        }
        extra = [part for name, value in cluster.items() for part in (f"--{name}", value)]
        return super()._options() + extra

    def admin(self, timeout: float = 1.0) -> redis.Redis:
        """A plain client for this one node (cluster commands, SCRIPT FLUSH, SCAN...)."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout,
            socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )  # fmt: skip

    def kill(self) -> None:
        """End the process abruptly (SIGKILL, by PID), like a crashed host: no
        goodbye to the cluster; its nodes.conf stays for a restart."""
        process, self.process = self.process, None
        self._box[0] = None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


class LocalCluster(Managed):
    """`masters` masters with `replicas` replicas each, on free loopback ports.

    - `workdir`: holds every node's log and nodes.conf; by default a temporary
      directory of its own, removed by `close()` (and on leaving a `with` block).
    - `node_timeout_ms`: `cluster-node-timeout`; small, so that a node that is down is
      flagged within about a second and a restarted one rejoins as fast (and, with
      replicas, a replica of a master that is down takes over within a few seconds).
    - `replicas`: replicas per master (default 0). Which node follows which master is
      `redis-cli`'s choice: ask `replicas_of(index)` / `master_of(index)`.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        masters: int = 3,
        replicas: int = 0,
        node_timeout_ms: int = 1000,
        executable: str = EXECUTABLE,
        cli: str = CLI,
    ) -> None:
        if not isinstance(masters, int) or masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, got {masters!r}")
        if not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be an int >= 0, got {replicas!r}")
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.executable = executable
        self.cli = cli
        self.nodes: list[NodeServer] = []
        self.start_seconds: float | None = None  # how long the last `start()` took

    # Queries -----------------------------------------------------------------------

    @staticmethod
    def available(executable: str = EXECUTABLE, cli: str = CLI) -> bool:
        """True when both `redis-server` and `redis-cli` are on PATH."""
        return shutil.which(executable) is not None and shutil.which(cli) is not None

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes if node.port is not None]

    @property
    def pids(self) -> list[int | None]:
        return [node.pid for node in self.nodes]

    @property
    def url(self) -> str:
        """`redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,...` (every node a seed)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def info(self, index: int) -> dict[str, Any]:
        """`CLUSTER INFO` of one node, as a dict."""
        with self.nodes[index].admin() as client:
            return client.cluster("INFO")

    def master_of(self, index: int) -> int | None:
        """Index in `nodes` of the master that node `index` replicates (None for a
        master), as the node itself says (`INFO replication`)."""
        with self.nodes[index].admin() as client:
            info = client.info("replication")
        if info.get("role") != "slave":
            return None
        return self.ports.index(int(info["master_port"]))

    def replicas_of(self, index: int) -> list[int]:
        """Indexes in `nodes` of the running replicas of master `index`."""
        return [
            i for i, node in enumerate(self.nodes)
            if i != index and node.running and self.master_of(i) == index
        ]  # fmt: skip

    def slot_owner(self, slot: int) -> int:
        """Index in `nodes` of the master that serves `slot` (asked of a live node)."""
        for node in self.nodes:
            if not node.running:
                continue
            with node.admin() as client:
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                    if int(start) <= slot <= int(end):
                        return self.ports.index(int(master[1]))
        raise LookupError(f"no live node knows who serves slot {slot}")

    # Life cycle --------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Start every node, join them into one cluster, and wait until it is ok."""
        if self.nodes:
            return self
        if not self.available(self.executable, self.cli):
            raise FileNotFoundError(f"{self.executable} and {self.cli} must be on PATH")
        began = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="ratelimit-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                node = NodeServer(
                    self.workdir, node_timeout_ms=self.node_timeout_ms,
                    executable=self.executable,
                )  # fmt: skip
                self.nodes.append(node)
                node.start()
            self._create(timeout)
            self.wait_ready(timeout - (time.monotonic() - began))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _create(self, timeout: float) -> None:
        argv = [
            self.cli, "--cluster", "create",
            *(f"127.0.0.1:{port}" for port in self.ports),
            "--cluster-replicas", str(self.replicas), "--cluster-yes",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(self._failure(f"redis-cli --cluster create hung ({exc})")) from None
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise RuntimeError(self._failure(f"redis-cli --cluster create failed:\n{tail}"))

    def wait_ready(self, timeout: float = 15.0) -> float:
        """Wait until every running node says `cluster_state:ok` with all slots
        covered and served, all of them agree on which master serves which slot, and
        every running replica is attached to its master, done syncing, and listed
        online by that master (with every node up, every master that serves slots
        has `replicas` of them); return the seconds waited. RuntimeError (with the
        nodes' states and log tails) when that does not happen within `timeout`."""
        began = time.monotonic()
        deadline = began + max(timeout, 0.0)
        while True:
            states = self._states()
            if all(state == "ok" for state in states.values()):
                return time.monotonic() - began
            if time.monotonic() > deadline:
                what = f"cluster not ok within {timeout:.1f} s: {states}"
                raise RuntimeError(self._failure(what))
            time.sleep(0.05)

    def _states(self) -> dict[int, str]:
        states: dict[int, str] = {}
        views: dict[int, tuple[tuple[int, int, int], ...]] = {}
        replication: dict[int, dict[str, Any]] = {}
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.admin() as client:
                    info = client.cluster("INFO")
                    views[node.port] = _slot_map(client)
                    replication[node.port] = client.info("replication")
            except redis.exceptions.RedisError as exc:
                states[node.port] = f"{type(exc).__name__}: {exc}"
                continue
            covered = int(info.get("cluster_slots_ok", 0)) == SLOTS
            known = int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            ok = info.get("cluster_state") == "ok" and covered and known
            states[node.port] = "ok" if ok else (
                f"{info.get('cluster_state')}, slots ok {info.get('cluster_slots_ok')}, "
                f"known nodes {info.get('cluster_known_nodes')}"
            )  # fmt: skip
        if len(set(views.values())) > 1:  # a failover some nodes have not heard of yet
            for port in views:
                if states[port] == "ok":
                    states[port] = "slot map differs from another node's"
        serving = {port for view in views.values() for _, _, port in view}
        problems = _replication_problems(replication, serving, self._all_running(), self.replicas)
        for port, what in problems:
            if states.get(port) == "ok":
                states[port] = what
        return states

    def _all_running(self) -> bool:
        return all(node.running for node in self.nodes)

    def stop_node(self, index: int) -> None:
        """Stop one node by its PID (SIGTERM); its nodes.conf stays for a restart."""
        self.nodes[index].stop()

    def start_node(self, index: int, *, wait: float | None = 15.0) -> None:
        """Start a stopped node again on its port; it reads its nodes.conf and rejoins.
        With `wait`, also wait (at most that many seconds) until the cluster is ok."""
        self.nodes[index].start()
        if wait is not None:
            self.wait_ready(wait)

    def restart_node(self, index: int, *, down_for: float = 0.0, wait: float | None = 15.0) -> None:
        """Stop one node, keep it down for `down_for` seconds, start it again."""
        self.stop_node(index)
        if down_for > 0:
            time.sleep(down_for)
        self.start_node(index, wait=wait)

    def kill_node(self, index: int) -> None:
        """End one node with SIGKILL (by PID), like a crash; its nodes.conf stays. With
        replicas, one of its replicas takes over once the others flag it FAIL."""
        self.nodes[index].kill()

    def failover(self, target: int | str | bytes, *, force: bool = False,
                 timeout: float = 15.0) -> int:  # fmt: skip
        """Promote the replica of the master that serves `target` (a slot, or a key
        whose slot counts) with `CLUSTER FAILOVER` sent to that replica, and wait
        until every running node agrees that it serves the slot; return its index.

        Without `force` the handover is coordinated: the master stops taking writes
        until the replica has caught up with its stream, so no acknowledged write is
        lost. `force=True` (`CLUSTER FAILOVER FORCE`) does not ask the master, for one
        that is down or stuck. RuntimeError when nothing changed within `timeout`.
        """
        slot = _slot(target)
        began = time.monotonic()
        master = self.slot_owner(slot)
        replicas = self.replicas_of(master)
        if not replicas:
            raise RuntimeError(f"master {master} (port {self.ports[master]}) has no replica")
        replica = replicas[0]
        with self.nodes[replica].admin() as client:
            client.execute_command("CLUSTER FAILOVER", *(["FORCE"] if force else []))
        self.wait_serving(slot, replica, timeout - (time.monotonic() - began))
        return replica

    def wait_serving(self, target: int | str | bytes, index: int, timeout: float = 15.0) -> float:
        """Wait until node `index` is a master and every running node says it serves
        `target` (a slot, or a key); return the seconds waited. RuntimeError (with the
        nodes' views and log tails) when that does not happen within `timeout`."""
        slot = _slot(target)
        port = self.ports[index]
        began = time.monotonic()
        deadline = began + max(timeout, 0.0)
        while True:
            views = self._serving(slot)
            if views and all(owner == port for owner in views.values()):
                return time.monotonic() - began
            if time.monotonic() > deadline:
                what = f"node {index} (port {port}) not serving slot {slot} within {timeout:.1f} s"
                raise RuntimeError(self._failure(f"{what}; who serves it, by node: {views}"))
            time.sleep(0.02)

    def _serving(self, slot: int) -> dict[int, int | str]:
        """Port of the master that serves `slot`, in each running node's view."""
        views: dict[int, int | str] = {}
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.admin() as client:
                    owner: int | str = "nobody"
                    for start, end, port in _slot_map(client):
                        if start <= slot <= end:
                            owner = port
                    if owner == node.port and client.info("replication")["role"] != "master":
                        owner = "itself, but not yet a master"
            except redis.exceptions.RedisError as exc:
                owner = f"{type(exc).__name__}: {exc}"
            views[node.port] = owner
        return views

    def stop(self) -> None:
        """Stop every node this object started, by PID."""
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        """Stop every node and remove the working directory if this object made it."""
        self.stop()
        self.nodes = []
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def detach(self) -> None:
        """Leave the nodes running when this object goes away or Python exits (for
        `make cluster-up`; `recorded.stop_pids` or `make cluster-down` ends them later)."""
        for node in self.nodes:
            # LocalProcess stops its child when collected or at exit; disarm that.
            node._finalizer.detach()
            node._box[0] = None
        self._own_workdir = False

    def __repr__(self) -> str:
        running = sum(node.running for node in self.nodes)
        return f"LocalCluster(ports={self.ports}, {running}/{len(self.nodes)} running)"

    # Diagnostics -------------------------------------------------------------------

    def _failure(self, what: str) -> str:
        logs = "\n".join(
            f"--- {node.executable} on 127.0.0.1:{node.port}:\n{node._log_tail(8)}"
            for node in self.nodes
        )
        return f"local Redis Cluster: {what}\n{logs}"


def _slot(target: int | str | bytes) -> int:
    if isinstance(target, bool) or not isinstance(target, int | str | bytes):
        raise ValueError(f"target must be a slot (int) or a key, got {target!r}")
    if isinstance(target, int):
        if not 0 <= target < SLOTS:
            raise ValueError(f"target slot must be in 0..{SLOTS - 1}, got {target}")
        return target
    return slot_of(target)


def _slot_map(client: redis.Redis) -> tuple[tuple[int, int, int], ...]:
    """(first slot, last slot, master port) of each range, as one node sees them."""
    ranges = client.execute_command("CLUSTER SLOTS")
    return tuple(sorted((int(a), int(b), int(master[1])) for a, b, master, *_ in ranges))


def _replication_problems(
    replication: dict[int, dict[str, Any]], serving: set[int], all_running: bool, per_master: int
) -> list[tuple[int, str]]:
    """(port, what is wrong) for each replica not yet attached, synced and online in
    its master's list; with every node up, also each master that serves no slots
    (a restarted one that has not yet learnt it was replaced) or has not
    `per_master` replicas online."""
    problems = []
    online: dict[int, set[int]] = {}
    for port, info in replication.items():
        if info.get("role") == "master":
            online[port] = {
                int(value["port"]) for name, value in info.items()
                if name.startswith("slave") and isinstance(value, dict)
                and value.get("state") == "online"
            }  # fmt: skip
    for port, info in replication.items():
        if info.get("role") != "slave":
            continue
        master = int(info.get("master_port", 0))
        if info.get("master_link_status") != "up" or int(info.get("master_sync_in_progress", 1)):
            problems.append((port, f"replica of {master}: link {info.get('master_link_status')}"))
        elif port not in online.get(master, set()):
            problems.append((port, f"replica of {master}: not online in its master's list"))
    if all_running:
        for port, replicas in online.items():
            if port not in serving:
                problems.append((port, "a master that serves no slots"))
            elif len(replicas) != per_master:
                problems.append((port, f"master with {len(replicas)} of {per_master} replicas"))
    return problems


# Stopping by PID, also from another process (make cluster-down) -------------------


def _remove_files(directory: Path) -> None:
    """Remove what `up` wrote (state, nodes.conf files, logs, snapshots)."""
    recorded.remove_files(directory, ("nodes-*.conf", "redis-*.log", "dump-*.rdb"))


# Command line ----------------------------------------------------------------------


def up(directory: Path, masters: int = 3, replicas: int = 0) -> dict[str, Any]:
    """Start a cluster that outlives this process (a no-op if the recorded one runs)."""
    state = recorded.running(directory, WHAT)
    if state is not None:
        return state
    if recorded.read_state(directory) is not None:
        down(directory, quiet=True)  # a stale or half-dead one: clear it first
    _remove_files(directory)  # an old nodes.conf on a reused port would confuse a node
    cluster = LocalCluster(directory, masters=masters, replicas=replicas)
    cluster.start()
    cluster.detach()
    state = {
        "url": cluster.url,
        "ports": cluster.ports,
        "pids": cluster.pids,
        # port of each replica -> port of its master, as started (a failover changes it)
        "replicas": {
            str(cluster.ports[i]): cluster.ports[master]
            for i in range(len(cluster.nodes))
            if (master := cluster.master_of(i)) is not None
        },
        "workdir": str(directory.resolve()),
        "start_seconds": round(cluster.start_seconds or 0.0, 3),
    }
    recorded.record(directory, state, WHAT, "cluster-down")
    for replica, master in state["replicas"].items():
        print(f"127.0.0.1:{replica} replicates 127.0.0.1:{master}")
    return state


def down(directory: Path, *, quiet: bool = False) -> list[int]:
    """Stop exactly the recorded PIDs and remove the directory (a no-op if none)."""
    return recorded.down(directory, WHAT, _remove_files, quiet=quiet)


class _RecordedNode(NodeServer):
    """A node that `up` started in another process: running while its PID is."""

    def __init__(self, workdir: Path, port: int, pid: int) -> None:
        super().__init__(workdir)
        self.port, self._recorded_pid = port, pid

    @property
    def pid(self) -> int | None:
        return self._recorded_pid

    @property
    def running(self) -> bool:
        return recorded.is_our_server(self._recorded_pid, self.port or 0)


def failover(directory: Path, target: int | str, *, force: bool = False) -> int:
    """`LocalCluster.failover` on the cluster recorded in `directory`; the port of
    the promoted replica."""
    slot = _slot(target)
    state = recorded.read_state(directory)
    if state is None:
        raise SystemExit(f"no {WHAT} recorded in {directory / recorded.STATE_FILE}")
    cluster = LocalCluster(directory)  # never started here: nothing of it to stop
    cluster.nodes = [_RecordedNode(directory, port, pid) for pid, port in recorded.servers(state)]
    old = cluster.ports[cluster.slot_owner(slot)]
    new = cluster.ports[cluster.failover(slot, force=force)]
    print(f"127.0.0.1:{new} now serves slot {slot} (was 127.0.0.1:{old})")
    return new


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ratelimit.devtools.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "failover"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state and node files")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--key", help="failover: the key whose master is replaced")
    which.add_argument("--slot", type=int, help="failover: the slot whose master is replaced")
    parser.add_argument("--force", action="store_true", help="failover: CLUSTER FAILOVER FORCE")
    args = parser.parse_args(argv)
    if args.command == "up":
        up(args.dir, args.masters, args.replicas)
    elif args.command == "down":
        down(args.dir)
    else:
        if args.key is None and args.slot is None:
            parser.error("failover needs --key or --slot")
        try:
            failover(args.dir, args.key if args.key is not None else args.slot, force=args.force)
        except ValueError as exc:
            parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())

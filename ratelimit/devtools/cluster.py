"""A throw-away Redis Cluster on loopback: N masters (and replicas) started, joined
with `redis-cli --cluster create`, and stopped by PID.

    from ratelimit.devtools.cluster import LocalCluster

    with LocalCluster() as cluster:               # 3 masters, no replicas
        client = ratelimit.connect(cluster.url)   # redis+cluster://127.0.0.1:p1,...
        ...
        cluster.restart_node(0)                   # same port, nodes.conf kept: it rejoins

Every node is a `redis-server --cluster-enabled yes` on a free port, with a cluster bus
port of its own (`--cluster-port`, also free; the default port + 10000 may not be), no
snapshots and no append-only file. Cluster mode still needs one file per node, its
`nodes-<port>.conf`, kept in the working directory so that a restarted node rejoins
with its identity and its slots (its data is gone: nothing else is persisted).

`--cluster-require-full-coverage no`: while one master is down, the shards that are
up keep answering for their own slots (with the default, the whole cluster would
refuse every command once the down master is flagged FAIL).

From the command line (`make cluster-up` / `make cluster-down`):

    python -m ratelimit.devtools.cluster up   [--dir build/cluster] [--masters 3] [--replicas 0]
    python -m ratelimit.devtools.cluster down [--dir build/cluster]

`up` leaves the cluster running and records its URL, ports and PIDs in
`<dir>/state.json`; `down` stops exactly those PIDs and removes `<dir>`. Both are
idempotent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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
from redis.retry import Retry

from .process import Managed, free_port
from .server import EXECUTABLE, RedisServer

__all__ = ["CLI", "LocalCluster", "NodeServer", "main"]

CLI = "redis-cli"
SLOTS = 16384
DEFAULT_DIR = Path("build/cluster")
STATE_FILE = "state.json"


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


class LocalCluster(Managed):
    """`masters` masters with `replicas` replicas each, on free loopback ports.

    - `workdir`: holds every node's log and nodes.conf; by default a temporary
      directory of its own, removed by `close()` (and on leaving a `with` block).
    - `node_timeout_ms`: `cluster-node-timeout`; small, so that a node that is down is
      flagged within about a second and a restarted one rejoins as fast.
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
        covered and served; return the seconds waited. RuntimeError (with the nodes'
        states and log tails) when that does not happen within `timeout`."""
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
        states = {}
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.admin() as client:
                    info = client.cluster("INFO")
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
        return states

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
        `make cluster-up`; `stop_pids` or `make cluster-down` ends them later)."""
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


# Stopping by PID, also from another process (make cluster-down) -------------------


def is_our_server(pid: int, port: int) -> bool:
    """True while `pid` runs and is a redis-server on `port` (not a reused PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    # redis-server renames its process to "redis-server 127.0.0.1:<port> [cluster]".
    return "redis-server" in cmdline and f":{port}" in cmdline


def stop_pids(servers: Sequence[tuple[int, int]], timeout: float = 10.0) -> list[int]:
    """SIGTERM each (pid, port) that is still our redis-server, then SIGKILL what is
    left after `timeout`; return the PIDs that were signalled."""
    signalled = [(pid, port) for pid, port in servers if is_our_server(pid, port)]
    for pid, _ in signalled:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid, port in signalled:
        while is_our_server(pid, port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_our_server(pid, port):
            os.kill(pid, signal.SIGKILL)
    return [pid for pid, _ in signalled]


def _remove_files(directory: Path) -> None:
    """Remove what `up` wrote (state, nodes.conf files, logs), then the directory if
    empty: never anything else, whatever `--dir` points at."""
    for pattern in (STATE_FILE, "nodes-*.conf", "redis-*.log"):
        for path in directory.glob(pattern):
            path.unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass


# Command line ----------------------------------------------------------------------


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _servers(state: dict[str, Any]) -> list[tuple[int, int]]:
    return [(int(pid), int(port)) for pid, port in zip(state["pids"], state["ports"], strict=True)]


def up(directory: Path, masters: int = 3, replicas: int = 0) -> dict[str, Any]:
    """Start a cluster that outlives this process (a no-op if the recorded one runs)."""
    state = _read_state(directory)
    if state is not None:
        if all(is_our_server(pid, port) for pid, port in _servers(state)):
            print(f"local Redis Cluster already running: {state['url']}")
            return state
        down(directory, quiet=True)  # a stale or half-dead one: clear it first
    _remove_files(directory)  # an old nodes.conf on a reused port would confuse a node
    cluster = LocalCluster(directory, masters=masters, replicas=replicas)
    cluster.start()
    cluster.detach()
    state = {
        "url": cluster.url,
        "ports": cluster.ports,
        "pids": cluster.pids,
        "workdir": str(directory.resolve()),
        "start_seconds": round(cluster.start_seconds or 0.0, 3),
    }
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    print(f"local Redis Cluster up in {state['start_seconds']:.1f} s: {state['url']}")
    print(f"PIDs {state['pids']} (ports {state['ports']}) recorded in {directory / STATE_FILE}")
    print(f"use it: REDIS_URL={state['url']}; stop it: make cluster-down")
    return state


def down(directory: Path, *, quiet: bool = False) -> list[int]:
    """Stop exactly the recorded PIDs and remove the directory (a no-op if none)."""
    state = _read_state(directory)
    if state is None:
        if directory.exists() and (directory / STATE_FILE).exists():
            raise SystemExit(f"unreadable state file {directory / STATE_FILE}; remove it by hand")
        if not quiet:
            print(f"no local Redis Cluster recorded in {directory / STATE_FILE}")
        return []
    stopped = stop_pids(_servers(state))
    _remove_files(directory)
    if not quiet:
        print(f"local Redis Cluster stopped (PIDs {stopped}); removed {directory}")
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ratelimit.devtools.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state and node files")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "up":
        up(args.dir, args.masters, args.replicas)
    else:
        down(args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Servers that outlive the process that started them (`make cluster-up`, `make
sentinel-up`): a state file in their directory records their PIDs and ports, and
`down` stops exactly those processes, never a PID the system has since given to
another program.

`cluster.py` and `sentinel.py` build their `up` / `down` commands on these.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


def is_our_server(pid: int, port: int) -> bool:
    """True while `pid` runs and is a redis-server on `port` (not a reused PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    # redis-server renames its process to "redis-server 127.0.0.1:<port> [cluster]"
    # (a Sentinel to "redis-server 127.0.0.1:<port> [sentinel]").
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


def read_state(directory: Path) -> dict[str, Any] | None:
    """The recorded state in `directory`, or None when there is none or it is unreadable."""
    try:
        return json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def servers(state: dict[str, Any]) -> list[tuple[int, int]]:
    """The recorded (pid, port) pairs, in the order they were started."""
    return [(int(pid), int(port)) for pid, port in zip(state["pids"], state["ports"], strict=True)]


def running(directory: Path, what: str) -> dict[str, Any] | None:
    """The recorded state when every recorded server still runs (and says so), else
    None; what a dead or half-dead record left behind is for the caller's `down`."""
    state = read_state(directory)
    if state is not None and all(is_our_server(pid, port) for pid, port in servers(state)):
        print(f"{what} already running: {state['url']}")
        return state
    return None


def record(directory: Path, state: dict[str, Any], what: str, target: str) -> None:
    """Write `state` (with `url`, `pids`, `ports` and `start_seconds`) and say how to
    use and stop what it records."""
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    print(f"{what} up in {state['start_seconds']:.1f} s: {state['url']}")
    print(f"PIDs {state['pids']} (ports {state['ports']}) recorded in {directory / STATE_FILE}")
    print(f"use it: REDIS_URL={state['url']}; stop it: make {target}")


def remove_files(directory: Path, patterns: Sequence[str], subdirs: str | None = None) -> None:
    """Remove the state file and the files matching `patterns` (also inside the
    directories matching `subdirs`, which are removed when empty), then `directory`
    if empty: never anything else, whatever `--dir` points at."""
    folders = sorted(p for p in directory.glob(subdirs) if p.is_dir()) if subdirs else []
    for folder in [*folders, directory]:
        for pattern in (STATE_FILE, *patterns):
            for path in folder.glob(pattern):
                path.unlink(missing_ok=True)
    for folder in [*folders, directory]:
        try:
            folder.rmdir()
        except OSError:
            pass


def down(
    directory: Path,
    what: str,
    remove: Callable[[Path], None],
    *,
    quiet: bool = False,
    last_first: bool = False,
) -> list[int]:
    """Stop exactly the recorded PIDs (`last_first`: in the reverse order of their
    start) and `remove` what `up` wrote; a no-op when nothing is recorded."""
    state = read_state(directory)
    if state is None:
        if (directory / STATE_FILE).exists():
            raise SystemExit(f"unreadable state file {directory / STATE_FILE}; remove it by hand")
        if not quiet:
            print(f"no {what} recorded in {directory / STATE_FILE}")
        return []
    recorded = servers(state)
    stopped = stop_pids(recorded[::-1] if last_first else recorded)
    remove(directory)
    if not quiet:
        print(f"{what} stopped (PIDs {stopped}); removed {directory}")
    return stopped

"""`make cluster-up` / `cluster-down` (`python -m ratelimit.devtools.cluster`): a local
Redis Cluster that stays up, recorded by PID, and stopped by exactly those PIDs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ratelimit
import ratelimit.sync
from ratelimit.devtools.cluster import is_our_server


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratelimit.devtools.cluster", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cluster_up_and_down_by_pid(cluster, tmp_path: Path):
    """`up` leaves a working cluster behind and records its PIDs; a second `up` keeps
    it; `down` stops exactly those PIDs and removes the state; a second `down` is a
    no-op. (The session's `cluster` fixture only makes this skip, or fail under CI,
    without redis-server and redis-cli.)"""
    workdir = tmp_path / "cli"
    first = run_cli("up", "--dir", str(workdir))
    assert first.returncode == 0, first.stderr
    state = json.loads((workdir / "state.json").read_text())
    servers = list(zip(state["pids"], state["ports"], strict=True))
    try:
        assert state["url"] in first.stdout
        assert len(servers) == 3 and all(is_our_server(pid, port) for pid, port in servers)
        with ratelimit.connect_sync(state["url"]) as client:
            limiter = ratelimit.sync.SlidingWindowLimiter(client, 60, 2)
            assert [limiter.check("dave").allowed for _ in range(3)] == [True, True, False]

        again = run_cli("up", "--dir", str(workdir))
        assert again.returncode == 0 and "already running" in again.stdout
        assert json.loads((workdir / "state.json").read_text())["pids"] == state["pids"]
    finally:
        stopped = run_cli("down", "--dir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert not any(is_our_server(pid, port) for pid, port in servers)
    assert not workdir.exists()
    twice = run_cli("down", "--dir", str(workdir))
    assert twice.returncode == 0 and "no local Redis Cluster" in twice.stdout

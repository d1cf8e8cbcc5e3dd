"""`make cluster-up` / `cluster-down` (`python -m ratelimit.devtools.cluster`): a local
Redis Cluster that stays up, recorded by PID, and stopped by exactly those PIDs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit.devtools.cluster import LocalCluster, slot_of
from ratelimit.devtools.recorded import is_our_server
from tests.conftest import _missing


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


def test_cluster_up_with_replicas(tmp_path: Path):
    """`up --replicas 1`: 3 masters and 3 replicas, every replica attached and in sync
    when `up` returns, all six PIDs recorded (and which master each replica follows);
    `failover --key` promotes the replica of the key's master, which has the key's
    budget; `down` stops all six."""
    if not LocalCluster.available():
        _missing("redis-server and redis-cli are needed for the Redis Cluster tests")
    workdir = tmp_path / "replicated"
    first = run_cli("up", "--dir", str(workdir), "--replicas", "1")
    state = json.loads((workdir / "state.json").read_text()) if first.returncode == 0 else {}
    servers = list(zip(state.get("pids", []), state.get("ports", []), strict=True))
    try:
        assert first.returncode == 0, first.stderr
        assert len(servers) == 6 and all(is_our_server(pid, port) for pid, port in servers)
        replicas = {int(r): m for r, m in state["replicas"].items()}
        masters = set(state["ports"]) - set(replicas)
        assert len(replicas) == 3 and set(replicas.values()) == masters
        for replica, master in replicas.items():
            assert f"127.0.0.1:{replica} replicates 127.0.0.1:{master}" in first.stdout
            with redis.Redis(port=replica, socket_timeout=2) as client:
                info = client.info("replication")
            assert info["role"] == "slave" and info["master_port"] == master
            assert info["master_link_status"] == "up" and info["master_sync_in_progress"] == 0
        with ratelimit.connect_sync(state["url"]) as client:
            limiter = ratelimit.sync.SlidingWindowLimiter(client, 60, 2)
            assert [limiter.check("dave").allowed for _ in range(3)] == [True, True, False]
            key = limiter.key_for("dave")
            old = client.get_node_from_key(key).port
            moved = run_cli("failover", "--dir", str(workdir), "--key", key)
            assert moved.returncode == 0, moved.stderr
            (new,) = [replica for replica, master in replicas.items() if master == old]
            assert f"127.0.0.1:{new} now serves slot {slot_of(key)}" in moved.stdout
            with redis.Redis(port=new, socket_timeout=2) as node:
                assert node.info("replication")["role"] == "master"
            assert not limiter.check("dave").allowed  # the budget moved with the slot
    finally:
        stopped = run_cli("down", "--dir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert not any(is_our_server(pid, port) for pid, port in servers)
    assert not workdir.exists()
    unrecorded = run_cli("failover", "--dir", str(workdir), "--slot", "1")
    assert unrecorded.returncode != 0 and "no local Redis Cluster" in unrecorded.stderr


def test_failover_command_needs_a_key_or_a_slot(tmp_path: Path):
    for argv in (["failover"], ["failover", "--slot", "16384"], ["failover", "--slot", "x"]):
        done = run_cli(*argv, "--dir", str(tmp_path / "none"))
        assert done.returncode == 2 and "error:" in done.stderr, argv


def test_slot_of_agrees_with_redis_cluster_hashing():
    """Hash tags count, str and bytes agree (the slot of "foo" is in Redis's docs)."""
    assert slot_of("foo") == slot_of(b"foo") == 12182
    assert slot_of("{user1000}.following") == slot_of("{user1000}.followers")
    with pytest.raises(ValueError, match="key"):
        slot_of(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("target", "message"),
    [(-1, "0..16383"), (16384, "0..16383"), (True, "target"), (1.5, "target"), (None, "target")],
)
def test_failover_refuses_a_bad_target_before_anything(target, message):
    with pytest.raises(ValueError, match=message):
        LocalCluster(replicas=1).failover(target)
    with pytest.raises(ValueError, match=message):
        LocalCluster(replicas=1).wait_serving(target, 0)

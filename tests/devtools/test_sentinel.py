"""`ratelimit.devtools.sentinel`: a local primary, replica and three Sentinels, and
`make sentinel-up` / `sentinel-down` (`python -m ratelimit.devtools.sentinel`), which
leave one running, recorded by PID, and stop exactly those PIDs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit.devtools.recorded import is_our_server
from ratelimit.devtools.sentinel import LocalSentinel
from tests.conftest import _missing


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratelimit.devtools.sentinel", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def needs_redis() -> None:
    if not LocalSentinel.available():
        _missing("redis-server is needed for the Sentinel tests")


def test_bad_options_are_value_errors():
    with pytest.raises(ValueError, match="quorum"):
        LocalSentinel(sentinels=3, quorum=4)
    with pytest.raises(ValueError, match="sentinels"):
        LocalSentinel(sentinels=0)
    with pytest.raises(ValueError, match="service"):
        LocalSentinel(service="a/b")


def test_local_set_roles_failover_and_stop(needs_redis, tmp_path: Path):
    """The Sentinels agree on the primary, which replicates to the replica; a
    SENTINEL FAILOVER swaps the roles; every process stops by PID at the end."""
    with LocalSentinel(tmp_path / "set") as local:
        assert local.url.startswith("redis+sentinel://127.0.0.1:")
        assert local.url.endswith(f"/{local.service}") and local.url.count(",") == 2
        first = local.primary()
        assert local.role(first) == "master" and local.role(local.replica()) == "slave"
        with first.client() as client:
            client.set("k", "v")
        local.wait_replicated()
        with local.replica().client() as client:
            assert client.get("k") == b"v"

        new = local.failover()
        assert new != ("127.0.0.1", first.port) and local.primary() is not first
        assert local.role(first) == "slave"
        local.wait_ready()
        pids = [pid for pid in local.pids if pid is not None]
        ports = local.ports
        assert len(pids) == 5
    assert not any(is_our_server(pid, port) for pid, port in zip(pids, ports, strict=True))


def test_sentinel_up_and_down_by_pid(needs_redis, tmp_path: Path):
    """`up` leaves a working set behind and records its PIDs; a second `up` keeps it;
    `down` stops exactly those PIDs and removes what `up` wrote; a second `down` is a
    no-op."""
    workdir = tmp_path / "cli"
    first = run_cli("up", "--dir", str(workdir))
    state = json.loads((workdir / "state.json").read_text()) if first.returncode == 0 else {}
    processes = list(zip(state.get("pids", []), state.get("ports", []), strict=True))
    try:
        assert first.returncode == 0, first.stderr
        assert state["url"] in first.stdout and state["url"].startswith("redis+sentinel://")
        assert len(processes) == 5 and all(is_our_server(pid, port) for pid, port in processes)
        with ratelimit.connect_sync(state["url"]) as client:
            limiter = ratelimit.sync.SlidingWindowLimiter(client, 60, 2)
            assert [limiter.check("dave").allowed for _ in range(3)] == [True, True, False]
        with redis.Redis(port=state["primary"][1], socket_timeout=2) as primary:
            assert primary.info("replication")["connected_slaves"] == 1

        again = run_cli("up", "--dir", str(workdir))
        assert again.returncode == 0 and "already running" in again.stdout
        assert json.loads((workdir / "state.json").read_text())["pids"] == state["pids"]
    finally:
        stopped = run_cli("down", "--dir", str(workdir))
    assert stopped.returncode == 0, stopped.stderr
    assert not any(is_our_server(pid, port) for pid, port in processes)
    assert not workdir.exists()
    twice = run_cli("down", "--dir", str(workdir))
    assert twice.returncode == 0 and "no local Sentinel set" in twice.stdout

"""`ratelimit.doctor` and `python -m ratelimit doctor`, on private servers configured
with the settings it warns about (and on a safe one, where it warns about nothing)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import ratelimit
from ratelimit import doctor
from ratelimit.__main__ import main
from ratelimit.devtools.process import free_port
from ratelimit.devtools.server import RedisServer
from tests.conftest import _missing

pytestmark = pytest.mark.private_redis

# `ratelimit.doctor` is the function (exported by the package), so the module is
# reached through sys.modules.
doctor_module = sys.modules["ratelimit.doctor"]

SAFE = ("--maxmemory", "64mb", "--maxmemory-policy", "noeviction", "--appendonly", "yes")


@pytest.fixture
def servers(tmp_path) -> Iterator[Callable[..., RedisServer]]:
    """Starts private redis-servers with extra options; stops them all afterwards."""
    if not RedisServer.available():
        _missing("redis-server is not installed; the doctor's tests need it")
    started: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        server = RedisServer(tmp_path / f"server-{len(started)}", args=args)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.close()


def levels(report: doctor_module.Report, topic: str) -> set[str]:
    return {f.level for f in report.about(topic)}


def text(report: doctor_module.Report, topic: str) -> str:
    return " | ".join(f.message for f in report.about(topic))


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratelimit", "doctor", *argv],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_safe_server_gets_no_warning(servers):
    """noeviction with a maxmemory, an append-only file, a primary, clocks in step,
    every script loads: every finding is ok, for a URL and for a client alike."""
    server = servers(*SAFE)
    report = doctor(server.url)
    assert report.level == "ok" and report.exit_code == 0, str(report)
    topics = {f.topic for f in report.findings}
    assert {"connection", "version", "memory", "persistence", "replication", "clock",
            "scripts"} <= topics  # fmt: skip
    assert "7." in text(report, "version")
    assert "noeviction" in text(report, "memory") and "append-only" in text(report, "persistence")
    with server.client() as client:
        again = doctor(client)
        assert [f.level for f in again.findings] == [f.level for f in report.findings]
        assert client.ping()  # the caller's client is left open
        # The doctor wrote no key (SCRIPT LOAD changes no data).
        assert client.dbsize() == 0


@pytest.mark.parametrize(
    ("args", "topic", "level", "says"),
    [
        (("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"), "memory", "warn",
         "evicts any key"),
        (("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lfu"), "memory", "warn",
         "allkeys-lfu"),
        (("--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"), "memory", "warn",
         "carries a TTL"),
        (("--maxmemory", "64mb", "--maxmemory-policy", "volatile-ttl"), "memory", "warn",
         "volatile-ttl"),
        (("--appendonly", "no"), "persistence", "warn", "forgets every limit"),
        (("--min-replicas-to-write", "1"), "replication", "error", "NOREPLICAS"),
    ],
    ids=["allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl", "no-persistence",
         "min-replicas-unmet"],
)  # fmt: skip
def test_each_risky_setting_is_reported(servers, args, topic, level, says):
    """A server that is safe but for one setting: that setting's finding has the level,
    and says why; every other topic stays ok."""
    safe = dict(zip(SAFE[::2], SAFE[1::2], strict=True))
    safe.update(dict(zip(args[::2], args[1::2], strict=True)))
    server = servers(*(part for pair in safe.items() for part in pair))
    report = doctor(server.url)
    assert level in levels(report, topic), str(report)
    assert says in text(report, topic), str(report)
    assert report.exit_code == (1 if level == "warn" else 2)
    others = [f for f in report.findings if f.topic != topic]
    assert all(f.level == "ok" for f in others), str(report)


def test_a_nearly_full_redis_is_reported(servers):
    """noeviction is the safe policy, but 90 % or more of maxmemory in use is a warning."""
    server = servers(*SAFE)
    with server.client() as client:
        used = client.info("memory")["used_memory"]
        client.config_set("maxmemory", int(used / 0.95))
    report = doctor(server.url)
    assert levels(report, "memory") == {"ok", "warn"}, str(report)
    assert "near full" in text(report, "memory")


def _wait_for_replica(primary: RedisServer, count: int, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    with primary.client() as client:
        while client.info("replication")["connected_slaves"] < count:
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.05)


def test_replication_is_reported(servers):
    """A primary with a replica and min-replicas-to-write 0 warns (a failover can lose
    admits); with min-replicas-to-write 1 it is ok; the replica itself is an error
    (it refuses the scripts), and so is asking for more replicas than are connected."""
    primary = servers(*SAFE)
    replica = servers(*SAFE, "--replicaof", "127.0.0.1", str(primary.port))
    _wait_for_replica(primary, 1)

    report = doctor(primary.url)
    assert levels(report, "replication") == {"warn"}, str(report)
    assert "1 replicas" in text(report, "replication")
    assert "failover can lose" in text(report, "replication")

    with primary.client() as client:
        client.config_set("min-replicas-to-write", 1)
    assert levels(doctor(primary.url), "replication") == {"ok"}

    with primary.client() as client:
        client.config_set("min-replicas-to-write", 2)
    report = doctor(primary.url)
    assert levels(report, "replication") == {"error"} and report.exit_code == 2
    assert "NOREPLICAS" in text(report, "replication")

    report = doctor(replica.url)
    assert levels(report, "replication") == {"error"}, str(report)
    assert f"replica of 127.0.0.1:{primary.port}" in text(report, "replication")


def test_the_clock_offset_is_measured_and_reported(servers, monkeypatch):
    """The offset between this host's clock and Redis's TIME: ok here (one machine),
    a warning once this host's clock runs 300 ms ahead (bounded by the round trip)."""
    server = servers(*SAFE)
    report = doctor(server.url)
    assert levels(report, "clock") == {"ok"}
    real = time.time
    monkeypatch.setattr(doctor_module, "_wall", lambda: real() + 0.3)
    report = doctor(server.url)
    assert levels(report, "clock") == {"warn"}, str(report)
    message = text(report, "clock")
    assert "ahead of" in message
    offset = float(message.split("clock is ")[1].split(" ms")[0])
    assert 290 <= offset <= 310, message
    # A threshold above the offset makes it ok again.
    assert levels(doctor(server.url, clock_threshold_ms=400), "clock") == {"ok"}


def test_an_old_redis_is_an_error(servers):
    """Redis before 7.0 cannot run a script with a shebang: an error. (The version is
    the one INFO reports; a client that reports 6.2 stands in for an old server.)"""
    server = servers(*SAFE)

    class OldRedis(redis.Redis):
        def info(self, *args: Any, **kwargs: Any) -> Any:
            found = super().info(*args, **kwargs)
            found["redis_version"] = "6.2.14"
            return found

    with OldRedis.from_url(server.url) as client:
        report = doctor(client)
    assert levels(report, "version") == {"error"}
    assert "6.2.14" in text(report, "version") and "7.0" in text(report, "version")


def _user(server: RedisServer, name: str, rule: str) -> str:
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">secret", "~*", *rule.split())
    return f"redis://{name}:secret@127.0.0.1:{server.port}/0"


def test_a_user_without_config_gets_a_finding_not_an_error(servers):
    """A user who may not run CONFIG GET: a "could not read the configuration" warning
    that names the permission; memory and persistence come from INFO instead."""
    server = servers(*SAFE)
    url = _user(server, "noconfig", "+@all -config")
    report = doctor(url)
    assert levels(report, "config") == {"warn"}, str(report)
    said = text(report, "config")
    assert "could not read the configuration" in said and "config|get" in said, said
    assert "noeviction" in text(report, "memory")  # from INFO memory
    assert "append-only" in text(report, "persistence")  # from INFO persistence
    assert levels(report, "scripts") == {"ok"}
    assert "secret" not in str(report)  # the URL is shown without its password


def test_a_user_who_may_run_almost_nothing_gets_findings(servers):
    """A user allowed only EVALSHA: every reading says what it could not read and why;
    the scripts that cannot be loaded are an error naming SCRIPT LOAD."""
    server = servers(*SAFE)
    url = _user(server, "bare", "+evalsha")
    report = doctor(url)
    assert report.exit_code == 2, str(report)
    assert levels(report, "scripts") == {"error"}
    assert "script|load" in text(report, "scripts")
    for topic in ("info", "config", "clock"):
        assert levels(report, topic) == {"warn"}, (topic, str(report))
        assert "no permission" in text(report, topic), (topic, str(report))
    assert report.reachable


def test_a_cluster_is_examined_node_by_node(cluster):
    """A redis+cluster:// URL: the cluster's state, and every primary's findings
    labelled with its address; a plain URL to one node is an error (MOVED)."""
    report = doctor(cluster.url)
    assert levels(report, "cluster") == {"ok"}, str(report)
    assert "cluster_state ok" in text(report, "cluster")
    nodes = {f.node for f in report.about("scripts")}
    assert len(nodes) == 3 and levels(report, "scripts") == {"ok"}, str(report)
    assert all(f.node in nodes for f in report.about("memory"))

    one_node = f"redis://127.0.0.1:{cluster.ports[0]}/0"
    report = doctor(one_node)
    assert levels(report, "cluster") == {"error"}
    assert "redis+cluster://" in text(report, "cluster")


def test_the_embedded_backend_gets_a_report(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    report = doctor()
    assert report.target == "embedded fakeredis"
    assert levels(report, "backend") == {"warn"} and "embedded" in text(report, "backend")
    assert levels(report, "scripts") == {"ok"}
    assert doctor(ratelimit.connect_sync(embedded=True)).exit_code == 1


def test_no_redis_named_and_no_fakeredis_is_one_error(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "")
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # `import fakeredis` fails
    report = doctor()
    assert not report.reachable and report.exit_code == 2
    assert "REDIS_URL" in str(report) and "ratelimit-lab[embedded]" in str(report)


def test_an_unreachable_server_is_one_error():
    report = doctor(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)
    assert not report.reachable and report.exit_code == 2
    assert len(report.findings) == 1 and "could not reach" in str(report)
    assert "\n" not in str(report)


def test_a_refused_login_is_one_error(servers):
    server = servers(*SAFE)
    report = doctor(f"redis://nobody:wrong@127.0.0.1:{server.port}/0")
    assert report.exit_code == 2 and not report.reachable
    assert "refused the login" in str(report) and "wrong" not in str(report)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="client_or_url"):
        doctor(redis.asyncio.Redis())
    with pytest.raises(ValueError, match="client_or_url"):
        doctor(42)
    with pytest.raises(ValueError, match="clock_threshold_ms"):
        doctor(None, clock_threshold_ms=0)


# The command line ---------------------------------------------------------------------


def test_cli_exit_codes_and_output(servers, capsys):
    """0 when all is ok, 1 with a warning, 2 with an error; one line per finding."""
    safe = servers(*SAFE)
    assert main(["doctor", safe.url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ratelimit doctor: {safe.url}\n")
    assert "warn" not in out and out.rstrip().endswith("overall: ok (7 ok)")

    risky = servers("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    assert main(["doctor", risky.url]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.split()[:2] == ["warn", "memory"] for line in lines), out
    assert any(line.split()[:2] == ["warn", "persistence"] for line in lines), out

    replica = servers(*SAFE, "--replicaof", "127.0.0.1", str(safe.port))
    assert main(["doctor", replica.url]) == 2
    assert "error  replication" in capsys.readouterr().out


def test_python_dash_m_doctor_unreachable_exits_2_with_one_line():
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = run_cli(url, "--timeout", "0.5")
    assert done.returncode == 2
    assert done.stdout.strip().startswith(f"could not reach Redis at {url}")
    assert len(done.stdout.strip().splitlines()) == 1
    assert "Traceback" not in done.stdout + done.stderr

    cluster_url = f"redis+cluster://127.0.0.1:{free_port()}"
    done = run_cli(cluster_url, "--timeout", "0.5")
    assert done.returncode == 2, done
    assert len(done.stdout.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_python_dash_m_doctor_on_a_safe_server(servers):
    done = run_cli(servers(*SAFE).url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overall: ok" in done.stdout and done.stderr == ""

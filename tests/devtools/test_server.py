"""`ratelimit.devtools.server.RedisServer`: a private redis-server that starts, answers, restarts
empty, stops by PID (freeing its port) and cleans up after a `with` block."""

from __future__ import annotations

import os

import pytest
import redis

from ratelimit.devtools.process import pid_alive, port_is_free
from ratelimit.devtools.server import RedisServer, free_port

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture
def needs_redis_server() -> None:
    """Skips (fails with CI=true) when redis-server is not installed."""
    if RedisServer.available():
        return
    reason = "redis-server is not installed; the private-server tests need it"
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: it is required)")
    pytest.skip(reason)


# Every test starting a server; the two `offline` ones at the end need none.
server_test = pytest.mark.usefixtures("needs_redis_server")


@server_test
def test_start_answers_on_loopback(tmp_path):
    server = RedisServer(tmp_path)
    try:
        assert server.start() is server
        assert server.running and server.pid is not None
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = server.client(decode_responses=True)
        assert client.ping()
        assert client.config_get("save") == {"save": ""}  # nothing on disk
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
        assert client.info("server")["process_id"] == server.pid
        client.close()
        assert (tmp_path / f"redis-{server.port}.log").exists()
        server.start()  # already running: nothing happens
        assert server.running
    finally:
        server.stop()


@server_test
def test_restart_keeps_the_port_and_loses_the_data(tmp_path):
    server = RedisServer(tmp_path).start()
    try:
        port, pid = server.port, server.pid
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        client.close()
        server.restart()
        assert (server.port, server.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert server.pid != pid and not pid_alive(pid)
        client = redis.Redis.from_url(server.url)
        assert client.get("k") is None and client.dbsize() == 0
        client.close()
    finally:
        server.stop()


@server_test
def test_stop_ends_the_process_and_frees_the_port(tmp_path):
    server = RedisServer(tmp_path).start()
    port, pid = server.port, server.pid
    assert not port_is_free(port)
    server.stop()
    assert not server.running and server.pid is None
    assert not pid_alive(pid)
    assert port_is_free(port)
    client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    client.close()
    server.stop()  # twice is fine


@server_test
def test_context_manager_stops_it_and_removes_its_own_directory():
    with RedisServer() as server:
        port, pid, workdir = server.port, server.pid, server.workdir
        assert workdir is not None and workdir.is_dir()
        assert server.client().ping()
    assert not server.running and not pid_alive(pid)
    assert port_is_free(port)
    assert not workdir.exists()


@server_test
def test_context_manager_stops_it_when_the_block_fails(tmp_path):
    with pytest.raises(KeyError):
        with RedisServer(tmp_path) as server:
            pid = server.pid
            raise KeyError("boom")
    assert not server.running and not pid_alive(pid)
    assert tmp_path.exists()  # a directory given by the caller is left alone


@server_test
def test_a_given_port_is_used_and_a_taken_one_fails_clearly(tmp_path):
    port = free_port()
    with RedisServer(tmp_path, port) as server:
        assert server.port == port and server.client().ping()
        with pytest.raises(RuntimeError, match="exited at start"):
            RedisServer(tmp_path / "second", port).start()
        assert server.client().ping()  # the first one is untouched


@server_test
def test_an_automatic_port_that_is_taken_is_replaced(tmp_path):
    with RedisServer(tmp_path) as first:
        second = RedisServer(tmp_path / "second")
        second.port = first.port  # as if someone grabbed the picked port meanwhile
        with second:
            assert second.port != first.port and second.client().ping()


@server_test
def test_extra_arguments_reach_the_server(tmp_path):
    with RedisServer(tmp_path, args=("--zset-max-listpack-entries", "7")) as server:
        reply = server.client(decode_responses=True).config_get("zset-max-listpack-entries")
        assert reply == {"zset-max-listpack-entries": "7"}


@server_test
def test_a_server_that_cannot_start_says_why(tmp_path):
    server = RedisServer(tmp_path, args=("--no-such-option", "1"))
    with pytest.raises(RuntimeError, match=r"exited at start(.|\n)*no-such-option"):
        server.start()
    assert not server.running


def test_available_follows_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not RedisServer.available()
    with pytest.raises(FileNotFoundError, match="not on PATH"):
        RedisServer(tmp_path).start()
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert RedisServer.available()


def test_free_port_is_bindable():
    assert port_is_free(free_port())


@server_test
def test_a_paused_server_answers_nothing_until_thawed(tmp_path):
    with RedisServer(tmp_path) as server:
        client = server.client(socket_timeout=0.3)
        with server.paused():
            with pytest.raises(redis.exceptions.TimeoutError):
                client.ping()
        assert redis.Redis.from_url(server.url, socket_timeout=5).ping()
        client.close()
    with pytest.raises(RuntimeError, match="not running"):
        with server.paused():
            pass

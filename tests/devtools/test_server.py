"""`ratelimit.devtools.server.RedisServer`: a private redis-server that starts, answers, restarts
empty, stops by PID (freeing its port) and cleans up after a `with` block; with `tls=True`
it serves TLS only, with a CA and certificates it makes at every start."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
import redis

from ratelimit.devtools.process import pid_alive, port_is_free
from ratelimit.devtools.server import RedisServer, free_port, make_certificates

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


# TLS --------------------------------------------------------------------------------


@pytest.fixture
def needs_tls() -> None:
    """Skips (fails with CI=true) without redis-server and openssl."""
    if RedisServer.tls_available():
        return
    reason = "redis-server and openssl are needed for the TLS server tests"
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: they are required)")
    pytest.skip(reason)


tls_test = pytest.mark.usefixtures("needs_tls")


def _san(cert: Path) -> set[tuple[str, str]]:
    return set(ssl._ssl._test_decode_cert(str(cert))["subjectAltName"])  # type: ignore[attr-defined]


@tls_test
def test_tls_serves_only_tls_with_a_certificate_it_makes(tmp_path):
    with RedisServer(tmp_path, tls=True) as server:
        files = server.tls_files
        assert server.ca_path == files.ca_cert == tmp_path / "tls" / "ca.crt"
        assert server.url == (
            f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={tmp_path}/tls/ca.crt"
        )
        assert _san(files.server_cert) == {("IP Address", "127.0.0.1"), ("DNS", "localhost")}
        client = server.client(decode_responses=True)
        assert client.ping()
        assert client.config_get("port") == {"port": "0"}  # no plain-text port
        assert client.config_get("tls-port") == {"tls-port": str(server.port)}
        assert client.config_get("tls-auth-clients") == {"tls-auth-clients": "no"}
        assert client.info("server")["process_id"] == server.pid
        client.close()
        by_name = redis.Redis.from_url(server.url.replace("127.0.0.1", "localhost"))
        assert by_name.ping()  # the certificate names localhost too
        by_name.close()
        plain = redis.Redis.from_url(
            f"redis://127.0.0.1:{server.port}/0", socket_timeout=1, socket_connect_timeout=1
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            plain.ping()  # a plain-text client gets nothing
        plain.close()


@tls_test
def test_tls_clients_verify_the_ca_and_the_host_name(tmp_path):
    other = make_certificates(tmp_path / "other")  # a CA the server never used
    with RedisServer(tmp_path / "a", tls=True, tls_hosts=("localhost",)) as server:
        on_name = server.url.replace("127.0.0.1", "localhost")
        assert redis.Redis.from_url(on_name).ping()
        # 127.0.0.1 is not in this certificate: the host name check refuses it.
        with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            redis.Redis.from_url(server.url, socket_connect_timeout=2).ping()
        for ca in (other.ca_cert, None):  # another CA, or the system's store
            query = f"?ssl_ca_certs={ca}" if ca else ""
            client = redis.Redis.from_url(
                f"rediss://localhost:{server.port}/0{query}", socket_connect_timeout=2
            )
            with pytest.raises(redis.exceptions.ConnectionError, match="CERTIFICATE_VERIFY"):
                client.ping()
            client.close()


@tls_test
def test_tls_restart_makes_new_certificates_and_clients_reconnect(tmp_path):
    with RedisServer(tmp_path, tls=True) as server:
        client = server.client()
        client.set("k", "v")
        first_ca = server.ca_path.read_bytes()
        pid = server.pid
        server.restart()
        assert server.pid != pid and server.ca_path.read_bytes() != first_ca
        assert client.get("k") is None  # reconnected to the new, empty server
        client.close()


@tls_test
def test_tls_client_auth_requires_a_client_certificate(tmp_path):
    with RedisServer(tmp_path, tls=True, tls_client_auth=True) as server:
        assert "ssl_certfile=" in server.url and "ssl_keyfile=" in server.url
        assert server.client().ping()
        assert server.client().config_get("tls-auth-clients") == {"tls-auth-clients": "yes"}
        anonymous = redis.Redis.from_url(
            f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={server.ca_path}",
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            anonymous.ping()
        anonymous.close()


def test_tls_options_are_checked_offline(tmp_path):
    with pytest.raises(ValueError, match="tls_client_auth needs tls=True"):
        RedisServer(tmp_path, tls_client_auth=True)
    with pytest.raises(ValueError, match="tls and tls_client_auth"):
        RedisServer(tmp_path, tls="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tls_hosts"):
        RedisServer(tmp_path, tls=True, tls_hosts=())
    with pytest.raises(RuntimeError, match="without tls=True"):
        _ = RedisServer(tmp_path).tls_files
    with pytest.raises(RuntimeError, match="start the server first"):
        _ = RedisServer(tls=True).url
    assert RedisServer(tmp_path).url.startswith("redis://")  # unchanged without TLS


def test_tls_needs_openssl(monkeypatch, tmp_path):
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert RedisServer.available() and not RedisServer.tls_available()
    server = RedisServer(tmp_path / "w", tls=True)
    with pytest.raises(FileNotFoundError, match="openssl is not on PATH"):
        server.start()
    assert not server.running

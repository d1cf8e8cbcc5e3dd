"""`ratelimit.lab.backend.choose`: REDIS_URL, else a private server, else embedded."""

from __future__ import annotations

import pytest
import redis.exceptions

from ratelimit.devtools.process import pid_alive
from ratelimit.devtools.server import RedisServer
from ratelimit.lab import backend


def test_redis_url_wins_when_a_shared_server_is_allowed(monkeypatch, real_redis_url):
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    with backend.choose() as chosen:
        assert (chosen.kind, chosen.url, chosen.server, chosen.real) == (
            "url", real_redis_url, None, True
        )
        assert chosen.description == "the Redis at REDIS_URL"
        client = chosen.sync_client()
        assert client.ping()
        client.close()


def test_a_private_server_when_no_shared_one_may_be_used(monkeypatch, real_redis_url):
    if not RedisServer.available():
        pytest.skip("redis-server is not installed")
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    with backend.choose(shared=False, server_args=("--maxmemory", "5mb")) as chosen:
        assert chosen.kind == "private" and chosen.url != real_redis_url
        pid = chosen.server.pid
        client = chosen.sync_client()
        assert client.config_get("maxmemory")["maxmemory"] == str(5 * 2**20)
        client.close()
    assert not pid_alive(pid)  # stopped, by its PID, on leaving the block


async def test_the_embedded_backend_shares_its_data_between_clients(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with backend.choose(private=False) as chosen:
        assert (chosen.kind, chosen.real, chosen.url) == ("embedded", False, None)
        assert chosen.description == "the embedded fakeredis"
        chosen.sync_client().set("k", "v")
        assert await chosen.async_client().get("k") == b"v"
    with backend.choose(private=False) as other:
        assert other.sync_client().get("k") is None  # each backend has its own data


def test_a_backend_can_be_taken_down_and_brought_back(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    for private in (False, True):
        if private and not RedisServer.available():
            continue
        with backend.choose(private=private) as chosen:
            client = chosen.sync_client()
            chosen.set_down(True)
            with pytest.raises(redis.exceptions.ConnectionError):
                client.ping()
            chosen.set_down(False)
            assert client.ping()


def test_a_shared_redis_is_never_taken_down(monkeypatch, real_redis_url):
    monkeypatch.setenv("REDIS_URL", real_redis_url)
    with backend.choose() as shared, pytest.raises(ValueError, match="never stopped"):
        shared.set_down(True)

"""`connect`: REDIS_URL or an argument picks a real server; otherwise, fakeredis, said
once per process, or a clear error when fakeredis is not installed."""

from __future__ import annotations

import sys
import warnings

import pytest

import ratelimit
from ratelimit import backends

CONNECTS = [ratelimit.connect, ratelimit.connect_sync]


@pytest.fixture
def unannounced(monkeypatch):
    """A process that has not fallen back on the embedded Redis yet."""
    monkeypatch.setattr(backends, "_fallback_announced", False)


@pytest.mark.parametrize("connect", CONNECTS)
def test_embedded_unless_a_url_is_given(connect, monkeypatch, unannounced):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.warns(ratelimit.EmbeddedRedisWarning):
        assert ratelimit.is_embedded(connect())
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert not ratelimit.is_embedded(connect())
    assert ratelimit.is_embedded(connect(embedded=True))
    assert not ratelimit.is_embedded(connect("redis://127.0.0.1:1/0"))


@pytest.mark.parametrize("connect", CONNECTS)
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_redis_url_names_no_redis(connect, value, monkeypatch, unannounced):
    monkeypatch.setenv("REDIS_URL", value)
    with pytest.warns(ratelimit.EmbeddedRedisWarning):
        assert ratelimit.is_embedded(connect())
    assert backends.configured_url() is None


def test_the_fallback_is_announced_once_per_process(monkeypatch, unannounced):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ratelimit.connect()
        ratelimit.connect_sync()
        ratelimit.connect()
    [warning] = caught
    assert warning.category is ratelimit.EmbeddedRedisWarning
    message = str(warning.message)
    assert "embedded fakeredis" in message and "REDIS_URL" in message
    assert "Each process gets its own, empty Redis" in message
    assert warning.filename == __file__  # points at the caller, not the library


@pytest.mark.parametrize("connect", CONNECTS)
def test_asking_for_the_embedded_redis_is_not_warned_about(connect, monkeypatch, unannounced):
    monkeypatch.delenv("REDIS_URL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ratelimit.is_embedded(connect(embedded=True))
        assert ratelimit.is_embedded(connect(backends.configured_url(), embedded=True))
    assert backends._fallback_announced is False  # a later fallback is still announced


@pytest.mark.parametrize("connect", CONNECTS)
def test_without_fakeredis_no_redis_named_is_an_error(connect, monkeypatch, unannounced):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setitem(sys.modules, "fakeredis", None)  # `import fakeredis` fails
    with pytest.raises(RuntimeError, match="no Redis named") as err:
        connect()
    assert "REDIS_URL" in str(err.value) and "ratelimit-lab[embedded]" in str(err.value)
    with pytest.raises(RuntimeError, match=r"embedded=True needs .*ratelimit-lab\[embedded\]"):
        connect(embedded=True)
    assert not ratelimit.is_embedded(connect("redis://127.0.0.1:1/0"))  # a URL needs none


def test_urls_lose_their_password_in_logs():
    assert backends.redact_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert backends.redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert backends.redact_url("redis://h:1/0") == "redis://h:1/0"


def test_each_embedded_client_starts_empty():
    first, second = ratelimit.connect_sync(embedded=True), ratelimit.connect_sync(embedded=True)
    first.set("k", 1)
    assert second.get("k") is None

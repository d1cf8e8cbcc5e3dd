"""`connect`: REDIS_URL or an argument picks a real server; otherwise, fakeredis."""

from __future__ import annotations

import pytest

import ratelimit


@pytest.mark.parametrize("connect", [ratelimit.connect, ratelimit.connect_sync])
def test_embedded_unless_a_url_is_given(connect, monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert ratelimit.is_embedded(connect())
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert not ratelimit.is_embedded(connect())
    assert ratelimit.is_embedded(connect(embedded=True))
    assert not ratelimit.is_embedded(connect("redis://127.0.0.1:1/0"))


def test_each_embedded_client_starts_empty():
    first, second = ratelimit.connect_sync(embedded=True), ratelimit.connect_sync(embedded=True)
    first.set("k", 1)
    assert second.get("k") is None

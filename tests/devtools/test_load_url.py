"""The load tools say which Redis they load, and why that one."""

from __future__ import annotations

import pytest

from ratelimit.devtools.load import LOCAL_URL, load_url


@pytest.mark.parametrize(
    ("given", "env", "url", "why"),
    [
        ("redis://:pw@10.0.0.5:6380/1", "redis://elsewhere:6379/0", "redis://:pw@10.0.0.5:6380/1",
         "(--redis-url)"),
        (None, "redis://u:secret@cache:6379/0", "redis://u:secret@cache:6379/0", "(REDIS_URL)"),
        (None, "  ", LOCAL_URL, "neither --redis-url nor REDIS_URL"),
        (None, None, LOCAL_URL, "neither --redis-url nor REDIS_URL"),
    ],
)  # fmt: skip
def test_the_url_and_its_source_are_said(given, env, url, why, monkeypatch, capsys) -> None:
    if env is None:
        monkeypatch.delenv("REDIS_URL", raising=False)
    else:
        monkeypatch.setenv("REDIS_URL", env)
    assert load_url(given) == url
    said = capsys.readouterr().err
    assert said.startswith("load on the Redis at ") and why in said
    assert "pw@" not in said and "secret" not in said  # passwords are not printed

"""The seed's own verification, typed as the seed types it: after the twelve geofence
requests of API key "demo" against the demo server on a real Redis,
`redis-cli ZCARD "rl:geofence:key:demo"` answers 10 and `redis-cli PTTL` at most 1000;
and the README's two blocks for it (twelve in a row, fifty at once), run by bash as a
reader pastes them."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import redis

from ratelimit.devtools.demo_server import DemoServer

SEED_KEY = "rl:geofence:key:demo"
WITHIN = {"lng": 13.4, "lat": 52.5, "radius": 500}
# The seed reads the key right after its requests: within one window (1 s) of the last
# admit, or the key has expired. A round slower than that on a busy machine says
# nothing about the keys and is run again, up to ROUNDS in all.
ROUNDS = 10
T = TypeVar("T")
README = Path(__file__).resolve().parents[2] / "README.md"


def in_time(attempt: Callable[[], tuple[T, float]], within: float) -> T:
    """What the first of `ROUNDS` attempts returns that took under `within` seconds: a
    slower round (a busy machine) outlived the window and says nothing about the key."""
    for _ in range(ROUNDS):
        result, took = attempt()
        if took < within:
            return result
    pytest.fail(f"{ROUNDS} rounds each took over {within} s: the machine is too busy")


def redis_cli(*args: str) -> str:
    """What `redis-cli ARGS...` prints, on the default host and port, as the seed types it."""
    return subprocess.run(
        ["redis-cli", *args], capture_output=True, text=True, check=True, timeout=10
    ).stdout.strip()


@pytest.fixture
def default_redis(real_redis_url: str) -> redis.Redis:
    """The Redis that a bare `redis-cli` reaches (127.0.0.1:6379), as the seed assumes."""
    client = redis.Redis.from_url(real_redis_url)
    kwargs = client.connection_pool.connection_kwargs
    if (kwargs.get("host"), kwargs.get("port")) != ("127.0.0.1", 6379) or not shutil.which(
        "redis-cli"
    ):
        pytest.skip("the seed's commands need redis-cli and a Redis on 127.0.0.1:6379")
    return client


def test_the_seeds_verification_as_the_seed_types_it(default_redis):
    server = DemoServer(redis_url="redis://127.0.0.1:6379/0")
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=5) as c:
            c.get("/within", params=WITHIN, headers={"x-api-key": "warm-up"})

            def twelve() -> tuple[tuple[list[int], str, str], float]:
                default_redis.delete(SEED_KEY)
                start = time.monotonic()
                statuses = [
                    c.get("/within", params=WITHIN, headers={"x-api-key": "demo"}).status_code
                    for _ in range(12)
                ]
                zcard, pttl = redis_cli("ZCARD", SEED_KEY), redis_cli("PTTL", SEED_KEY)
                return (statuses, zcard, pttl), time.monotonic() - start

            statuses, zcard, pttl = in_time(twelve, within=1.0)
    finally:
        server.close()
        default_redis.close()
    assert statuses == [200] * 10 + [429] * 2
    assert zcard == "10"
    assert 0 < int(pttl) <= 1000


async def test_an_api_key_a_plain_key_cannot_hold_is_a_400_and_writes_nothing(client, prefix):
    from ratelimit.demo import create_app

    app = create_app(client, prefix=prefix)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://demo") as c:
        for bad in ["de mo", "a*b", "{x}", "q?", "back\\slash"]:
            r = await c.get("/within", params=WITHIN, headers={"x-api-key": bad})
            assert r.status_code == 400, (bad, r.text)
            assert "plain_keys" in r.json()["detail"]
        ok = await c.get("/within", params=WITHIN, headers={"x-api-key": "fine"})
    assert ok.status_code == 200
    written = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    assert written == [f"{prefix}:geofence:key:fine".encode()]


def readme_block(name: str) -> str:
    """The README's `sh` block after its `<!-- seed:NAME ... -->` marker."""
    found = re.search(rf"<!-- seed:{name} .*?-->\n```sh\n(.*?)```", README.read_text("utf-8"), re.S)
    assert found, f"README.md has no sh block marked seed:{name}"
    return found.group(1)


def paste(block: str, server: DemoServer, api_key: str) -> tuple[list[str], float]:
    """Run `block` in bash as pasted, against `server` and for `api_key` in place of
    the README's 127.0.0.1:8000 and "demo"; its output lines and how long it took."""
    assert "http://127.0.0.1:8000" in block and "x-api-key: demo" in block
    script = (
        block.replace("http://127.0.0.1:8000", server.url)
        .replace("x-api-key: demo", f"x-api-key: {api_key}")
        .replace('"rl:geofence:key:demo"', f'"rl:geofence:key:{api_key}"')
    )
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # nothing but the answers on the screen
    return done.stdout.splitlines(), took


def test_the_readmes_seed_blocks_as_pasted(default_redis):
    """Twelve in a row: ten 200s, two 429s, ZCARD 10, PTTL at most 1000. Fifty at once:
    the key holds exactly 10, at most ten 200s, every other answer a 429. A round slower
    than the window (a busy machine) says nothing about the key and is run again."""
    if not shutil.which("curl"):
        pytest.skip("the README's blocks need curl")
    api_key = "readme-seed"
    key = f"rl:geofence:key:{api_key}"
    server = DemoServer(redis_url="redis://127.0.0.1:6379/0")
    try:
        server.start()

        def pasted(name: str) -> Callable[[], tuple[list[str], float]]:
            def attempt() -> tuple[list[str], float]:
                default_redis.delete(key)
                return paste(readme_block(name), server, api_key)

            return attempt

        sequential = in_time(pasted("sequential"), within=1.0)
        # The block's own `sleep 1`, then one window.
        concurrent = in_time(pasted("concurrent"), within=2.0)
    finally:
        server.close()
        default_redis.close()
    statuses, zcard, pttl = sequential
    assert statuses.split() == ["200"] * 10 + ["429"] * 2
    assert zcard == "10" and 0 < int(pttl) <= 1000
    *tally_lines, zcard = concurrent
    tally = {code: int(n) for n, code in (line.split() for line in tally_lines)}
    assert zcard == "10", concurrent
    assert set(tally) <= {"200", "429"} and sum(tally.values()) == 50, tally
    assert 1 <= tally.get("200", 0) <= 10, tally

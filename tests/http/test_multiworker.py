"""The demo app as several uvicorn worker processes on one real Redis, under a bounded
load from `ratelimit.devtools.load` on loopback.

Every worker holds its own limiter and its own connections; only Redis is shared. The
promise: per API key, never more admits than the limit in any rolling window of
Redis's clock, and every request answered 200 or 429 with the right headers (no 5xx,
no degraded answer). How each admit's Redis time is known exactly: the app's limiter
reads the time from Redis (`clock="redis"`: the script calls TIME), and
`Decision.decided_at_ms` is the time the script recorded the admit at, which the
app sends back in `DECIDED_AT_HEADER` (`DemoServer(app_options={"trace_headers": True})`).
After the run, the key's sorted set in Redis is compared with those times: the entries
still in its window are exactly the last admits' headers, so the headers are the
scores Redis stored, not a copy of some other clock. No speed is asserted here
(`make bench` measures the latency).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import socket
import uuid
from collections import Counter, defaultdict

import httpx
import pytest
import redis

from ratelimit import keys
from ratelimit.devtools.demo_server import (
    DECIDED_AT_HEADER,
    WORKER_HEADER,
    DemoServer,
    _as_tcp,
)
from ratelimit.devtools.load import percentile, run_load
from ratelimit.devtools.process import pid_alive, port_is_free
from ratelimit.http import DEGRADED_HEADER, PROBLEM_JSON, QUOTA_EXCEEDED

WORKERS = 3
LIMIT = 5  # per window, per API key
WINDOW_S = 2
API_KEYS = 4
CONNECTIONS = 15  # kept open through the load, at least one on each worker
# Requests of load: 8x each key's limit, so that every key fills a window even when a busy
# machine serves them slowly (a run bounded by time once sent 88 in 3 s, 1.1x the limit).
TOTAL = API_KEYS * LIMIT * 8
SECONDS = 60.0  # at most, of load: a bound the run should never reach
PREFIX = "mw"
# Fresh connections tried, at most, until every worker holds one of the load's: which
# worker accepts a connection is the kernel's choice, and on a busy machine one worker
# may take them all for a while (every request of a run once went to one of three).
MAX_CONNECTS = 500
# uvicorn closes a keep-alive connection idle this long (default 5 s): longer than any
# connection waits between being kept and the load, so none is re-opened elsewhere.
KEEP_ALIVE_S = 300


def most_in_any_window(times_ms: list[int], window_ms: int) -> int:
    """The most times that fall in one window (T - window, T], over every T: the
    largest count is reached at some admit's own time, so only those are tried."""
    ordered = sorted(times_ms)
    return max(
        (
            bisect.bisect_right(ordered, t) - bisect.bisect_right(ordered, t - window_ms)
            for t in ordered
        ),
        default=0,
    )


def test_most_in_any_window_counts_half_open_windows() -> None:
    assert most_in_any_window([], 1000) == 0
    assert most_in_any_window([0, 999, 1000], 1000) == 2  # 0 left (1000 - 1000, 1000]
    assert most_in_any_window([5, 5, 5, 2000], 1000) == 3
    assert most_in_any_window([0, 500, 999, 1000, 1499], 1000) == 4  # (499, 1499]


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "3", 65])
def test_workers_must_be_a_small_positive_int(workers) -> None:
    with pytest.raises(ValueError, match="workers"):
        DemoServer(workers=workers)


def test_app_options_must_travel_as_json() -> None:
    with pytest.raises(ValueError, match="app_options"):
        DemoServer(app_options={"clock": object()})
    with pytest.raises(ValueError, match="app_options"):
        DemoServer(app_options=[("tiles_limit", 3)])  # type: ignore[arg-type]
    server = DemoServer(workers=3, app_options={"tiles_limit": 3})
    command = server.command(8123)
    assert "--factory" in command and command[command.index("--workers") + 1] == "3"
    assert "--workers" not in DemoServer().command(8123)


async def test_the_load_generator_must_be_bounded_and_sane() -> None:
    def plan(i: int) -> tuple[str, None]:
        return "/", None

    for bad in (
        {"connections": 0, "total": 1},
        {"connections": 2},  # no bound
        {"connections": 2, "total": 0},
        {"connections": 2, "duration_s": -1.0},
        {"connections": 2, "total": 5, "rate": 0},
        {"connections": True, "total": 5},
        {"connections": 2, "total": 5, "clients": [httpx.AsyncClient()]},  # one client
    ):
        with pytest.raises(ValueError, match="connections|total|duration_s|rate"):
            await run_load("http://127.0.0.1:9", plan, **bad)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0  # nearest rank
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
    assert percentile([5.0], 0) == 5.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


async def _nodelay_of_accepted(listener: socket.socket) -> int:
    """TCP_NODELAY on the connection asyncio accepts on `listener` (1 set, 0 not)."""
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname())
        try:
            return await asyncio.wait_for(accepted, 5)
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_the_launcher_marks_the_shared_socket_tcp_so_connections_get_nodelay() -> None:
    """Why `DemoServer(workers>1)` starts uvicorn through its own `main()`: a listener
    made as uvicorn's supervisor makes it (protocol 0) yields connections with Nagle on;
    the same socket marked IPPROTO_TCP (`_as_tcp`, same descriptor, same address) yields
    connections with TCP_NODELAY, as a single uvicorn process has."""
    assert await _nodelay_of_accepted(_listener()) == 0
    plain = _listener()
    fd, address = plain.fileno(), plain.getsockname()
    marked = _as_tcp(plain)
    assert marked.proto == socket.IPPROTO_TCP
    assert (marked.fileno(), marked.getsockname()) == (fd, address)
    assert await _nodelay_of_accepted(marked) == 1
    assert DemoServer(workers=2).command(8123)[2] == "ratelimit.devtools.demo_server"
    assert DemoServer(workers=2, tcp_nodelay=False).command(8123)[2] == "uvicorn"


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # as uvicorn binds it
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def _connections_on_every_worker(url: str, workers: list[int]) -> list[httpx.AsyncClient]:
    """CONNECTIONS open connections (a client of one connection each), at least one
    answered by each worker: fresh connections, at most MAX_CONNECTS, each kept if its
    worker has none yet or there is room for it beside those still missing, closed
    otherwise. Kept open, each connection stays with its worker through the load."""
    kept: dict[str, list[httpx.AsyncClient]] = {str(w): [] for w in workers}
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    tries, counts = 0, {}
    try:
        while (room := CONNECTIONS - sum(len(held) for held in kept.values())) > 0:
            assert tries < MAX_CONNECTS, f"{tries} connections, not one on each worker: {counts}"
            tries += 1
            client = httpx.AsyncClient(limits=one, timeout=10)
            try:
                worker = (await client.get(url + "/healthz")).headers[WORKER_HEADER.lower()]
            except BaseException:
                await client.aclose()
                raise
            if not kept[worker] or room > sum(not held for held in kept.values()):
                kept[worker].append(client)
            else:
                await client.aclose()
            counts = {w: len(held) for w, held in kept.items()}
    except BaseException:
        for held in kept.values():
            for client in held:
                await client.aclose()
        raise
    print(f"\nload connections per worker: {counts} after {tries} fresh connections")
    return [client for held in kept.values() for client in held]


async def test_workers_on_one_redis_never_admit_more_than_the_limit(private_redis) -> None:
    """3 uvicorn workers, 4 API keys at 8x their limit: 200 or 429 only,
    headers right, at most LIMIT admits per key in any WINDOW_S of Redis's clock."""
    options = {
        "clock": "redis",
        "tiles_limit": LIMIT,
        "window_s": WINDOW_S,
        "prefix": PREFIX,
        "trace_headers": True,
    }
    run_id = uuid.uuid4().hex[:8]
    api_keys = [f"mw-{run_id}-{k}" for k in range(API_KEYS)]

    def plan(i: int) -> tuple[str, str]:
        return f"/tiles/3/{i % 8}/{i // 8 % 8}.png", api_keys[i % API_KEYS]

    server = DemoServer(
        redis_url=private_redis.url,
        workers=WORKERS,
        app_options=options,
        args=["--timeout-keep-alive", str(KEEP_ALIVE_S)],
    )
    admin = redis.Redis.from_url(private_redis.url, decode_responses=False)
    connections: list[httpx.AsyncClient] = []
    try:
        server.start()
        workers = server.worker_pids()
        assert len(workers) == WORKERS and server.pid not in workers
        connections = await _connections_on_every_worker(server.url, workers)
        result = await run_load(
            server.url,
            plan,
            connections=CONNECTIONS,
            total=TOTAL,
            duration_s=SECONDS,
            keep_headers=True,
            keep_bodies=True,
            clients=connections,
        )
        # Read each key's log now: it expires WINDOW_S after its last admit.
        logs = {
            k: admin.zrange(
                keys.route_key(
                    k, scope="tiles", prefix=PREFIX, window_ms=WINDOW_S * 1000, plain=True
                ),
                0, -1, withscores=True,
            )
            for k in api_keys
        }
    finally:
        for connection in connections:
            await connection.aclose()
        admin.close()
        workers = server.worker_pids()
        pid, port = server.pid, server.port
        server.close()
    # Every process this test started is gone, the supervisor and each worker.
    assert pid is not None and not pid_alive(pid) and port is not None and port_is_free(port)
    assert workers and not any(pid_alive(w) for w in workers)

    outcomes = result.outcomes
    # Bounded by count: the requests sent are the whole plan, each once.
    assert [o.index for o in outcomes] == list(range(TOTAL))
    statuses = result.statuses()
    assert set(statuses) <= {200, 429}, statuses  # no 5xx, no transport error
    assert statuses.get(200, 0) > 0 and statuses.get(429, 0) > 0
    # Every worker decided some of the requests (each held a connection of the load):
    # the limit below is held by workers deciding side by side on one Redis.
    served_by = Counter(o.headers[WORKER_HEADER.lower()] for o in outcomes)
    assert set(served_by) == {str(w) for w in workers}, served_by

    admits: dict[str, list[int]] = defaultdict(list)
    policy = f'"tiles";q={LIMIT};w={WINDOW_S}'
    for o in outcomes:
        h = o.headers
        assert h["ratelimit-policy"] == policy and h["ratelimit-limit"] == str(LIMIT)
        assert DEGRADED_HEADER.lower() not in h  # Redis answered every check
        remaining = int(h["ratelimit-remaining"])
        assert 0 <= remaining < LIMIT
        if o.status == 200:
            assert h["content-type"] == "image/png" and o.body.startswith(b"\x89PNG")
            assert h["ratelimit"] == f'"tiles";r={remaining}'  # no t for the log's 200
            admits[o.api_key].append(int(h[DECIDED_AT_HEADER.lower()]))
        else:
            assert DECIDED_AT_HEADER.lower() not in h  # only admits carry a decision time
            retry = int(h["retry-after"])
            assert 1 <= retry <= WINDOW_S and remaining == 0
            assert h["ratelimit"] == f'"tiles";r=0;t={retry}'
            assert 1 <= int(h["retry-after-ms"]) <= WINDOW_S * 1000
            assert -(-int(h["retry-after-ms"]) // 1000) == retry
            assert h["content-type"] == PROBLEM_JSON
            problem = json.loads(o.body)
            assert problem["type"] == QUOTA_EXCEEDED and problem["status"] == 429
            assert problem["violated-policies"] == ["tiles"] and problem["retry-after"] == retry

    window_ms = WINDOW_S * 1000
    assert set(admits) == set(api_keys)  # every key was admitted, and rejected too:
    assert {o.api_key for o in outcomes if o.status == 429} == set(api_keys)
    for k, times in admits.items():
        # The promise, on Redis's clock: at most LIMIT admits in any rolling window...
        assert most_in_any_window(times, window_ms) <= LIMIT, k
        # ...and the load was enough to fill a window (else the check proves little).
        assert most_in_any_window(times, window_ms) == LIMIT, k
        # The headers are Redis's own record: the key's log holds exactly the admits
        # of the window that ended at its last admit (one member per admit, cost 1).
        last = max(times)
        in_log = sorted(int(score) for _, score in logs[k])
        assert in_log == sorted(t for t in times if t > last - window_ms), k
        assert re.fullmatch(r"\d{13}", str(last))  # ms since the epoch, as TIME gives

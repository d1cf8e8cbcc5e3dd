"""Throughput with 1, 10, 50 and 200 asyncio tasks sharing one client, on 10,000 keys.

Each task awaits its own checks one after another; the tasks run at once. Cases at
every number of tasks, all in the same interleaved rounds:

- PING and EVALSHA `return 1` (floors: one round trip per call);
- our `SlidingWindowLimiter` as built by default, auto-pipelined (the checks the tasks
  make in one turn of the event loop share one round trip), and with
  `auto_pipeline=False` (one EVALSHA round trip per check, as before);
- each peer of `peers.py` that runs here (`limits`, throttled-py), each on a client of
  its own, as in `checks.py`. The classic recipe is left out: it is a recipe written
  around our client, not a library, and `checks.py` already measures it.

At 1 task, ours and ours unpipelined are measured side by side, in alternating
chunks of 20 checks (`side_by_side`): the target between them is a ratio near 1, and
on a shared machine two measurements a second apart differ by more than that.

Every client gets a pool of at least as many connections as there are tasks: with
redis-py 8's default of 100, the cases that hold one connection per call in flight
would fail at 200 tasks ("Too many connections") instead of being measured.
Every figure has a ratio against PING at the same number of tasks, in the same
round; `targets()` judges ours against the best peer and against itself unpipelined.
"""

from __future__ import annotations

import os
import time
from typing import Any
from urllib.parse import quote

from ratelimit import SlidingWindowLimiter
from ratelimit.backends import is_embedded

from . import peers as peer_mod
from . import rounds
from .checks import LIMIT, Identities
from .cleanup import delete_prefix
from .verdicts import ratio_row, skip

TASKS = (1, 10, 50, 200)
PEER_TARGET = 2.0  # ours >= 2x the best peer at these numbers of tasks
PEER_TASKS = (50, 200)
LONE_TARGET = 0.97  # ours at 1 task >= 0.97x ours with auto_pipeline=False
SIDE_BY_SIDE_CHUNK = 20  # checks in a row of one of the two, at 1 task (see side_by_side)
OURS = "SlidingWindowLimiter 10k keys"  # the default limiter (auto-pipelined)
OURS_OFF = "SlidingWindowLimiter auto_pipeline=False"
FLOORS = ("PING", "EVALSHA return 1")
LEFT_OUT = {
    "classic recipe": "not compared here: a recipe written around our own client, not a "
    "library (checks.py measures it one check at a time)"
}


def name(case: str, tasks: int) -> str:
    return f"{case}, {tasks} tasks"


def peer_case(peer: str) -> str:
    return f"{peer} 10k keys"


PATIENCE_S = 60.0  # each limiter's timeout here (see make_cases)


def checks_per_round(n: int, tasks: int) -> int:
    """`n` checks, and at least n/100 per task: 200 tasks doing a handful of checks
    each would measure the start of 200 tasks more than the checks."""
    return max(n, tasks * max(1, n // 100))


def _at_least(case: rounds.AsyncCase, tasks: int) -> rounds.AsyncCase:
    async def sized(n: int) -> float:
        return await case(checks_per_round(n, tasks))

    return sized


def make_cases(
    client: Any, prefix: str, tasks: tuple[int, ...], peers: dict[str, peer_mod.Peer]
) -> dict[str, rounds.AsyncCase]:
    noop = client.register_script("return 1")
    # The peers wait for Redis as long as it takes, and a batch of 200 tasks' checks on a
    # busy machine can take more than a second: ours get the same patience, so that a
    # slow round is measured rather than ended by the failure policy.
    ours = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:log", timeout=PATIENCE_S)
    off = SlidingWindowLimiter(
        client, 1, LIMIT, prefix=f"{prefix}:log-off", auto_pipeline=False, timeout=PATIENCE_S
    )

    async def ping(i: int) -> Any:
        return await client.ping()

    async def evalsha(i: int) -> Any:
        return await noop()

    def on_keys(check: peer_mod.Checker) -> rounds.Op:
        identity = Identities()  # one cycle over the 10,000 keys per case

        async def op(i: int) -> Any:
            return await check(identity())

        return op

    cases: dict[str, rounds.AsyncCase] = {}
    for t in tasks:
        # Each case keeps its own cycle of identities, across rounds.
        ops = {
            FLOORS[0]: ping,
            FLOORS[1]: evalsha,
            OURS: on_keys(ours.check),
            OURS_OFF: on_keys(off.check),
            **{peer_case(p): on_keys(peer.check) for p, peer in peers.items()},
        }
        for case, op in ops.items():
            cases[name(case, t)] = _at_least(rounds.concurrent(op, t), t)
        if t == 1:  # the 0.97x target: ours and ours unpipelined side by side
            cases[name(OURS, t)], cases[name(OURS_OFF, t)] = side_by_side(ops[OURS], ops[OURS_OFF])
    return cases


def side_by_side(
    op_a: rounds.Op, op_b: rounds.Op, chunk: int = SIDE_BY_SIDE_CHUNK
) -> tuple[rounds.AsyncCase, rounds.AsyncCase]:
    """Two one-task cases measured together, for a ratio near 1 that the load of a
    shared machine would otherwise drown: `chunk` checks of one, then of the other
    (in alternating order), until each has done `n`; each case gets its own checks/s
    over its own chunks. Whichever of the two a round runs first measures both; the
    other returns its figure from that run."""
    ready: dict[str, float] = {}

    async def both(n: int) -> tuple[float, float]:
        spent = {"a": 0.0, "b": 0.0}
        ops = {"a": op_a, "b": op_b}
        for first in range(0, n, chunk):
            size = min(chunk, n - first)
            for which in "ab" if first // chunk % 2 == 0 else "ba":
                start = time.perf_counter()
                for i in range(first, first + size):
                    await ops[which](i)
                spent[which] += time.perf_counter() - start
        return n / spent["a"], n / spent["b"]

    async def case_a(n: int) -> float:
        if "a" in ready:
            return ready.pop("a")
        a, ready["b"] = await both(n)
        return a

    async def case_b(n: int) -> float:
        if "b" in ready:
            return ready.pop("b")
        ready["a"], b = await both(n)
        return b

    return case_a, case_b


def _own_client(client: Any, max_connections: int) -> Any:
    """A client like `client` (same server, or the same embedded store, same options)
    with a pool of `max_connections`; `client` itself if it has no pool to copy."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return client
    # The maintenance-notification handler is bound to the original pool.
    kwargs = {
        k: v for k, v in pool.connection_kwargs.items() if k != "maint_notifications_pool_handler"
    }
    own = type(pool)(
        connection_class=pool.connection_class, max_connections=max_connections, **kwargs
    )
    return type(client)(connection_pool=own)


def url_of(client: Any) -> str | None:
    """A redis:// URL of the server `client` talks to (None for the embedded fakeredis
    or a client without a connection pool), so that the peers reach the same one."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or is_embedded(client):
        return None
    kw = pool.connection_kwargs
    db = kw.get("db", 0)
    if "path" in kw:
        return f"unix://{kw['path']}?db={db}"
    scheme = "rediss" if "ssl" in pool.connection_class.__name__.lower() else "redis"
    auth = ""
    if kw.get("password") is not None:
        auth = f"{quote(kw.get('username') or '', safe='')}:{quote(kw['password'], safe='')}@"
    return f"{scheme}://{auth}{kw['host']}:{kw['port']}/{db}"


def _with_pool_size(url: str, max_connections: int) -> str:
    return f"{url}{'&' if '?' in url else '?'}max_connections={max_connections}"


async def _check_admits(peers: dict[str, peer_mod.Peer]) -> None:
    """Each peer must be measured on its admit path, like ours."""
    for peer_name, peer in peers.items():
        if not peer.admitted(await peer.check("admission-probe")):
            raise RuntimeError(f"{peer_name} rejected a check of a {LIMIT}/s limit; fix the setup")


async def run(
    client: Any,
    n_rounds: int,
    n: int,
    tasks: tuple[int, ...] = TASKS,
    warmup: int = 100,
    url: str | None = None,
) -> dict[str, Any]:
    """Measure every case; `client` names the server (the part runs on a copy of it
    with a large enough pool), `url` (else derived from `client`) is for the peers."""
    prefix = f"bench:{os.getpid()}:concurrency"
    pool_size = max(100, *tasks)
    url = url or url_of(client)
    shared = _own_client(client, pool_size)
    peer_url = None if url is None else _with_pool_size(url, pool_size)
    peers, skipped = peer_mod.build(shared, peer_url, prefix, LIMIT)
    for left_out in LEFT_OUT:
        peers.pop(left_out, None)
    try:
        await _check_admits(peers)
        per_round = await rounds.run_async(
            make_cases(shared, prefix, tasks, peers), n_rounds, n, warmup
        )
    finally:
        await peer_mod.close_all(peers)
        await delete_prefix(shared, prefix)
        if shared is not client:
            await shared.aclose()
    labels = [*FLOORS, OURS, OURS_OFF, *(peer_case(p) for p in peers)]
    baselines = {name(case, t): [name("PING", t)] for case in labels for t in tasks}
    for t in tasks:
        baselines[name(OURS, t)].append(name(OURS_OFF, t))
    return {
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "checks_per_round_by_tasks": {t: checks_per_round(n, t) for t in tasks},
        "tasks": list(tasks),
        "max_connections": pool_size,
        "limit": f"{LIMIT:,} per second (every check admitted)",
        "cases": {
            "ours": OURS,
            "ours_unpipelined": OURS_OFF,
            "peers": {p: peer_case(p) for p in peers},
        },
        "peers": {p: {"counterpart": peer.counterpart} for p, peer in peers.items()},
        "skipped": skipped,
        "left_out": dict(LEFT_OUT),
        "per_round": per_round,
        "results": rounds.summarize(per_round, baselines),
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The concurrency targets, as rows shaped like `bench.targets`' (PASS / FAIL /
    SKIP with the reason / INFO):

    - at 1 task, ours (auto-pipelined) >= 0.97x ours with `auto_pipeline=False`;
    - at 50 and 200 tasks, ours >= 2x the best peer at the same number of tasks. The
      best peer is the one ours is least ahead of (same-round ratios), named in the
      row; a FAIL row says how ours fared against every peer;
    - beside them (INFO): ours against itself unpipelined at the other numbers of tasks.
    """
    if "per_round" not in report:
        why = report.get("skipped", "skipped: the concurrency part did not run")
        return [skip("auto-pipelining at 1 to 200 tasks", str(why))]
    per_round = report["per_round"]
    measured = set(report["tasks"])
    peers = list(report.get("peers", {}))
    rows = []

    lone = "auto-pipelined check at 1 task vs auto_pipeline=False (a lone check is no slower)"
    if 1 in measured:
        rows.append(ratio_row(lone, per_round, name(OURS, 1), name(OURS_OFF, 1), LONE_TARGET))
    else:
        rows.append(skip(lone, "skipped: 1 task was not measured in this run"))

    for t in PEER_TASKS:
        label = f"auto-pipelined sliding log at {t} tasks vs the best peer"
        if t not in measured:
            rows.append(skip(label, f"skipped: {t} tasks were not measured in this run"))
            continue
        if not peers:
            reasons = "; ".join(f"{p}: {r}" for p, r in report.get("skipped", {}).items())
            rows.append(skip(label, f"skipped: no peer ran here ({reasons or 'none built'})"))
            continue
        ours = name(OURS, t)
        ratios = {p: rounds.ratio(per_round, ours, name(peer_case(p), t)) for p in peers}
        best = min(ratios, key=ratios.__getitem__)
        row = ratio_row(
            f"{label} ({best})", per_round, ours, name(peer_case(best), t), PEER_TARGET
        )
        if not row["pass"]:
            row["why"] = [
                f"ours vs {p}: {ratios[p]:.2f}x (same-round median)" for p in sorted(ratios)
            ] + [
                f"ours vs itself with auto_pipeline=False: "
                f"{rounds.ratio(per_round, ours, name(OURS_OFF, t)):.2f}x"
            ]
        rows.append(row)

    for t in sorted(measured - {1}):
        rows.append(
            ratio_row(
                f"auto-pipelined sliding log at {t} tasks vs auto_pipeline=False",
                per_round,
                name(OURS, t),
                name(OURS_OFF, t),
                None,
            )
        )
    return rows

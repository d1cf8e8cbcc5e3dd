"""Server time per check, read from `INFO commandstats` around each case.

Cases, each `n` checks between two snapshots of the server's command statistics:

- floors: EVALSHA of `return 1`, and "INCR + PEXPIRE", a script doing just that on
  the same 10,000 keys with the TTL as its one argument (the floor for an O(1)
  counter);
- admit: 10,000 keys, a limit that admits every check (`checks.LIMIT` per second),
  for our four limiters (the exact log as the default and in each other storage this
  build has), the peers and the classic recipe;
- reject: one hot key filled to its limit (`REJECT_LIMIT` per `REJECT_WINDOW_S`,
  that many checks admitted before the measurement starts, outside the snapshots),
  then hammered: every measured check is rejected. Ours and the library peers (the
  classic recipe records rejected requests too, so it has no such case).

Every script is compared at the same fill level: each round starts from an empty
keyspace (the run's keys are deleted), an admit case's checks each land on a key of
their own that holds nothing yet (at most 10,000 checks per case per round), and a
reject case's key holds exactly its limit. The cases run in interleaved rounds, in a
fresh random order each round (`rounds.py`); a figure is the median over rounds of
usec per check, and a comparison the median of same-round ratios.

In Redis 7 the time of EVALSHA and EXEC includes the commands they run, which are
also counted on their own; so when a case used a script or a transaction only those
top-level commands (and MULTI) are summed, and the nested ones are listed per check
for reading. A private redis-server (no other clients) is used when one can be
started, so that nobody else's commands are counted; otherwise the given server,
and the run says so.
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import checks, rounds
from . import peers as peer_mod
from .cleanup import delete_prefix

CONTAINERS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "exec", "fcall", "fcall_ro"}
IGNORED = {"info", "script|load", "scan", "del"}  # the bench's own bookkeeping

NOOP = "EVALSHA return 1"
INCR = "INCR + PEXPIRE, 10k keys"
INCR_SCRIPT = "redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1])"
FLOORS = (NOOP, INCR)
ADMIT_WINDOW_S = 1
REJECT_LIMIT = 100
REJECT_WINDOW_S = 60

Stats = dict[str, dict[str, int]]  # command -> {"calls", "usec"}


def admit(name: str) -> str:
    """The admit case of a limiter: 10,000 keys, every check admitted."""
    return checks.spread(name)


def reject(name: str) -> str:
    """The reject case of a limiter: its hot key full, every check rejected."""
    return f"{name} hot key at its limit"


async def commandstats(client: Any) -> Stats:
    raw = await client.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
        for k, v in raw.items()
    }


def delta(before: Stats, after: Stats) -> Stats:
    """What ran between two snapshots, without the bench's own bookkeeping."""
    out = {}
    for name, now in after.items():
        was = before.get(name, {"calls": 0, "usec": 0})
        calls = now["calls"] - was["calls"]
        if calls and name not in IGNORED:
            out[name] = {"calls": calls, "usec": now["usec"] - was["usec"]}
    return out


def add(total: Stats, more: Stats) -> Stats:
    """Two deltas summed (rounds of the same case)."""
    out = {n: dict(d) for n, d in total.items()}
    for name, d in more.items():
        mine = out.setdefault(name, {"calls": 0, "usec": 0})
        mine["calls"] += d["calls"]
        mine["usec"] += d["usec"]
    return out


def of_delta(changed: Stats, checks_done: int) -> dict[str, Any]:
    """usec and commands per check from what ran (see the module's docstring)."""
    nested = any(name in CONTAINERS for name in changed)
    top = {n: d for n, d in changed.items() if not nested or n in CONTAINERS or n == "multi"}
    return {
        "usec_per_check": sum(d["usec"] for d in top.values()) / checks_done,
        "top_level_commands_per_check": sum(d["calls"] for d in top.values()) / checks_done,
        "commands": {
            n: {
                "calls_per_check": d["calls"] / checks_done,
                "usec_per_check": d["usec"] / checks_done,
                "nested": nested and n not in top,
            }
            for n, d in sorted(changed.items())
        },
    }


def per_check(before: Stats, after: Stats, checks_done: int) -> dict[str, Any]:
    """usec and commands per check from two snapshots."""
    return of_delta(delta(before, after), checks_done)


@dataclass
class CostCase:
    """`run(n)` makes n checks and returns how many were admitted; `prepare()` runs
    before every measurement, outside the snapshots (a reject case fills its key)."""

    kind: str  # "floor", "admit" or "reject"
    run: Callable[[int], Awaitable[int]]
    prepare: Callable[[], Awaitable[None]] | None = None


Check = Callable[[str], Awaitable[Any]]
Admitted = Callable[[Any], bool]


def _admit_case(check: Check, admitted: Admitted) -> CostCase:
    identity = checks.Identities()

    async def run(n: int) -> int:
        return sum([admitted(await check(identity())) for _ in range(n)])

    return CostCase("admit", run)


def _reject_case(name: str, check: Check, admitted: Admitted) -> CostCase:
    async def prepare() -> None:
        filled = sum([admitted(await check("hot")) for _ in range(REJECT_LIMIT)])
        if filled != REJECT_LIMIT:
            raise RuntimeError(
                f"{name} admitted {filled} of the {REJECT_LIMIT} checks filling its hot key "
                "(it must start the measurement at its limit); fix the setup"
            )

    async def run(n: int) -> int:
        return sum([admitted(await check("hot")) for _ in range(n)])

    return CostCase("reject", run, prepare)


def _allowed(decision: Any) -> bool:
    return decision.allowed


def make_cases(
    client: Any,
    prefix: str,
    admitting: checks.Ours,
    rejecting: checks.Ours,
    peers_admit: dict[str, peer_mod.Peer],
    peers_reject: dict[str, peer_mod.Peer],
) -> dict[str, CostCase]:
    noop = client.register_script("return 1")
    incr = client.register_script(INCR_SCRIPT)
    ttl = str(ADMIT_WINDOW_S * 1000)
    identity = checks.Identities()

    async def run_noop(n: int) -> int:
        for _ in range(n):
            await noop()
        return n

    async def run_incr(n: int) -> int:
        for _ in range(n):
            await incr(keys=[f"{prefix}:incr:{identity()}"], args=[ttl])
        return n

    cases = {NOOP: CostCase("floor", run_noop), INCR: CostCase("floor", run_incr)}
    for name, limiter in admitting.limiters.items():
        cases[admit(name)] = _admit_case(limiter.check, _allowed)
    for name, peer in peers_admit.items():
        cases[admit(name)] = _admit_case(peer.check, peer.admitted)
    for name, limiter in rejecting.limiters.items():
        cases[reject(name)] = _reject_case(name, limiter.check, _allowed)
    for name, peer in peers_reject.items():
        cases[reject(name)] = _reject_case(name, peer.check, peer.admitted)
    return cases


async def measure(
    client: Any,
    cases: dict[str, CostCase],
    n_rounds: int,
    n: int,
    prefix: str,
    seed: int = 0,
) -> tuple[rounds.Rounds, dict[str, Stats], dict[str, int]]:
    """Per round {case: usec per check}; per case every round's commands summed, and
    how many measured checks were admitted."""
    for case in cases.values():  # scripts loaded, connections open
        if case.prepare:
            await case.prepare()
        await case.run(5)
    rng = random.Random(seed)
    per_round: rounds.Rounds = []
    totals: dict[str, Stats] = {name: {} for name in cases}
    admitted = dict.fromkeys(cases, 0)
    for _ in range(n_rounds):
        await delete_prefix(client, prefix)  # every round from an empty keyspace
        usec = {}
        for name in rng.sample(list(cases), len(cases)):
            case = cases[name]
            if case.prepare:
                await case.prepare()
            before = await commandstats(client)
            admitted[name] += await case.run(n)
            changed = delta(before, await commandstats(client))
            usec[name] = of_delta(changed, n)["usec_per_check"]
            totals[name] = add(totals[name], changed)
        per_round.append({name: usec[name] for name in cases})
    return per_round, totals, admitted


def _without_usec(figures: dict[str, Any]) -> dict[str, Any]:
    # usec per check is the median over rounds; the commands are summed over them
    return {k: v for k, v in figures.items() if k != "usec_per_check"}


async def run(client: Any, url: str, n_rounds: int, calls: int, where: str) -> dict[str, Any]:
    """Measure every case on the server `client`/`url` point at."""
    prefix = f"bench:{os.getpid()}:cost"
    n = max(1, min(calls, checks.KEYS))  # every admit check on a key of its own
    peers_admit, skipped = peer_mod.build(client, url, f"{prefix}:admit", checks.LIMIT)
    peers_reject, _ = peer_mod.build(
        client, url, f"{prefix}:reject", REJECT_LIMIT, window_s=REJECT_WINDOW_S
    )
    peers_reject.pop(peer_mod.CLASSIC)  # it records rejected requests: no reject path
    try:
        admitting = checks.ours(
            checks.OURS, client, f"{prefix}:admit", ADMIT_WINDOW_S, checks.LIMIT
        )
        rejecting = checks.ours(
            checks.OURS, client, f"{prefix}:reject", REJECT_WINDOW_S, REJECT_LIMIT
        )
        cases = make_cases(client, prefix, admitting, rejecting, peers_admit, peers_reject)
        per_round, totals, admitted = await measure(client, cases, n_rounds, n, prefix)
    finally:
        await peer_mod.close_all(peers_admit)
        await peer_mod.close_all(peers_reject)
        await delete_prefix(client, prefix)
    checks_done = n * n_rounds
    results = {}
    for name, case in cases.items():
        each = [r[name] for r in per_round]
        results[name] = {
            "kind": case.kind,
            "usec_per_check": statistics.median(each),
            "rounds": each,
            **_without_usec(of_delta(totals[name], checks_done)),
            "admitted_per_check": admitted[name] / checks_done,
        }
    return {
        "server": where,
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "floors": list(FLOORS),
        "admit": f"10,000 keys, {checks.LIMIT:,} per {ADMIT_WINDOW_S} s (every check "
        "admitted), each check on a key that holds nothing yet",
        "reject": f"one hot key, {REJECT_LIMIT} per {REJECT_WINDOW_S} s, filled with "
        f"{REJECT_LIMIT} admitted checks before each measurement (every measured check "
        "rejected)",
        "peers_skipped": skipped,
        "log_storages": admitting.storages,
        "per_round": per_round,
        "results": results,
    }

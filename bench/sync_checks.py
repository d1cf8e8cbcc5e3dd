"""The sync limiters (`ratelimit.sync`) on a blocking client, in their own interleaved
rounds with their own floors (sync PING and EVALSHA `return 1` on the same client),
beside the peers' sync APIs (`peers.build_sync`) on the same two key patterns: one
hot key and 10,000 keys, every check admitted. Case names start with "sync "."""

from __future__ import annotations

import os
from typing import Any

from ratelimit import algorithms

from . import peers as peer_mod
from . import rounds
from .checks import LIMIT, Identities, hot, ours, report, spread
from .cleanup import delete_prefix_sync

OURS = tuple(a.limiter_class("sync") for a in algorithms.ALGORITHMS)  # the registry's order
SYNC = "sync "


def name(case: str) -> str:
    """A sync case's name: "sync " and the async case's name."""
    return SYNC + case


def _pair(check: Any) -> tuple[rounds.SyncCase, rounds.SyncCase]:
    ids = Identities()
    return (
        rounds.sequential_sync(lambda i: check("hot")),
        rounds.sequential_sync(lambda i: check(ids())),
    )


def make_cases(
    client: Any, limiters: dict[str, Any], peers: dict[str, peer_mod.Peer]
) -> dict[str, rounds.SyncCase]:
    noop = client.register_script("return 1")
    cases = {
        "PING": rounds.sequential_sync(lambda i: client.ping()),
        "EVALSHA return 1": rounds.sequential_sync(lambda i: noop()),
    }
    for case, limiter in limiters.items():
        cases[hot(name(case))], cases[spread(name(case))] = _pair(limiter.check)
    for case, peer in peers.items():
        cases[hot(name(case))], cases[spread(name(case))] = _pair(peer.check)
    return cases


def _check_admits(limiters: dict[str, Any], peers: dict[str, peer_mod.Peer]) -> None:
    for case, peer in peers.items():
        if not peer.admitted(peer.check("admission-probe")):
            raise RuntimeError(f"sync {case} rejected a check of a {LIMIT}/s limit")
    for case, limiter in limiters.items():
        if not limiter.check("admission-probe").allowed:
            raise RuntimeError(f"sync {case} rejected a check of a {LIMIT}/s limit")


def run(
    client: Any, n_rounds: int, n: int, url: str | None = None, warmup: int = 50
) -> dict[str, Any]:
    """Measure the sync cases; `url` lets the peers open their own clients."""
    prefix = f"bench:{os.getpid()}:sync"
    peers, skipped = peer_mod.build_sync(url, prefix, LIMIT)
    try:
        mine = ours(OURS, client, prefix, 1, LIMIT)
        _check_admits(mine.limiters, peers)
        cases = make_cases(client, mine.limiters, peers)
        per_round = rounds.run_sync(cases, n_rounds, n, warmup)
    finally:
        peer_mod.close_all_sync(peers)
        delete_prefix_sync(client, prefix)
    return report(n_rounds, n, peers, skipped, mine.storages, per_round)

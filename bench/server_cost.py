"""Server-side cost per check, read from `INFO commandstats` around each case.

Every case of `checks.py` (floors, ours, peers) runs `calls` checks on its own, between
two snapshots of the server's command statistics. In Redis 7 the time of EVALSHA and
EXEC includes the commands they run, which are also counted on their own; so when a
case used a script or a transaction only those top-level commands (and MULTI) are
summed, and the nested ones are listed per check for reading.

A private redis-server (no other clients) is used when one can be started, so that
nobody else's commands are counted; otherwise the given server, and the run says so.
"""

from __future__ import annotations

import os
from typing import Any

from . import checks
from . import peers as peer_mod
from .cleanup import delete_prefix

CONTAINERS = {"evalsha", "eval", "evalsha_ro", "eval_ro", "exec", "fcall", "fcall_ro"}
IGNORED = {"info", "script|load", "scan", "del"}  # the bench's own bookkeeping


async def commandstats(client: Any) -> dict[str, dict[str, int]]:
    raw = await client.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
        for k, v in raw.items()
    }


def per_check(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], checks_done: int
) -> dict[str, Any]:
    """usec and commands per check from two snapshots (see the module's docstring)."""
    delta = {}
    for name, now in after.items():
        was = before.get(name, {"calls": 0, "usec": 0})
        calls = now["calls"] - was["calls"]
        if calls and name not in IGNORED:
            delta[name] = {"calls": calls, "usec": now["usec"] - was["usec"]}
    nested = any(name in CONTAINERS for name in delta)
    top = {n: d for n, d in delta.items() if not nested or n in CONTAINERS or n == "multi"}
    return {
        "usec_per_check": sum(d["usec"] for d in top.values()) / checks_done,
        "top_level_commands_per_check": sum(d["calls"] for d in top.values()) / checks_done,
        "commands": {
            n: {
                "calls_per_check": d["calls"] / checks_done,
                "usec_per_check": d["usec"] / checks_done,
                "nested": nested and n not in top,
            }
            for n, d in sorted(delta.items())
        },
    }


async def run(client: Any, url: str, calls: int, where: str) -> dict[str, Any]:
    """Measure every case of `checks.make_cases` on the server `client`/`url` point at."""
    prefix = f"bench:{os.getpid()}:cost"
    peers, skipped = peer_mod.build(client, url, prefix, checks.LIMIT)
    results = {}
    try:
        cases = checks.make_cases(client, prefix, peers)
        for case in cases.values():  # scripts loaded, connections open
            await case(checks.BATCH)
        for name, case in cases.items():
            before = await commandstats(client)
            done = max(checks.BATCH, calls // checks.BATCH * checks.BATCH)  # whole batches
            await case(done)
            results[name] = per_check(before, await commandstats(client), done)
    finally:
        await peer_mod.close_all(peers)
        await delete_prefix(client, prefix)
    return {
        "server": where,
        "checks_per_case": calls,
        "peers_skipped": skipped,
        "results": results,
    }

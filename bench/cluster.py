"""The sliding log on a Redis Cluster, when one is up.

Which cluster: `RATELIMIT_CLUSTER_URL` when set; else the one `make cluster-up` left
running (its URL is in `build/cluster/state.json`); else the part is skipped with
the reason. The bench never starts a cluster itself. PING goes to every node on a
cluster, so the floor here is EVALSHA `return 1` on a key of the same 10,000
identities, which routes to one node as a check does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ratelimit import SlidingWindowLimiter, connect

from . import rounds
from .checks import LIMIT, Identities, hot, spread
from .cleanup import delete_prefix

ENV = "RATELIMIT_CLUSTER_URL"
FLOOR = "EVALSHA return 1, 10k keys"
# Where `make cluster-up` records its cluster (the Makefile's CLUSTER_DIR), from the
# working directory `make` runs in, else from the checkout this package sits in.
STATE = Path("build/cluster/state.json")
STATE_FILES = (STATE, Path(__file__).resolve().parents[1] / STATE)


def find_url(state_files: tuple[Path, ...] | None = None) -> tuple[str | None, str]:
    """(url, where it came from), or (None, why there is none)."""
    url = os.environ.get(ENV)
    if url:
        return url, f"${ENV}"
    for path in STATE_FILES if state_files is None else state_files:
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            return None, f"unreadable {path} ({type(exc).__name__}: {exc})"
        if isinstance(state, dict) and isinstance(state.get("url"), str):
            return state["url"], f"make cluster-up ({path})"
        return None, f"{path} holds no cluster URL"
    return None, f"no cluster ({ENV} is not set and make cluster-up left none running)"


def make_cases(client: Any, prefix: str) -> dict[str, rounds.AsyncCase]:
    noop = client.register_script("return 1")
    limiter = SlidingWindowLimiter(client, 1, LIMIT, prefix=f"{prefix}:log")

    ids_floor, ids_log = Identities(), Identities()

    async def floor(i: int) -> Any:
        return await noop(keys=[f"{prefix}:floor:{ids_floor()}"])

    async def on_hot(i: int) -> Any:
        return await limiter.check("hot")

    async def on_spread(i: int) -> Any:
        return await limiter.check(ids_log())

    return {
        FLOOR: rounds.sequential(floor),
        hot("SlidingWindowLimiter"): rounds.sequential(on_hot),
        spread("SlidingWindowLimiter"): rounds.sequential(on_spread),
    }


async def run(n_rounds: int, n: int, url: str | None = None, warmup: int = 50) -> dict[str, Any]:
    """Figures on the cluster at `url` (default: `find_url()`), else a reason."""
    source = "given"
    if not url:
        url, source = find_url()
        if url is None:
            return {"skipped": f"skipped: {source}"}
    client = None
    try:
        client = connect(url)
        await client.ping()
    except Exception as exc:  # any failure to reach it is a reason to skip, said aloud
        if client is not None:
            await client.aclose()
        return {
            "skipped": f"skipped: cluster at {url} (from {source}) did not answer "
            f"({type(exc).__name__}: {exc})"
        }
    prefix = f"bench:{os.getpid()}:cluster"
    try:
        per_round = await rounds.run_async(make_cases(client, prefix), n_rounds, n, warmup)
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()
    return {
        "url": url,
        "source": source,
        "rounds": n_rounds,
        "checks_per_case_per_round": n,
        "per_round": per_round,
        "results": rounds.summarize(per_round, [FLOOR]),
    }

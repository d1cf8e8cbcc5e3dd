"""Memory per key at limits 10, 128, 129, 1,000 and 100,000 (`ratelimit.lab.memory.probe`).

For the sliding log: one full key per limit, with the members our script writes and
with the classic "<ms>:<perf_counter_ns>" strings, in bytes per member (MEMORY USAGE
divided by members, key overhead included). 128 -> 129 crosses the default
`zset-max-listpack-entries`, where a small sorted set turns into a skiplist. The O(1)
algorithms hold one small value whatever the limit: bytes per key.
"""

from __future__ import annotations

from typing import Any

from ratelimit.lab.memory import listpack_threshold, probe, redis_version

LIMITS = (10, 128, 129, 1_000, 100_000)
O1 = ("fw", "swc", "gcra")


def run(client: Any, limits: tuple[int, ...] = LIMITS) -> dict[str, Any]:
    rows = []
    for limit in limits:
        for fmt in ("script", "classic"):
            p = probe(client, "log", limit, member_format=fmt)
            rows.append(
                {
                    "algorithm": "log",
                    "member_format": fmt,
                    "limit": limit,
                    "bytes_per_key": p.memory_usage,
                    "bytes_per_member": p.bytes_per_entry,
                    "encoding": p.encoding,
                }
            )
        for alg in O1:
            p = probe(client, alg, limit)
            rows.append(
                {
                    "algorithm": alg,
                    "member_format": "",
                    "limit": limit,
                    "bytes_per_key": p.memory_usage,
                    "bytes_per_member": None,
                    "encoding": p.encoding,
                }
            )
    return {
        "redis_version": redis_version(client),
        "zset_max_listpack_entries": listpack_threshold(client),
        "rows": rows,
    }

"""Delete the keys a benchmark wrote under its prefix (real Redis only; fakeredis is dropped)."""

from __future__ import annotations

from typing import Any

from ratelimit.backends import is_embedded

_BATCH = 1000


async def delete_prefix(client: Any, prefix: str) -> int:
    """Delete every key matching `<prefix>:*`; returns how many."""
    if is_embedded(client):
        return 0
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=_BATCH)]
    for i in range(0, len(keys), _BATCH):
        await client.delete(*keys[i : i + _BATCH])
    return len(keys)


def delete_prefix_sync(client: Any, prefix: str) -> int:
    if is_embedded(client):
        return 0
    keys = list(client.scan_iter(match=f"{prefix}:*", count=_BATCH))
    for i in range(0, len(keys), _BATCH):
        client.delete(*keys[i : i + _BATCH])
    return len(keys)

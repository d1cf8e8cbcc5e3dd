"""Access logs the lab writes itself: a small realistic example, and big ones for the bench.

    write_example("build/example.log")                  # ~32k lines, 20 minutes, seed 7
    trace, problems = accesslog.read("build/example.log", identity="user", cost=example_cost)

The example is Common Log Format, made from the lab's own traffic generators
(`ratelimit.lab.traffic`): a Zipf fleet of 150 API keys, two heavy hitters, a bursty
on-off client and a geofence client whose look-ups cost by radius (`example_cost` prices
them from the ``radius_m`` in the path, as `ratelimit.costs.geofence_cost` does). The
``user`` field holds each client's API key; the ``host`` field its address, IPv4 for most,
IPv6 for some, and one client (``heavy-2``) rotates through four addresses of one IPv6 /64,
which `ratelimit.identity.address_identity` counts as one client. Two servers answer, one
writing times at UTC+01:00, the other at UTC-05:00, and the log is the two merged in the
order requests finished, so lines are a little out of time order, as real logs are.
`example_requests(seed)` is what the generators produced: the requests the log holds.

The example also holds `len(EXAMPLE_BAD_LINES) + 1` bad lines, none of them a request:
the lines of `EXAMPLE_BAD_LINES` (line number -> the reason a loader gives), and the last
line, cut off mid-way without its newline ("truncated"). Same seed, same bytes.

`write_large(path, lines)` writes a big synthetic Common Log Format log fast, block by
block in bounded memory: Zipf-distributed identities, sorted times at `rate` a second.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd

from ratelimit import validation
from ratelimit.costs import geofence_cost

from . import traffic

__all__ = [
    "EXAMPLE_BAD_LINES",
    "EXAMPLE_DURATION_S",
    "EXAMPLE_START",
    "example_cost",
    "example_requests",
    "write_example",
    "write_large",
]

EXAMPLE_START = int(datetime(2026, 3, 2, 9, 0, tzinfo=UTC).timestamp())
"""Unix time of the example's first second (2026-03-02 09:00 UTC)."""

EXAMPLE_DURATION_S = 1200.0
"""The example spans 20 minutes."""

EXAMPLE_BAD_LINES = {101: "malformed", 4_321: "bad time", 12_345: "malformed"}
"""1-based line numbers of the example's bad lines, besides its last line (truncated),
and the reason `ratelimit.lab.accesslog` gives for each."""

SERVER_OFFSETS_S = (3600, -5 * 3600)  # the two servers' UTC offsets
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_LARGE_START = int(datetime(2026, 3, 1, tzinfo=UTC).timestamp())
_LARGE_BLOCK = 500_000


def _clf_time(epoch_s: int, offset_s: int) -> str:
    """``02/Mar/2026:10:00:00 +0100``: the second `epoch_s` on a clock at `offset_s`."""
    local = datetime.fromtimestamp(epoch_s + offset_s, UTC)
    sign, size = ("+" if offset_s >= 0 else "-"), abs(offset_s)
    return (
        f"{local.day:02d}/{_MONTHS[local.month - 1]}/{local.year}:"
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d} "
        f"{sign}{size // 3600:02d}{size % 3600 // 60:02d}"
    )


def _api_key(rng: np.random.Generator) -> str:
    return "ak_live_" + "".join(f"{b:02x}" for b in rng.integers(0, 256, 8))


def _example(seed: int) -> pd.DataFrame:
    """Every request of the example: the generators' trace plus what the log shows."""
    seed = validation.count("seed", seed, minimum=0)
    span = EXAMPLE_DURATION_S
    trace = traffic.merge(
        traffic.zipf_fleet(150, 14.0, span, exponent=1.1, seed=seed),
        traffic.poisson(6.0, span, identity="heavy-1", seed=seed + 1),
        traffic.poisson(2.5, span, identity="heavy-2", seed=seed + 2),
        traffic.on_off(20.0, 20.0, 100.0, span, identity="burst-1", seed=seed + 3),
        traffic.geofence_mix(1.0, span, identity="geo-1", seed=seed + 4),
    )
    rng = np.random.default_rng(seed)
    names = pd.unique(trace["identity"].to_numpy(dtype=object))
    api_keys = {name: _api_key(rng) for name in names}
    # Addresses: IPv4 from the documentation ranges, every fifth client on IPv6 with a
    # /64 of its own; heavy-2 rotates through four addresses of its /64.
    addresses: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        if name == "heavy-2":
            addresses[name] = [f"2001:db8:7:2::{rng.integers(1, 2**16):x}" for _ in range(4)]
        elif i % 5 == 4:
            addresses[name] = [f"2001:db8:{i:x}:1::{rng.integers(1, 2**16):x}"]
        else:
            net = ("192.0.2", "198.51.100", "203.0.113")[i % 3]
            addresses[name] = [f"{net}.{1 + i // 3}"]
    n = len(trace)
    who = trace["identity"].to_numpy(dtype=object)
    pick = rng.integers(0, 4, n)
    host = [addresses[w][p % len(addresses[w])] for w, p in zip(who, pick, strict=True)]
    tiles = rng.integers(0, 2**10, (n, 2))
    path = [f"/v1/tiles/10/{x}/{y}.png" for x, y in tiles]
    radius = trace["radius_m"].to_numpy()
    for i in np.flatnonzero(who == "geo-1"):  # repr: the radius read back is this float
        path[i] = f"/v1/geofence/within?lat=48.8566&lon=2.3522&radius_m={float(radius[i])!r}"
    return pd.DataFrame(
        {
            "time": trace["time"].to_numpy(),
            "identity": who,
            "key": [api_keys[w] for w in who],
            "host": host,
            "path": path,
            "cost": trace["cost"].to_numpy(),
            "server": rng.integers(0, 2, n),
            "status": rng.choice([200, 200, 200, 200, 200, 200, 304, 404], n),
            "bytes": rng.integers(200, 60_000, n),
            "finish": trace["time"].to_numpy() + rng.exponential(0.25, n),
        }
    )


def example_requests(seed: int = 7) -> pd.DataFrame:
    """The requests the example log of `seed` holds, as a trace: ``time`` (Unix epoch
    seconds, whole seconds as Common Log Format writes them), ``identity`` (the API key),
    ``cost``, ``replica`` (0), then ``address`` (the client's) and ``client`` (the
    generator's name for it), sorted by time (ties in the order of the log)."""
    frame = _example(seed).sort_values("finish", kind="stable")
    out = pd.DataFrame(
        {
            "time": (EXAMPLE_START + np.floor(frame["time"].to_numpy())).astype(np.float64),
            "identity": pd.array(frame["key"].to_numpy(dtype=object), dtype="str"),
            "cost": frame["cost"].to_numpy(dtype=np.int64),
            "replica": np.zeros(len(frame), dtype=np.int64),
            "address": pd.array(frame["host"].to_numpy(dtype=object), dtype="str"),
            "client": pd.array(frame["identity"].to_numpy(dtype=object), dtype="str"),
        }
    )
    return out.sort_values("time", kind="stable").reset_index(drop=True)


def example_cost(fields: dict[str, Any]) -> int:
    """The cost of an example request from its fields: a geofence look-up by its
    ``radius_m`` (`ratelimit.costs.geofence_cost`), anything else 1."""
    query = parse_qs(urlsplit(fields.get("path", "")).query)
    if "radius_m" in query:
        return geofence_cost(float(query["radius_m"][0]))
    return 1


def write_example(path: str | Path, *, seed: int = 7) -> Path:
    """Write the example log (see the module doc) to `path`; return the path."""
    frame = _example(seed).sort_values("finish", kind="stable")
    lines = []
    for row in frame.itertuples(index=False):
        second = EXAMPLE_START + math.floor(row.time)
        stamp = _clf_time(second, SERVER_OFFSETS_S[row.server])
        lines.append(
            f'{row.host} - {row.key} [{stamp}] "GET {row.path} HTTP/1.1" {row.status} {row.bytes}'
        )
    first = lines[0].split(" [")[0]
    bad = {
        # a line cut short by another process writing to the same file
        101: lines[100][: lines[100].index('"') + 12],
        # a clock that wrote a date that does not exist
        4_321: f'{first} [30/Feb/2026:10:14:07 +0100] "GET /v1/tiles/10/1/2.png HTTP/1.1" 200 512',
        # an error message that went to the access log
        12_345: "upstream timed out (110: Connection timed out) while reading response header",
    }
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    last = lines[-1]
    text = "\n".join(lines) + "\n" + last[: len(last) // 2]  # the last line, cut off
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_large(
    path: str | Path,
    lines: int,
    *,
    identities: int = 100_000,
    seed: int = 1,
    rate: float = 2_000.0,
) -> Path:
    """Write a Common Log Format log of `lines` requests to `path`, fast and in bounded
    memory; return the path.

    Requests arrive as a Poisson process at `rate` a second from 2026-03-01 00:00 UTC
    (50 million lines span about 7 hours at the default rate), sorted; each comes from one
    of `identities` API keys (``user``, Zipf-distributed, exponent 1.1) with an address of
    its own (IPv4; every tenth on IPv6, rotating through four addresses of its /64).
    Every line is well formed. Same arguments, same bytes.
    """
    lines = validation.count("lines", lines, minimum=0)
    identities = validation.count("identities", identities)
    rate = validation.positive("rate", rate)
    rng = np.random.default_rng(validation.count("seed", seed, minimum=0))
    ranks = np.arange(1, identities + 1, dtype=np.float64) ** -1.1
    cdf = np.cumsum(ranks / ranks.sum())
    codes = np.arange(identities)
    users = np.array([f"key-{c:07d}" for c in codes], dtype=object)
    v6 = codes % 10 == 9
    hosts = np.array(
        [
            f"2001:db8:{c >> 16:x}:{c & 0xFFFF:x}::"
            if six
            else f"10.{c >> 16}.{c >> 8 & 255}.{c & 255}"
            for c, six in zip(codes, v6, strict=True)
        ],
        dtype=object,
    )
    paths = np.array([f"/v1/tiles/{z}/{z * 3}/{z * 5}.png" for z in range(20)], dtype=object)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clock = 0.0
    with open(path, "wb") as out:
        for start in range(0, lines, _LARGE_BLOCK):
            n = min(_LARGE_BLOCK, lines - start)
            times = clock + np.cumsum(rng.exponential(1.0 / rate, n))
            clock = float(times[-1])
            seconds, where = np.unique(np.floor(times).astype(np.int64), return_inverse=True)
            stamps = np.array([_clf_time(_LARGE_START + int(s), 0) for s in seconds], object)
            who = np.minimum(np.searchsorted(cdf, rng.random(n)), identities - 1)
            host = hosts[who]
            six = np.flatnonzero(v6[who])
            suffix = rng.integers(1, 5, len(six))  # one of four addresses of the /64
            host[six] = [f"{h}{s:x}" for h, s in zip(host[six], suffix, strict=True)]
            size = rng.integers(200, 60_000, n)
            block = [
                f'{h} - {u} [{t}] "GET {p} HTTP/1.1" 200 {b}\n'
                for h, u, t, p, b in zip(
                    host,
                    users[who],
                    stamps[where],
                    paths[rng.integers(0, len(paths), n)],
                    size.tolist(),
                    strict=True,
                )
            ]
            out.write("".join(block).encode("ascii"))
    return path

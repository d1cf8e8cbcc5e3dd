"""Chapter 6 (the HTTP route), explored: one client's admitted and refused look-ups.

Section 4 of the chapter runs three clients against the demo app in this process, on
a virtual clock: one that retries 50 ms after every 429 ("hammers"), one that waits
as long as `Retry-After` says, one that paces itself by `RateLimit-Policy`. Each
client's next request depends on the previous answer, so this is a closed loop, not
a trace that `ratelimit.lab.replay` could play back. `simulate` runs the same loop against
the in-memory reference model of the sliding log (`ratelimit.lab.reference`), which the
property tests hold to the Lua script's decisions, and reads the header fields the
route would send from the route's own code (`ratelimit.http.RateLimit.headers_for`,
so `Retry-After` is rounded up exactly as over HTTP). No Redis, no app, no event
loop: a 30 s run takes milliseconds, and the notebook checks that its counts equal
those of the app.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ratelimit.clock import ManualClock
from ratelimit.http import rate_limit

from ..reference import SlidingWindowLimiter

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CLIENTS", "ClientRun", "figure", "simulate"]

HAMMERS = "hammers"
HONOURS_RETRY_AFTER = "honours Retry-After"
PACED = "paced by RateLimit-Policy"
CLIENTS = [HAMMERS, HONOURS_RETRY_AFTER, PACED]
"""The client behaviours of the chapter's section 4, as the drop-down offers them."""

SCOPE = "geofence"
_TITLES = {
    HAMMERS: "A client that retries {retry} ms after each 429",
    HONOURS_RETRY_AFTER: "A client that honours Retry-After",
    PACED: "A client paced by RateLimit-Policy",
}


@dataclass(frozen=True)
class ClientRun:
    """One client's requests: send times (virtual ms) and whether each got a 200."""

    client: str
    times_ms: np.ndarray
    admitted: np.ndarray  # bool, one per request

    @property
    def requests(self) -> int:
        return len(self.times_ms)

    @property
    def admitted_count(self) -> int:
        return int(self.admitted.sum())

    @property
    def refused_count(self) -> int:
        return self.requests - self.admitted_count


def _parse_item(value: str) -> dict[str, int]:
    """The parameters of a Structured Field item: '"geofence";q=10;w=1' -> {q: 10, w: 1}."""
    _, *params = value.split(";")
    return {k: int(v) for k, v in (p.split("=") for p in params)}


def simulate(
    *,
    limit: int = 10,
    client: str = HAMMERS,
    duration_s: int = 10,
    window_s: int = 1,
    latency_ms: int = 20,
    hammer_retry_ms: int = 50,
) -> ClientRun:
    """Run one client of section 4 for `duration_s` virtual seconds; see the module doc.

    Every request is a 500 m look-up (cost 1) against `limit` units per `window_s`
    seconds; each takes `latency_ms` of round trip. After a 429 the hammering client
    retries `hammer_retry_ms` later, the polite one waits `Retry-After` seconds; the
    paced one sends every `w / q` seconds of the `RateLimit-Policy` it was sent.
    """
    if client not in CLIENTS:
        raise ValueError(f"client must be one of {CLIENTS}, got {client!r}")
    clock = ManualClock()
    limiter = SlidingWindowLimiter(window_s, limit, clock=clock)
    route = rate_limit(limiter, scope=SCOPE)  # the route's header fields, from its own code
    now_ms, end_ms = 0, duration_s * 1000
    times: list[int] = []
    admitted: list[bool] = []
    while now_ms < end_ms:
        clock.set_ms(now_ms)
        decision = limiter.check(client)
        headers = route.headers_for(decision)
        times.append(now_ms)
        admitted.append(decision.allowed)
        if client == PACED:
            policy = _parse_item(headers["RateLimit-Policy"])
            gap_ms = max(latency_ms, -(-policy["w"] * 1000 // policy["q"]))  # rounded up
        elif not decision.allowed and client == HONOURS_RETRY_AFTER:
            gap_ms = latency_ms + int(headers["Retry-After"]) * 1000
        elif not decision.allowed:
            gap_ms = latency_ms + hammer_retry_ms
        else:
            gap_ms = latency_ms
        now_ms += gap_ms
    return ClientRun(client, np.array(times, dtype=np.int64), np.array(admitted, dtype=bool))


def figure(
    *,
    limit: int = 10,
    client: str = HAMMERS,
    duration_s: int = 10,
    window_s: int = 1,
    latency_ms: int = 20,
    hammer_retry_ms: int = 50,
) -> Figure:
    """One client's admitted (200) and refused (429) look-ups over virtual time.

    The defaults are the chapter's parameters, so `figure()` is the chapter's story:
    the hammering client gets exactly the limit (100 look-ups in 10 s) and is refused
    more often than it is served. Left: cumulative counts against the limit's line;
    right: admitted and refused per virtual second. Returns a
    `matplotlib.figure.Figure` (not shown; the caller shows or closes it).
    """
    import matplotlib.pyplot as plt

    run = simulate(
        limit=limit,
        client=client,
        duration_s=duration_s,
        window_s=window_s,
        latency_ms=latency_ms,
        hammer_retry_ms=hammer_retry_ms,
    )
    seconds = run.times_ms / 1000
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for mask, color, label in [
        (run.admitted, "tab:blue", f"admitted (200): {run.admitted_count}"),
        (~run.admitted, "tab:red", f"refused (429): {run.refused_count}"),
    ]:
        x = np.concatenate([[0.0], seconds[mask], [duration_s]])
        counts = np.arange(mask.sum() + 1)
        left.step(x, np.concatenate([counts, counts[-1:]]), where="post", color=color, label=label)
    left.plot(
        [0, duration_s],
        [0, limit * duration_s / window_s],
        color="0.75",
        linewidth=4,
        zorder=0,
        label=f"the limit ({limit} per {window_s} s)",
    )
    left.set_xlim(0, duration_s)
    left.set_xlabel("virtual time (s)")
    left.set_ylabel("look-ups (cumulative)")
    left.set_title(_TITLES[client].format(retry=hammer_retry_ms))
    left.legend(fontsize=8, loc="upper left")

    bins = np.arange(duration_s + 1)
    per_s_ok = np.histogram(seconds[run.admitted], bins)[0]
    per_s_no = np.histogram(seconds[~run.admitted], bins)[0]
    right.bar(bins[:-1] + 0.5, per_s_ok, width=0.8, color="tab:blue", label="admitted (200)")
    right.bar(
        bins[:-1] + 0.5,
        per_s_no,
        width=0.8,
        bottom=per_s_ok,
        color="tab:red",
        label="refused (429)",
    )
    right.set_xlim(0, duration_s)
    right.set_xlabel("virtual time (s)")
    right.set_ylabel("requests per second")
    right.set_title(f"{run.requests} requests sent in {duration_s} s")
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig

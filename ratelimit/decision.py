"""The answer every limiter gives: one immutable `Decision` per check."""

from __future__ import annotations

from dataclasses import dataclass, field


def _ceil_seconds(ms: int) -> int:
    return -(-ms // 1000)


@dataclass(frozen=True, slots=True)
class Decision:
    """Outcome of one rate-limit check.

    `retry_after` is whole seconds rounded up, so a client that honours it is never
    told to come back before it would be admitted; it is at least 1 when rejected
    and 0 when allowed. `degraded` marks a decision made by the failure policy
    because Redis could not be asked. `decided_at_ms` is the time in ms the script
    decided at, on the limiter's clock (the app's, an injected one, or Redis's TIME;
    ms since the epoch for the real ones); None for degraded decisions. It is left
    out of equality, so two identical answers given at different times compare equal.
    `lease` is the lease id an admitted `ConcurrencyLimiter.acquire` holds (to pass to
    `release`); None for every other decision, and left out of equality too. `tier` is,
    for a `TieredLimiter`'s decision made by Redis, the index in `limiter.rates` of the
    tier that binds (whose limit, remaining and waits the decision carries); None for
    every other decision.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    degraded: bool = False
    decided_at_ms: int | None = field(default=None, compare=False)
    lease: str | None = field(default=None, compare=False)
    tier: int | None = None

    @property
    def retry_after(self) -> int:
        """Seconds to wait before the same request would be admitted (0 if allowed)."""
        if self.allowed:
            return 0
        return max(1, _ceil_seconds(self.retry_after_ms))

    @property
    def reset_after(self) -> int:
        """Seconds, rounded up, until the full budget is available again."""
        return _ceil_seconds(self.reset_after_ms)

"""Exceptions raised by the limiters."""


class RateLimiterUnavailable(RuntimeError):
    """Redis could not answer a check (down, refusing, or slower than the timeout).

    Raised only under the `on_error="raise"` policy; the original error is chained
    as `__cause__`.
    """

"""Rate limits on FastAPI / Starlette routes: a dependency, the standard headers, and
errors answered as `application/problem+json`.

    import ratelimit
    from fastapi import Depends, FastAPI
    from ratelimit.http import install, rate_limit

    app = FastAPI()
    install(app)                                        # 429/503/4xx as problem+json
    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(), "10/s", on_error="deny")
    geofence = rate_limit(limiter, scope="geofence")    # one limiter for the app's lifetime

    @app.get("/within", dependencies=[Depends(geofence)])
    async def within(...): ...

What a request goes through (`RateLimit.__call__`):

1. **Identity** (`ratelimit.identity.RequestIdentity`, built once per route). The
   `x-api-key` header if present and not empty, else the client's address.
   `X-Forwarded-For` is read only when the peer that connected is one of
   `trusted_proxies`: then the address is the right-most entry that is not itself a
   trusted proxy, so whatever a client writes to the left of what its proxies appended
   changes nothing. From any other peer the header is ignored. IPv6 addresses count per
   /64 (`ipv6_prefix`), since one client usually holds a whole /64. An API key longer
   than `max_api_key_bytes` (256) answers 431, more than one `x-api-key` header 400;
   neither reaches Redis. The limiter hashes the identity into its key, so API keys are
   not stored readable in Redis. (The key is not authenticated here: a client that
   invents keys gets a fresh budget per key, so check keys before this, or limit by
   address only with `api_key_header=None`.)
2. **Cost.** `cost=` is an int, a function of the `Request` (sync or async), or a
   FastAPI dependency, `Depends(fn)`, whose own parameters FastAPI validates first: a
   malformed request then gets 422 and never touches Redis. A cost above the limit
   could never pass and answers 400.
3. **Check.** One `limiter.check(scope + identity, cost)`: one script call, atomic in
   Redis. The limiter is built once per app and reused (its script is loaded once,
   not per request).
4. **Answer.** Allowed: the endpoint runs, and its response carries `RateLimit-Policy`
   and `RateLimit` (plus `RateLimit-Limit/-Remaining/-Reset` with
   `legacy_headers=True`). Rejected: 429 with `Retry-After` (whole seconds, rounded
   up), `Retry-After-Ms` (the exact wait) and the same fields, body
   `application/problem+json`.

When Redis cannot answer, the limiter's `on_error` decides, mapped to HTTP:

- `"allow"` (fail-open): the request goes through, marked
  `X-RateLimit-Degraded: fail-open`, and a warning is logged on `ratelimit.http`;
- `"deny"` (fail-closed): 503 with `Retry-After: 1`, marked
  `X-RateLimit-Degraded: fail-closed`, and a warning;
- `"raise"`: the same 503: `RateLimiterUnavailable` never becomes a 500.

Any other exception from the check is treated like an unavailable Redis, under the
limiter's policy. 503 rather than 429: the client did nothing wrong, the server
cannot vouch for its budget right now. A degraded answer carries `RateLimit-Policy`
but no `RateLimit` field, since nobody knows the remaining quota.

The header fields follow draft-ietf-httpapi-ratelimit-headers-11 (`DRAFT`, 23 May
2026), whose wire format dates from -08: Structured Field lists whose policy name is
the route's scope.

    RateLimit-Policy: "geofence";q=10;w=1      quota q units per window of w seconds
    RateLimit: "geofence";r=0;t=1              r units available; t, the effective window

In -11, `t` is the number of seconds "within which the client can use no more than the
available quota": the time until `r` next grows. It is sent when the decision says it
(`effective_window_ms`), in whole seconds rounded up like Retry-After:

- on a 429, `t` equals `Retry-After` (the draft's own example does the same, and asks
  that Retry-After not point earlier than the end of the effective window); for a
  request of cost 1 that is exactly when `r` grows, under every algorithm;
- on a 200 from a fixed window, the time until its window ends; from GCRA, until its
  next unit (one every w / q seconds) comes back, to within a millisecond;
- on a 200 from the sliding log or the sliding-window counter, no `t`: their answer
  says when the whole quota is back (`Decision.reset_after`), not when the first unit
  is (the log's oldest entry leaving), and `t` is optional in the draft.

**Tiers.** With a `TieredLimiter` ("10/s" and "1000/h" on one identity) every tier is
a policy of its own, named by the scope and its window, and `RateLimit-Policy` lists
them all, shortest window first. `RateLimit` and `Retry-After` are the binding tier's
(`Decision.tier`), and `RateLimit` names it: on a 429 the tier that asks the longest
wait, on a 200 the tier with the fewest units left, its `t` as its algorithm says.

    RateLimit-Policy: "geofence-1s";q=10;w=1, "geofence-1h";q=1000;w=3600
    RateLimit: "geofence-1h";r=0;t=2917

A cost-weighted request takes `cost` units of `q`. `Retry-After` counts whole seconds,
so a client that honours it waits up to a second longer than needed; `Retry-After-Ms`
carries the limiter's own wait in milliseconds (`Decision.retry_after_ms`), the
convention many API clients read before `Retry-After`. It is not in any RFC: clients
that do not know it ignore it, and `retry_after_ms_header=False` leaves it out.

**Requests in flight.** `concurrency_limit(ConcurrencyLimiter(...), scope=...)` is a
dependency that holds a lease (`ratelimit.ConcurrencyLimiter`) for the whole request:
acquired before the endpoint runs, released once the response has been sent (FastAPI
runs a `yield` dependency's exit after the response), also when the endpoint raises
or the client goes away. Identities are the same as `RateLimit`'s (and the same
options). No lease free: 429 with `Retry-After` (and `Retry-After-Ms`), the time until
the earliest lease expires, an upper bound: a slot usually frees sooner, when a request
in flight ends. Redis down: the limiter's `on_error`, mapped as above (allow: through,
marked fail-open; deny or raise: 503). A release that fails is logged, never raised
(the lease expires after `lease_seconds`). `after=` a route's `RateLimit` solves that
first, so that a request over its rate, or with bad parameters, never takes a lease.

Endpoints that return their own `Response` object (FastAPI then drops the headers
a dependency set) take the dependency's value, a `RateLimitInfo`, and pass
`headers=info.headers`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import HTTPException, Request, Response
from fastapi.params import Depends as DependsParam
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from .decision import Decision
from .errors import RateLimiterUnavailable
from .identity import (
    API_KEY_HEADER,
    MAX_API_KEY_BYTES,
    BadIdentity,
    ClientIdentity,
    RequestIdentity,
    route_identity,
    route_identity_prefix,
)
from .rates import Rate
from .tiers import TieredCore

__all__ = [
    "API_KEY_HEADER",
    "DEGRADED_HEADER",
    "DRAFT",
    "MAX_API_KEY_BYTES",
    "PROBLEM_JSON",
    "QUOTA_EXCEEDED",
    "RETRY_AFTER_MS_HEADER",
    "ClientIdentity",
    "ConcurrencyLimit",
    "LeaseInfo",
    "Problem",
    "RateLimit",
    "RateLimitInfo",
    "decision_for",
    "concurrency_limit",
    "install",
    "problem_response",
    "rate_limit",
    "status_for",
]

log = logging.getLogger("ratelimit.http")

PROBLEM_JSON = "application/problem+json"
"""The media type of every error body once `install(app)` is called (RFC 9457)."""
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
"""Problem type for 429, as registered by draft-ietf-httpapi-ratelimit-headers."""
DEGRADED_HEADER = "X-RateLimit-Degraded"
"""Set on a response decided by the failure policy, Redis being out of reach."""
RETRY_AFTER_MS_HEADER = "Retry-After-Ms"
"""The exact wait of a 429 in milliseconds, beside `Retry-After`'s whole seconds."""
DRAFT = "draft-ietf-httpapi-ratelimit-headers-11"
"""The revision of the RateLimit header fields draft that `RateLimit` follows."""
UNAVAILABLE_RETRY_AFTER_S = 1

_SCOPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The fields an admitted request carries, by the names ASGI sends (lower-case bytes).
_RAW_NAMES = {
    name: name.lower().encode()
    for name in ("RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
}

CostFunction = Callable[[Request], int | Awaitable[int]]


# --- problem+json -----------------------------------------------------------------------


class Limiter(Protocol):
    """What `RateLimit` needs of a limiter: one of `ratelimit`'s (its `check` awaited) or
    of `ratelimit.sync`'s (its `check` run in a worker thread)."""

    @property
    def limit(self) -> int: ...

    @property
    def window_ms(self) -> int: ...

    def check(self, identity: str, cost: int = 1, /) -> Any: ...

    def key_for(self, identity: str, /) -> str: ...

    def validate_cost(self, cost: int, /) -> int: ...


class Problem(HTTPException):
    """An HTTP error answered as `application/problem+json` (RFC 9457) after `install(app)`.

    Without `install(app)` FastAPI's own handler still answers with the same status and
    headers, as plain JSON `{"detail": ...}`.
    """

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        type: str = "about:blank",
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.title = title
        self.type = type
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "title": self.title,
            "status": self.status_code,
            "detail": self.detail,
            **self.extra,
        }


def problem_response(problem: Problem) -> JSONResponse:
    """The problem as a response: its status, its headers, an RFC 9457 body."""
    return JSONResponse(
        problem.body(),
        status_code=problem.status_code,
        headers=problem.headers,
        media_type=PROBLEM_JSON,
    )


async def _problem_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Problem)
    return problem_response(exc)


def install(app: Starlette) -> None:
    """Answer every `Problem` (429, 503, 400, 431 from `RateLimit`) as problem+json."""
    app.add_exception_handler(Problem, _problem_handler)


# --- from a check to a status -------------------------------------------------------------


def decision_for(outcome: Decision | BaseException, limiter: Any) -> Decision:
    """What a route goes by after one check: the limiter's `Decision`, or, when the
    check raised, a degraded one: rejected for `RateLimiterUnavailable` (the limiter's
    `on_error="raise"`), else as the limiter's `on_error` says ("allow" admits)."""
    if isinstance(outcome, Decision):
        return outcome
    allowed = not isinstance(outcome, RateLimiterUnavailable) and (
        getattr(limiter, "on_error", None) == "allow"
    )
    retry_ms = 0 if allowed else UNAVAILABLE_RETRY_AFTER_S * 1000
    return Decision(allowed, limiter.limit, 0, retry_ms, retry_ms, degraded=True)


def status_for(decision: Decision) -> int:
    """The status a limited route answers: 200 when admitted (a fail-open admission
    too, marked degraded), 429 when rejected, 503 when the failure policy rejected
    because Redis could not be asked (the client did nothing wrong). A rejection
    carries `Retry-After: decision.retry_after`."""
    if decision.allowed:
        return 200
    return 503 if decision.degraded else 429


# --- the dependency -----------------------------------------------------------------------


def _window_name(rate: Rate) -> str:
    """A tier's window as its policy name ends: "1s", "10s", "1h", "250ms"."""
    window = str(rate).partition("/")[2]
    return window if window[0].isdigit() else f"1{window}"


def _check_scope(scope: Any, named_in: str) -> None:
    """ValueError unless `scope` can name a policy (in `named_in`)."""
    if not isinstance(scope, str) or not _SCOPE.fullmatch(scope):
        raise ValueError(
            "scope must be 1 to 64 characters of letters, digits, '.', '_' or '-' "
            f"(it names the policy in {named_in}), got {scope!r}"
        )


@dataclass(frozen=True)
class RateLimitInfo:
    """What the dependency hands the endpoint about an admitted request."""

    scope: str
    identity: ClientIdentity
    cost: int
    decision: Decision
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def degraded(self) -> bool:
        return self.decision.degraded


class RateLimit:
    """A FastAPI dependency that limits a route with `limiter` (see the module doc).

    Build it once per app, as `rate_limit(limiter, ...)`, and use it as
    `Depends(instance)`; the limiter is shared by all requests.

    - `scope`: the policy's name in the headers; routes with different scopes never
      share a budget. A `TieredLimiter`'s tiers are policies `<scope>-<window>`
      (`policy_names`), "geofence-1s" and "geofence-1h".
    - `cost`: an int, `fn(request) -> int` (or async), or `Depends(fn)`.
    - `trusted_proxies`: addresses or networks whose `X-Forwarded-For` is believed.
    - `api_key_header`: the header naming the client (None: addresses only);
      `max_api_key_bytes`: longer keys answer 431.
    - `ipv6_prefix`: IPv6 clients without a key count per prefix (default /64).
    - `legacy_headers`: also send `RateLimit-Limit`, `-Remaining` and `-Reset`.
    - `retry_after_ms_header`: send `Retry-After-Ms` (the exact wait) on a 429.
    """

    def __init__(
        self,
        limiter: Limiter,
        *,
        scope: str = "default",
        cost: int | CostFunction | DependsParam = 1,
        trusted_proxies: Iterable[str] = (),
        api_key_header: str | None = API_KEY_HEADER,
        max_api_key_bytes: int = MAX_API_KEY_BYTES,
        ipv6_prefix: int = 64,
        legacy_headers: bool = False,
        retry_after_ms_header: bool = True,
    ) -> None:
        _check_scope(scope, "the headers")
        if not callable(getattr(limiter, "check", None)):
            raise ValueError(f"limiter must have a check(identity, cost) method, got {limiter!r}")
        self.identities = RequestIdentity(
            api_key_header=api_key_header,
            max_api_key_bytes=max_api_key_bytes,
            trusted_proxies=trusted_proxies,
            ipv6_prefix=ipv6_prefix,
        )
        self.limiter = limiter
        self.scope = scope
        self.legacy_headers = bool(legacy_headers)
        self.retry_after_ms_header = bool(retry_after_ms_header)
        self._check_is_async = inspect.iscoroutinefunction(limiter.check)
        # What every request's identity and RateLimit field start with, made once.
        self._asks = {kind: route_identity_prefix(scope, kind) for kind in ("key", "address")}

        # One policy per tier: the scope alone for a single-rate limiter; for a
        # TieredLimiter the scope and each tier's window ("geofence-1s", "geofence-1h"),
        # every tier listed in RateLimit-Policy and the one that binds named in
        # RateLimit. A tier's decision is judged by that tier's own limiter.
        policies = limiter.tiers if isinstance(limiter, TieredCore) else (limiter,)
        self._tiered = isinstance(limiter, TieredCore)
        self._policies: tuple[Any, ...] = policies
        self.policy_names: tuple[str, ...] = (
            tuple(f"{scope}-{_window_name(tier.rate)}" for tier in policies)
            if self._tiered
            else (scope,)
        )
        # The draft's window is whole seconds; a sub-second window is advertised as 1 s.
        self.windows_s: tuple[int, ...] = tuple(
            max(1, math.ceil(policy.window_ms / 1000)) for policy in policies
        )
        self.limits: tuple[int, ...] = tuple(policy.limit for policy in policies)
        self.window_s = self.windows_s[0]
        self._states = tuple(f'"{name}";r=' for name in self.policy_names)
        self._remaining = self._states[0]
        self.policy = ", ".join(
            f'"{name}";q={limit};w={window_s}'
            for name, limit, window_s in zip(
                self.policy_names, self.limits, self.windows_s, strict=True
            )
        )
        self._raw_policy = (b"ratelimit-policy", self.policy.encode("latin-1"))
        # The largest cost any request could be admitted at: the smallest tier's limit.
        self._max_units = min(self.limits)
        self._smallest = self.limits.index(self._max_units)

        self._fixed_cost: int | None = None
        self._cost_function: CostFunction | None = None
        parameters = [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            inspect.Parameter(
                "response", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Response
            ),
        ]
        if isinstance(cost, DependsParam):
            # FastAPI solves (and validates) the cost's own parameters before calling us.
            parameters.append(
                inspect.Parameter(
                    "cost", inspect.Parameter.KEYWORD_ONLY, default=cost, annotation=int
                )
            )
        elif callable(cost):
            self._cost_function = cost
        else:
            self._fixed_cost = limiter.validate_cost(cost)
        # What FastAPI reads to decide what to inject: only these, never query parameters.
        self.__signature__ = inspect.Signature(parameters, return_annotation=RateLimitInfo)

    def __repr__(self) -> str:
        return f"RateLimit(scope={self.scope!r}, {self.limiter!r})"

    # -- identity ---------------------------------------------------------------------

    @property
    def trusted_proxies(self) -> tuple[Any, ...]:
        """The networks whose `X-Forwarded-For` is believed."""
        return self.identities.trusted_proxies

    @property
    def api_key_header(self) -> bytes | None:
        """The API key header's name, lower-case (None: addresses only)."""
        return self.identities.api_key_header

    @property
    def max_api_key_bytes(self) -> int:
        return self.identities.max_api_key_bytes

    @property
    def ipv6_prefix(self) -> int:
        return self.identities.ipv6_prefix

    def identify(self, request: Request) -> ClientIdentity:
        """The API key, else the client address (see the module doc); 400/431 if unusable."""
        scope = request.scope
        client = scope.get("client")
        try:
            return self.identities.of(scope.get("headers", ()), client[0] if client else None)
        except BadIdentity as exc:
            raise self._bad_request(exc.status, exc.title, exc.detail) from None

    def client_address(self, request: Request) -> str:
        """The client's address: the peer, or what trusted proxies say it forwarded for."""
        scope = request.scope
        client = scope.get("client")
        return self.identities.address(scope.get("headers", ()), client[0] if client else None)

    def limiter_identity(self, identity: ClientIdentity) -> str:
        """What the limiter is asked about: the scope and the identity
        (`ratelimit.identity.route_identity`), so routes never share a budget even when
        they share a limiter's prefix."""
        return route_identity(self.scope, identity.kind, identity.value)

    def key_for(self, api_key: str | None = None, *, address: str | None = None) -> str:
        """The Redis key holding the budget of `api_key` (or of `address`) in this scope.
        Without the app: `ratelimit.keys.route_key`, or `python -m ratelimit key`."""
        if (api_key is None) == (address is None):
            raise ValueError("give exactly one of api_key and address")
        identity = (
            ClientIdentity("key", api_key)
            if api_key is not None
            else ClientIdentity("address", address)  # type: ignore[arg-type]
        )
        return self.limiter.key_for(self.limiter_identity(identity))

    # -- headers ----------------------------------------------------------------------

    def effective_window_ms(self, decision: Decision) -> int | None:
        """The draft's `t` in ms: how long the client can use no more than the units it
        has left, when the decision says (see the module doc); None when it does not."""
        if not decision.allowed:
            return decision.retry_after_ms
        algorithm = getattr(self.limiter, "algorithm", None)
        if algorithm is None:
            return None
        # A tier's decision carries that tier's state: its own limiter is the policy.
        policy = self._policies[decision.tier or 0] if self._tiered else self.limiter
        window_ms: int | None = algorithm.effective_window_ms(policy, decision)
        return window_ms

    def headers_for(self, decision: Decision) -> dict[str, str]:
        """The rate-limit header fields for a decision (Retry-After when rejected)."""
        if decision.degraded:
            return {"RateLimit-Policy": self.policy}
        remaining = decision.remaining if decision.remaining > 0 else 0
        named = self._states[decision.tier or 0]  # the binding tier's (a tiered limiter)
        if not decision.allowed:
            state = f"{named}{remaining};t={decision.retry_after}"
        else:
            window_ms = self.effective_window_ms(decision)
            if window_ms is None:
                state = f"{named}{remaining}"
            else:  # whole seconds, rounded up
                state = f"{named}{remaining};t={-(-window_ms // 1000)}"
        headers = {"RateLimit-Policy": self.policy, "RateLimit": state}
        if self.legacy_headers:
            # The older drafts' reset: seconds until the quota is whole again.
            reset = decision.reset_after if decision.allowed else decision.retry_after
            headers["RateLimit-Limit"] = str(decision.limit)
            headers["RateLimit-Remaining"] = str(remaining)
            headers["RateLimit-Reset"] = str(reset)
        if not decision.allowed:
            headers["Retry-After"] = str(decision.retry_after)
            if self.retry_after_ms_header:
                headers[RETRY_AFTER_MS_HEADER] = str(max(1, decision.retry_after_ms))
        return headers

    # -- the request ------------------------------------------------------------------

    async def __call__(
        self, request: Request, response: Response, cost: Any = None
    ) -> RateLimitInfo:
        # The admitted request is the one to make cheap: no work here that a 200 does
        # not need (problem bodies and log lines are built only when they are sent).
        scope = request.scope
        client = scope.get("client")
        headers_in = scope.get("headers", ())
        try:
            identity = self.identities.of(headers_in, client[0] if client else None)
        except BadIdentity as exc:
            raise self._bad_request(exc.status, exc.title, exc.detail) from None
        if self._fixed_cost is not None:
            cost = self._fixed_cost
        else:
            cost = await self._cost(request, cost)
        who = self._asks[identity.kind] + identity.value  # = self.limiter_identity(identity)
        try:
            if self._check_is_async:
                decision = await self.limiter.check(who, cost)
            else:
                decision = await run_in_threadpool(self.limiter.check, who, cost)
        except ValueError as exc:  # an identity the limiter's keys cannot hold
            raise self._bad_request(400, "Bad Request", str(exc)) from None
        except Exception as exc:  # never a 500 because the limiter failed
            decision = self._failed(request, exc)
        else:
            if decision.degraded:
                self._warn(request, decision, "")
        headers = self.headers_for(decision)
        if decision.degraded:
            headers[DEGRADED_HEADER] = "fail-closed" if not decision.allowed else "fail-open"
        if not decision.allowed:
            if status_for(decision) == 503:
                raise self._unavailable(decision, headers)
            raise self._too_many(decision, cost, headers)
        out = response.headers
        if out.raw:  # another dependency set some: replace theirs of the same name
            out.update(headers)
        else:
            out.raw.append(self._raw_policy)
            for name, value in headers.items():
                if name != "RateLimit-Policy":
                    raw_name = _RAW_NAMES.get(name) or name.lower().encode("latin-1")
                    out.raw.append((raw_name, value.encode("latin-1")))
        info = RateLimitInfo(self.scope, identity, cost, decision, headers)
        # As `request.state.rate_limit = info` does, without building a State.
        scope.setdefault("state", {})["rate_limit"] = info
        return info

    async def _cost(self, request: Request, solved: Any) -> int:
        value = solved
        if self._cost_function is not None:
            try:
                value = self._cost_function(request)
                if inspect.isawaitable(value):
                    value = await value
            except ValueError:
                raise self._bad_request(
                    400, "Bad Request", "the request's cost could not be computed from it"
                ) from None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TypeError(f"a cost function must return an int >= 1, got {value!r}")
        if value > self._max_units:
            per = "per window"
            if self._tiered:
                smallest = self._smallest
                per = f'per {self.windows_s[smallest]} s by policy "{self.policy_names[smallest]}"'
            raise self._bad_request(
                400,
                "Bad Request",
                f"this request costs {value} units, more than the {self._max_units} "
                f"allowed {per}: it could never be admitted",
            )
        return value

    def _failed(self, request: Request, exc: Exception) -> Decision:
        """The decision when the check raised, under the limiter's policy, and logged."""
        return _failed(request, self.scope, self.limiter, exc)

    def _warn(self, request: Request, decision: Decision, reason: str) -> None:
        _warn_degraded(request, self.scope, decision, reason)

    def _too_many(self, decision: Decision, cost: int, headers: dict[str, str]) -> Problem:
        retry = decision.retry_after
        tier = decision.tier or 0  # the tier that binds: the one asking the longest wait
        name = self.policy_names[tier]
        return Problem(
            429,
            "Quota Exceeded",
            f'Policy "{name}" allows {self.limits[tier]} units per {self.windows_s[tier]} s; '
            f"this request costs {cost} and {max(0, decision.remaining)} remain. "
            f"Retry after {retry} s.",
            type=QUOTA_EXCEEDED,
            headers=headers,
            # Member names as the draft spells its own ("violated-policies").
            extra={"retry-after": retry, "violated-policies": [name]},
        )

    def _unavailable(self, decision: Decision, headers: dict[str, str]) -> Problem:
        retry = decision.retry_after  # the failure policy's 1 s
        return Problem(
            503,
            "Service Unavailable",
            "The rate limiter could not be consulted, so the request was not served. "
            f"Retry after {retry} s.",
            headers={**headers, "Retry-After": str(retry)},
            extra={"retry-after": retry},
        )

    def _bad_request(self, status: int, title: str, detail: str) -> Problem:
        return Problem(status, title, detail)


def _failed(request: Request, scope: str, limiter: Any, exc: Exception) -> Decision:
    """The decision when a limiter raised, under its failure policy, and logged."""
    if isinstance(exc, RateLimiterUnavailable):  # on_error="raise"
        reason = f": {exc}"
    else:  # anything else is treated like an unavailable Redis
        reason = f": rate limit check failed: {type(exc).__name__}: {exc}"
    decision = decision_for(exc, limiter)
    _warn_degraded(request, scope, decision, reason)
    return decision


def _warn_degraded(request: Request, scope: str, decision: Decision, reason: str) -> None:
    if decision.allowed:
        outcome = "let through unchecked (fail-open)"
    else:
        outcome = "answered 503 (fail-closed)"
    log.warning(
        "rate limiter unavailable: %s %s %s, scope %s%s",
        request.method,
        request.url.path,
        outcome,
        scope,
        reason,
    )


rate_limit = RateLimit
"""`rate_limit(limiter, scope=..., cost=..., ...)`: the dependency for a route (see
`RateLimit` for the options); the name reads well in `Depends(rate_limit(...))`."""


# --- requests in flight -------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseInfo:
    """What `ConcurrencyLimit` hands the endpoint: the lease its request holds."""

    scope: str
    identity: ClientIdentity
    decision: Decision

    @property
    def lease(self) -> str | None:
        """The lease id (None for a fail-open admission, which holds none)."""
        return self.decision.lease


class ConcurrencyLimit:
    """A FastAPI dependency that holds a lease of `limiter` (a `ConcurrencyLimiter`,
    asyncio or sync) while a request is in flight (see the module doc). Build it once
    per app, as `concurrency_limit(limiter, scope=...)`, and use it as
    `Depends(instance)`. `scope`, `trusted_proxies`, `api_key_header`,
    `max_api_key_bytes`, `ipv6_prefix` and `retry_after_ms_header` mean what they mean
    for `RateLimit`; a route's two dependencies may share a scope (their keys differ).

    `after`: a dependency (the route's `RateLimit`, say) that FastAPI solves first. A
    request it refuses (429, or a 422 from the parameters its cost validates) then
    never takes a lease; FastAPI calls it once per request even when the route names
    it too.
    """

    def __init__(
        self,
        limiter: Any,
        *,
        scope: str = "default",
        trusted_proxies: Iterable[str] = (),
        api_key_header: str | None = API_KEY_HEADER,
        max_api_key_bytes: int = MAX_API_KEY_BYTES,
        ipv6_prefix: int = 64,
        retry_after_ms_header: bool = True,
        after: Any = None,
    ) -> None:
        _check_scope(scope, "problems")
        if after is not None and not callable(after):
            raise ValueError(f"after must be a dependency (a callable), got {after!r}")
        if not all(callable(getattr(limiter, name, None)) for name in ("acquire", "release")):
            raise ValueError(
                f"limiter must have acquire(identity) and release(identity, lease), got {limiter!r}"
            )
        self.identities = RequestIdentity(
            api_key_header=api_key_header,
            max_api_key_bytes=max_api_key_bytes,
            trusted_proxies=trusted_proxies,
            ipv6_prefix=ipv6_prefix,
        )
        self.limiter = limiter
        self.scope = scope
        self.retry_after_ms_header = bool(retry_after_ms_header)
        self._is_async = inspect.iscoroutinefunction(limiter.acquire)
        self._asks = {kind: route_identity_prefix(scope, kind) for kind in ("key", "address")}
        parameters = [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
            for name, annotation in (("request", Request), ("response", Response))
        ]
        if after is not None:  # solved before this one, which needs it to succeed
            parameters.append(
                inspect.Parameter(
                    "after", inspect.Parameter.KEYWORD_ONLY, default=DependsParam(after)
                )
            )
        self.__signature__ = inspect.Signature(parameters, return_annotation=LeaseInfo)

    def __repr__(self) -> str:
        return f"ConcurrencyLimit(scope={self.scope!r}, {self.limiter!r})"

    def key_for(self, api_key: str | None = None, *, address: str | None = None) -> str:
        """The Redis key holding the leases of `api_key` (or of `address`) in this scope."""
        if (api_key is None) == (address is None):
            raise ValueError("give exactly one of api_key and address")
        kind, value = ("key", api_key) if api_key is not None else ("address", address)
        key: str = self.limiter.key_for(route_identity(self.scope, kind, value))  # type: ignore[arg-type]
        return key

    async def __call__(
        self, request: Request, response: Response, after: Any = None
    ) -> AsyncIterator[LeaseInfo]:
        scope = request.scope
        client = scope.get("client")
        try:
            identity = self.identities.of(scope.get("headers", ()), client[0] if client else None)
        except BadIdentity as exc:
            raise Problem(exc.status, exc.title, exc.detail) from None
        who = self._asks[identity.kind] + identity.value
        try:
            if self._is_async:
                decision = await self.limiter.acquire(who)
            else:
                decision = await run_in_threadpool(self.limiter.acquire, who)
        except Exception as exc:  # never a 500 because the limiter failed
            decision = _failed(request, self.scope, self.limiter, exc)
        else:
            if decision.degraded:
                _warn_degraded(request, self.scope, decision, "")
        if not decision.allowed:
            raise self._refused(decision)
        if decision.degraded:
            response.headers[DEGRADED_HEADER] = "fail-open"
        info = LeaseInfo(self.scope, identity, decision)
        scope.setdefault("state", {})["lease"] = info
        try:
            yield info
        finally:
            if decision.lease is not None:
                # Shielded: a cancelled request still gives its lease back in full.
                await asyncio.shield(self._release(who, decision.lease))

    async def _release(self, who: str, lease: str) -> None:
        try:
            if self._is_async:
                await self.limiter.release(who, lease)
            else:
                await run_in_threadpool(self.limiter.release, who, lease)
        except Exception as exc:  # the lease expires by itself; the response is sent
            log.warning("lease not released (it expires by itself), scope %s: %s", self.scope, exc)

    def _refused(self, decision: Decision) -> Problem:
        retry = decision.retry_after
        headers = {"Retry-After": str(retry)}
        if decision.degraded:  # the failure policy's 1 s
            headers[DEGRADED_HEADER] = "fail-closed"
            return Problem(
                503,
                "Service Unavailable",
                "The concurrency limiter could not be consulted, so the request was not "
                f"served. Retry after {retry} s.",
                headers=headers,
                extra={"retry-after": retry},
            )
        if self.retry_after_ms_header:
            headers[RETRY_AFTER_MS_HEADER] = str(max(1, decision.retry_after_ms))
        return Problem(
            429,
            "Too Many Requests In Flight",
            f'Policy "{self.scope}" allows {self.limiter.limit} requests in flight at once, '
            f"and {self.limiter.limit} are. Retry after {retry} s at the latest (when the "
            "oldest lease expires; a slot usually frees sooner, as a request ends).",
            type=QUOTA_EXCEEDED,
            headers=headers,
            extra={"retry-after": retry, "violated-policies": [self.scope]},
        )


concurrency_limit = ConcurrencyLimit
"""`concurrency_limit(limiter, scope=...)`: the dependency that holds a lease while a
request is in flight (see `ConcurrencyLimit`)."""

"""TLS: every limiter through `ratelimit.connect(url)` / `connect_sync(url)` with a
`rediss://` URL, against a private redis-server that serves TLS only, with a CA and
certificate made on the fly (`RedisServer(tls=True)`).

With certificate verification on (the CA in `ssl_cert_reqs=required`, and the host
name checked against the certificate's subjectAltName), every kind of check decides
exactly as over plain TCP. A client that does not trust the server's CA gets the
failure policy, within its timeout, and the message says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, algorithms
from ratelimit.devtools.server import RedisServer, make_certificates
from tests.conftest import _missing
from tests.core.workload import SPECS, close, run_workload

pytestmark = pytest.mark.private_redis

KINDS = ["async", "sync"]
POLICIES = ["raise", "allow", "deny"]
VERIFY = "&ssl_cert_reqs=required&ssl_check_hostname=true"  # redis-py's defaults, spelled out


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not RedisServer.tls_available():
        _missing("redis-server and openssl are needed for the TLS tests")
    with RedisServer(tmp_path_factory.mktemp("tls"), tls=True) as server:
        yield server


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not RedisServer.available():
        _missing("redis-server is not installed; the TLS tests compare with a plain one")
    with RedisServer(tmp_path_factory.mktemp("plain")) as server:
        yield server


def connect(kind: str, url: str, timeout: float = 1.0) -> Any:
    if kind == "sync":
        return ratelimit.connect_sync(url, timeout=timeout)
    return ratelimit.connect(url, timeout=timeout)


async def test_connect_makes_a_verifying_tls_client(tls_server):
    url = tls_server.url + VERIFY
    assert url.startswith(f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs=")
    for kind in KINDS:
        client = connect(kind, url)
        pool = client.connection_pool
        assert pool.connection_class.__name__ == "SSLConnection"  # sync or asyncio
        options = pool.connection_kwargs
        assert options["ssl_ca_certs"] == str(tls_server.ca_path)
        assert options["ssl_cert_reqs"] == "required" and options["ssl_check_hostname"] is True
        await close(client)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_limiter_over_tls_decides_as_over_plain_tcp(kind, tls_server, plain_server):
    tls_admin, plain_admin = tls_server.client(), plain_server.client()
    try:
        over_tls = await run_workload(kind, tls_server.url + VERIFY, tls_admin, "rl", "raise")
        over_tcp = await run_workload(kind, plain_server.url, plain_admin, "rl", "raise")
        # The same keys were written over TLS, so the checks really went there.
        written = {k.decode().split(":")[1] for k in tls_admin.scan_iter(match="rl:*")}
    finally:
        tls_admin.close()
        plain_admin.close()
    assert over_tls.failures == []
    assert over_tls.outcomes == over_tcp.outcomes
    decisions = [o for _, o in over_tls.outcomes if isinstance(o, Decision)]
    assert any(d.allowed for d in decisions) and any(not d.allowed for d in decisions)
    assert written == {*SPECS, algorithms.LEASES.name}


@pytest.mark.parametrize("kind", KINDS)
async def test_localhost_matches_the_certificate_too(kind, tls_server):
    url = tls_server.url.replace("127.0.0.1", "localhost") + VERIFY
    client = connect(kind, url)
    # A log, not a fixed window: three checks that straddle a minute's boundary (a slow
    # TLS handshake on a busy machine) would all be admitted by a window of 60 s.
    limiter = algorithms.COMPACT_LOG.build(kind, client, 60, 2, f"localhost-{kind}")
    outcomes = []
    for _ in range(3):
        decision = limiter.check("who")
        outcomes.append(await decision if kind == "async" else decision)
    await close(client)
    assert [d.allowed for d in outcomes] == [True, True, False]
    assert not any(d.degraded for d in outcomes)


async def _outcome(limiter: Any, many: bool) -> tuple[list[Decision | Exception], float]:
    started = time.monotonic()
    try:
        if isinstance(limiter, ratelimit.sync.SyncLimiter):
            call = limiter.check_many if many else limiter.check
            result = await asyncio.to_thread(call, ["a", "b"] if many else "a")
        else:
            result = await (limiter.check_many(["a", "b"]) if many else limiter.check("a"))
    except RateLimiterUnavailable as exc:
        result = exc
    outcomes = result if isinstance(result, list) else [result]
    return outcomes, time.monotonic() - started


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trust", ["another CA", "the system's CAs"])
async def test_a_client_that_does_not_trust_the_ca_gets_the_failure_policy(
    trust, kind, tls_server, tmp_path, caplog
):
    if trust == "another CA":
        other = make_certificates(tmp_path / "other", client=False)
        url = f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs={other.ca_cert}{VERIFY}"
    else:
        url = f"rediss://127.0.0.1:{tls_server.port}/0?{VERIFY[1:]}"
    timeout = 1.0
    for spec in SPECS:
        algorithm = algorithms.get(spec)
        options = {"storage": "compact"} if spec == algorithms.COMPACT_LOG.name else {}
        for on_error in POLICIES:
            client = connect(kind, url, timeout)
            limiter = algorithm.build(
                kind, client, 60, 5, "rl", on_error=on_error, timeout=timeout, **options
            )
            for many in (False, True):
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="ratelimit"):
                    outcomes, took = await _outcome(limiter, many)
                # Refused at the handshake: the message below names the certificate,
                # where a hang would end in a timeout. The bound only catches a hang
                # that outlives every timeout (a busy machine took 2.2 s to load the
                # system's CAs and refuse, so it is not a timing target).
                assert took < 10 * timeout, (spec, on_error, many, took)
                if on_error == "raise":
                    (failure,) = outcomes
                    assert isinstance(failure, RateLimiterUnavailable), failure
                    messages = [str(failure)]
                else:
                    assert len(outcomes) == (2 if many else 1)
                    for decision in outcomes:
                        assert isinstance(decision, Decision) and decision.degraded, decision
                        assert decision.allowed == (on_error == "allow")
                    messages = [r.getMessage() for r in caplog.records if r.name == "ratelimit"]
                    assert len(messages) == len(outcomes)
                for message in messages:
                    assert "CERTIFICATE_VERIFY_FAILED" in message, message
            await close(client)

"""Instrumented clients see every check, whenever the instrumentation was installed.

A lone check normally skips redis-py's per-command machinery (ratelimit.lanes). A
client whose `execute_command` is not redis-py's own (OpenTelemetry's redis
instrumentation, a plain wrapper) must see every check anyway: before `import
ratelimit`, after it, or after the limiter has already checked. Each case runs in a
fresh interpreter, since instrumenting patches redis-py's classes for the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.real_redis

# What the child runs: `{install}` is spliced in at the place the case names.
CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    URL, PREFIX, WHERE = sys.argv[1], sys.argv[2], sys.argv[3]
    {tracer}
    if WHERE == "before-import":
        install()
    import redis, redis.asyncio, ratelimit, ratelimit.sync
    if WHERE == "before-connect":
        install()

    async def main():
        client = redis.asyncio.Redis.from_url(URL)
        limiter = ratelimit.SlidingWindowLimiter(client, 60, 1000, prefix=PREFIX + ":a")
        await limiter.check("warm")  # scripts loaded before counting
        if WHERE == "after-use":
            install()
        start = seen()
        for i in range(20):
            await limiter.check("one-by-one")
        lone = seen() - start
        start = seen()
        await asyncio.gather(*(limiter.check("together") for _ in range(30)))
        together = seen() - start
        await limiter.aclose()
        await client.aclose()
        return lone, together

    lone, together = asyncio.run(main())
    sync_client = redis.Redis.from_url(URL)
    limiter = ratelimit.sync.SlidingWindowLimiter(sync_client, 60, 1000, prefix=PREFIX + ":s")
    limiter.check("warm")
    start = seen()
    for i in range(20):
        limiter.check("one-by-one")
    sync_lone = seen() - start
    print(json.dumps({{"lone": lone, "together": together, "sync": sync_lone}}))
    """
)

# OpenTelemetry's own instrumentor, spans kept in memory; a script call is counted
# once per EVALSHA/EVAL in a span's name (a pipeline's span names each command).
OTEL = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.instrumentation.redis import RedisInstrumentor
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
def install():
    RedisInstrumentor().instrument(tracer_provider=provider)
def seen():
    names = [s.name for s in exporter.get_finished_spans()]
    return sum(n.split().count("EVALSHA") + n.split().count("EVAL") for n in names)
"""

# A plain wrapper of both clients' `execute_command`, as a user might write one.
WRAPPER = """
import redis, redis.asyncio
calls = [0]
def install():
    sync_original = redis.Redis.execute_command
    async_original = redis.asyncio.Redis.execute_command
    def counted(self, *args, **options):
        calls[0] += args[0] in ("EVALSHA", "EVAL")
        return sync_original(self, *args, **options)
    async def acounted(self, *args, **options):
        calls[0] += args[0] in ("EVALSHA", "EVAL")
        return await async_original(self, *args, **options)
    redis.Redis.execute_command = counted
    redis.asyncio.Redis.execute_command = acounted
def seen():
    return calls[0]
"""

WHEN = ["before-import", "before-connect", "after-use"]


def run_child(tracer: str, where: str, url: str, prefix: str) -> dict[str, int]:
    code = CHILD.format(tracer=tracer)
    done = subprocess.run(
        [sys.executable, "-c", code, url, prefix, where],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("where", WHEN)
def test_opentelemetry_records_every_check(where, real_redis_url, prefix):
    seen = run_child(OTEL, where, real_redis_url, prefix)
    # Lone checks: a span each; concurrent ones: spans whose names count every call.
    assert seen == {"lone": 20, "together": 30, "sync": 20}


@pytest.mark.parametrize("where", WHEN)
def test_a_plain_wrapper_sees_every_lone_check(where, real_redis_url, prefix):
    """A wrapper of `execute_command` sees each check sent on its own (batches go
    through the client's pipeline, which does not call that method)."""
    seen = run_child(WRAPPER, where, real_redis_url, prefix)
    assert seen["lone"] == 20 and seen["sync"] == 20

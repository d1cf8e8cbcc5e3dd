"""Least privilege: the ACL rule `ratelimit.acl` generates, proven on a private Redis.

A user created with exactly `acl.rule(PREFIX)` runs every limiter (the four algorithms,
the compact log and the concurrency leases, asyncio and sync): single checks,
`check_many`, concurrent checks batched by the auto-pipeline, peeks and resets, the rare
script paths (a compact log moving past chunks and emptying, a key of another type,
Redis's own clock) and recovery from SCRIPT FLUSH, including the EVAL fallback when a
second flush lands during the reload; and it decides exactly as the same workload does
on an admin connection. Then each permission of the rule is taken away in turn: the same
workload meets the failure policy (degraded decisions under allow/deny,
RateLimiterUnavailable under raise), never another exception, and every message names
the permission that is missing. So the rule is enough, and every part of it is needed.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import ratelimit
import ratelimit.sync
from ratelimit import Decision, RateLimiterUnavailable, acl, algorithms, autopipeline
from ratelimit.__main__ import main
from ratelimit.devtools.server import RedisServer
from tests.conftest import _missing
from tests.core.checks import check, check_many
from tests.core.workload import SPECS, close, connect, run_workload

pytestmark = pytest.mark.private_redis

PREFIX = "rl"
USER, PASSWORD = "limiter", "s3cret-for-tests"
ADMIN_PREFIX = "admin"  # the admin's twin workload writes here, out of the user's keys
KINDS = ["async", "sync"]
POLICIES = ["raise", "allow", "deny"]


# The rule ------------------------------------------------------------------------


def test_the_rule_is_the_key_pattern_and_the_commands():
    text = acl.rule(PREFIX)
    assert text.startswith(f"resetkeys ~{PREFIX}:* resetchannels -@all +")
    granted = [part[1:] for part in text.split() if part.startswith("+")]
    assert granted == acl.commands()
    assert len(set(granted)) == len(granted)  # no duplicates
    assert granted[:4] == ["evalsha", "eval", "script|load", "unlink"]
    assert set(acl.script_commands()) <= set(granted)
    assert all(name == name.lower() for name in granted)


def test_every_script_command_is_read_from_the_lua_sources():
    # Every call site of every script (the prelude included) names one of the commands;
    # the epilogue only answers, and the tiers' driver only calls the tiers' functions.
    sources = sorted((Path(ratelimit.__file__).parent / "lua").glob("*.lua"))
    assert {p.stem for p in sources} >= {a.script for a in algorithms.ALGORITHMS} | {"prelude"}
    for path in sources:
        text = path.read_text()
        called = acl.calls_in(text)
        if path.stem in ("epilogue", "tiers"):
            assert called == [] and "redis." not in text
            continue
        assert called, f"{path.name} calls no command"
        assert set(called) <= set(acl.script_commands())
        code = [line.split("--")[0] for line in text.splitlines()]
        sites = sum(line.count("redis.call(") + line.count("redis.pcall(") for line in code)
        assert sites >= len(called)
        for name in called:  # each appears as a call of that very command
            assert any(
                f"call('{name.upper()}'" in line or f"pcall('{name.upper()}'" in line
                for line in code
            ), name


def test_calls_are_parsed_from_code_only_and_must_be_literal():
    source = """
    -- redis.call('FLUSHALL') in a comment is not a call
    local a = redis.call('ZADD', key, 1, 'm')
    local b = redis.pcall("Get", key)
    local c = redis.call( 'ZADD' , key, 2, 'n')
    """
    assert acl.calls_in(source) == ["zadd", "get"]
    with pytest.raises(RuntimeError, match="not a literal"):
        acl.calls_in("local cmd = 'DEL'\nredis.call(cmd, key)")


def test_options_add_select_and_wait_and_more_prefixes():
    base = acl.commands()
    assert "select" not in base and "wait" not in base
    assert set(acl.commands(db=3)) - set(base) == {"select"}
    assert set(acl.commands(wait_replicas=1)) - set(base) == {"wait"}
    assert set(acl.commands(health_check=True)) - set(base) == {"ping"}
    assert set(acl.commands(cluster=True)) - set(base) == {"cluster|slots", "command"}
    text = acl.rule(["rl", "demo"])
    assert text.startswith("resetkeys ~rl:* ~demo:* resetchannels -@all ")
    full = acl.rule("rl", user="svc")
    assert full == f"ACL SETUSER svc reset on ><password> {acl.rule('rl')}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prefix": "a*"}, "prefix must not contain glob"),
        ({"prefix": "a{b}"}, "prefix must not contain braces"),
        ({"prefix": ""}, "prefix must be a non-empty string"),
        ({"prefix": []}, "prefix must name at least one"),
        ({"user": "two words"}, "user must be"),
        ({"user": ""}, "user must be"),
        ({"db": -1}, "db must be"),
        ({"db": True}, "db must be"),
        ({"wait_replicas": -2}, "wait_replicas must be"),
        ({"wait_replicas": 1.5}, "wait_replicas must be"),
        ({"health_check": "yes"}, "health_check must be"),
        ({"cluster": 1}, "cluster must be"),
    ],
)
def test_bad_options_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        acl.rule(**kwargs)


def test_the_command_line_prints_the_rule(capsys):
    assert main(["acl"]) == 0
    assert capsys.readouterr().out == acl.rule("rl") + "\n"
    assert main(["acl", "--prefix", "rl", "--prefix", "demo", "--user", "svc", "--db", "2"]) == 0
    assert capsys.readouterr().out == acl.rule(["rl", "demo"], user="svc", db=2) + "\n"
    assert main(["acl", "--wait-replicas", "1", "--health-check", "--cluster"]) == 0
    expected = acl.rule("rl", wait_replicas=1, health_check=True, cluster=True)
    assert capsys.readouterr().out == expected + "\n"
    with pytest.raises(SystemExit) as exit:
        main(["acl", "--prefix", "a*"])
    assert exit.value.code == 2 and "glob" in capsys.readouterr().err
    out = subprocess.run(
        [sys.executable, "-m", "ratelimit", "acl", "--prefix", "rl"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout == acl.rule("rl") + "\n"


def test_describe_names_what_redis_7_0_leaves_out():
    script = (
        "local a = 1\n"
        "local b = redis.call('ZADD', KEYS[1], 1, 'x')\n"
        "return redis.pcall('GET', KEYS[1])\n"
    )
    in_call = redis.exceptions.ResponseError(
        "The user executing the script can't run this command or subcommand "
        "script: 0123abcd, on @user_script:2."
    )
    assert "'zadd'" in acl.describe(in_call, script, "rl")
    assert acl.describe(in_call, script, "rl").startswith(f"ResponseError: {in_call}")
    in_pcall = redis.exceptions.ResponseError(
        "The user executing the script can't run this command or subcommand"
    )
    assert "'get'" in acl.describe(in_pcall, script) and "'zadd'" not in acl.describe(
        in_pcall, script
    )
    keys = redis.exceptions.NoPermissionError(
        "this user has no permissions to access one of the keys used as arguments"
    )
    assert "~rl:*" in acl.describe(keys, script, "rl")
    other = ConnectionError("refused")
    assert acl.describe(other, script, "rl") == "ConnectionError: refused"


# The rule on a real server ---------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not RedisServer.available():
        _missing("redis-server is not installed; the ACL tests need a private one")
    with RedisServer(tmp_path_factory.mktemp("acl")) as started:
        yield started


@pytest.fixture(scope="module")
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def set_user(admin: redis.Redis, rule_parts: list[str]) -> None:
    """(Re)create USER with exactly `rule_parts` after `reset on >PASSWORD`."""
    admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rule_parts)


def user_url(server: RedisServer) -> str:
    return f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0"


def without(part: str) -> list[str]:
    parts = acl.rule(PREFIX).split()
    assert part in parts
    return [p for p in parts if p != part]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_user_with_exactly_the_rule_runs_every_limiter_like_an_admin(
    kind, server, admin, monkeypatch, caplog
):
    full = acl.rule(PREFIX, user=USER).split()
    assert full[:6] == ["ACL", "SETUSER", USER, "reset", "on", f">{acl.PASSWORD_PLACEHOLDER}"]
    full[5] = f">{PASSWORD}"
    admin.execute_command(*full)  # exactly the generated command
    assert admin.execute_command("ACL", "DRYRUN", USER, "GET", "other:key") != b"OK"

    batches: list[int] = []
    plain = autopipeline._plain

    async def spy(entries: list[Any], *args: Any, **kwargs: Any) -> None:
        batches.append(len(entries))
        await plain(entries, *args, **kwargs)

    monkeypatch.setattr(autopipeline, "_plain", spy)
    caplog.set_level(logging.WARNING, logger="ratelimit")
    mine = await run_workload(kind, user_url(server), admin, PREFIX, "raise")
    theirs = await run_workload(kind, server.url, admin, ADMIN_PREFIX, "raise")

    assert mine.failures == [] and mine.reset_failures == [] and caplog.records == []
    assert mine.outcomes == theirs.outcomes
    allowed = [o for _, o in mine.outcomes if isinstance(o, Decision) and o.allowed]
    rejected = [o for _, o in mine.outcomes if isinstance(o, Decision) and not o.allowed]
    assert allowed and rejected  # both paths of every script ran
    if kind == "async":
        assert batches and max(batches) >= 3  # concurrent checks shared round trips
    # The user wrote its limiters' keys, nothing else.
    mine_keys = {k.decode() for k in admin.scan_iter(match=f"{PREFIX}:*")}
    assert {k.split(":")[1] for k in mine_keys} == {*SPECS, algorithms.LEASES.name}


# Every single permission of the rule, each taken away in turn.
PERMISSIONS = [f"+{name}" for name in acl.commands()] + [f"~{PREFIX}:*"]


def _named(permission: str) -> str:
    """How a message names the permission: Redis's 'zadd', or the key pattern."""
    return permission if permission.startswith("~") else f"'{permission[1:]}'"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("permission", PERMISSIONS)
async def test_a_missing_permission_gets_the_failure_policy_naming_it(
    permission, kind, server, admin, caplog
):
    set_user(admin, without(permission))
    named = _named(permission)
    for on_error in POLICIES:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ratelimit"):
            work = await run_workload(kind, user_url(server), admin, PREFIX, on_error)
        assert work.failures or work.reset_failures, f"nothing needed {permission} ({on_error})"
        for failure in work.reset_failures:  # a reset that failed raises, whatever on_error
            assert named in str(failure), str(failure)
        if on_error == "raise":
            for failure in work.failures:
                assert isinstance(failure, RateLimiterUnavailable), failure
                assert named in str(failure), str(failure)
            continue
        warnings = [r.getMessage() for r in caplog.records if r.name == "ratelimit"]
        assert len(warnings) == len(work.failures) + len(work.reset_failures)
        for message in warnings:
            assert named in message, message
        for failure in work.failures:
            assert isinstance(failure, Decision) and failure.degraded
            assert failure.allowed == (on_error == "allow")


@pytest.mark.parametrize(
    ("url_tail", "option", "command"),
    [
        ("/1", {"db": 1}, "select"),  # redis-py sends SELECT on connecting
        ("/0?health_check_interval=1", {"health_check": True}, "ping"),  # PING when idle
        ("/0?protocol=3", None, None),  # HELLO 3 AUTH ...: allowed for every user
    ],
)
def test_connection_options_and_the_commands_they_need(server, admin, url_tail, option, command):
    url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}{url_tail}"
    for granted in (False, True) if option else (False,):
        set_user(admin, acl.rule(PREFIX, **(option if granted else {})).split())
        client = ratelimit.connect_sync(url)
        limiter = ratelimit.sync.FixedWindowLimiter(client, 60, 3, PREFIX, on_error="raise")
        outcomes: list[Any] = []
        for _ in range(2):
            try:
                outcomes.append(limiter.check(f"conn-{command}-{granted}"))
            except RateLimiterUnavailable as exc:
                outcomes.append(exc)
            # Past health_check_interval (whole seconds) the next command is preceded
            # by a PING; the other URLs do not care.
            time.sleep(1.1 if command == "ping" else 0)
        client.close()
        if granted or command is None:
            assert [getattr(o, "allowed", o) for o in outcomes] == [True, True], outcomes
        else:  # refused on connecting (SELECT) or on the idle connection's PING
            assert any(isinstance(o, RateLimiterUnavailable) for o in outcomes), outcomes
            for failure in outcomes:
                if isinstance(failure, RateLimiterUnavailable):
                    assert f"'{command}'" in str(failure), str(failure)


@pytest.mark.parametrize("kind", KINDS)
async def test_wait_replicas_needs_wait_and_the_rule_with_it_works(kind, server, admin, tmp_path):
    admin.config_set("repl-diskless-sync-delay", 0)  # a private server: sync at once
    replica = RedisServer(tmp_path, args=("--replicaof", "127.0.0.1", str(server.port)))
    with replica:
        deadline = time.monotonic() + 10
        while True:  # online, and acknowledging writes (it has loaded the sync)
            admin.set("replication-probe", time.monotonic())
            if admin.wait(1, 100) >= 1:
                break
            assert time.monotonic() < deadline, "the replica never acknowledged a write"
            await asyncio.sleep(0.05)
        algorithm = algorithms.FIXED_WINDOW
        for granted in (False, True):
            set_user(admin, acl.rule(PREFIX, wait_replicas=1 if granted else 0).split())
            client = connect(kind, user_url(server))
            limiter = algorithm.build(
                kind, client, 60, 2, PREFIX, on_error="raise", timeout=5, wait_replicas=1
            )
            admin.delete(limiter.key_for(f"wait-{kind}"))
            outcomes = []
            for _ in range(3):
                try:
                    outcomes.append(await check(limiter, f"wait-{kind}"))
                except RateLimiterUnavailable as exc:
                    outcomes.append(exc)
            await close(client)
            if granted:
                assert all(isinstance(o, Decision) for o in outcomes), [str(o) for o in outcomes]
                assert [o.allowed for o in outcomes] == [True, True, False], outcomes
                assert not any(o.degraded for o in outcomes)
            else:  # the script admitted; the WAIT after it was refused
                assert all(isinstance(o, RateLimiterUnavailable) for o in outcomes[:2])
                assert all("'wait'" in str(o) for o in outcomes[:2]), outcomes


@pytest.mark.parametrize("kind", KINDS)
async def test_the_cluster_rule_runs_every_limiter_on_a_cluster(kind, cluster):
    prefix = f"acl-{uuid.uuid4().hex[:8]}"  # the cluster is shared by the session

    def set_users(parts: list[str]) -> None:  # ACL users are per node
        for port in cluster.ports:
            node = redis.Redis(port=port, socket_timeout=5)
            node.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *parts)
            node.close()

    url = cluster.url.replace("redis+cluster://", f"redis+cluster://{USER}:{PASSWORD}@", 1)
    try:
        set_users(acl.rule(prefix, cluster=True).split())
        client = connect(kind, url)
        for spec in SPECS:
            algorithm = algorithms.get(spec)
            options = {"storage": "compact"} if spec == algorithms.COMPACT_LOG.name else {}
            limiter = algorithm.build(kind, client, 60, 3, prefix, **options)
            single = [await check(limiter, "one") for _ in range(4)]
            assert [d.allowed for d in single] == [True, True, True, False], spec
            batch = await check_many(limiter, ["a", "b", "a", "a", "a"])
            assert [d.allowed for d in batch] == [True, True, True, True, False], spec
            if kind == "async":
                together = await asyncio.gather(*(limiter.check(f"t{i % 3}") for i in range(12)))
                assert sum(d.allowed for d in together) == 9, spec
            assert not any(d.degraded for d in single + batch)
        await close(client)

        # Without COMMAND (redis-py reads the commands' key positions with it), checks
        # get the failure policy, naming it. (Without CLUSTER SLOTS the client cannot
        # start at all.)
        set_users([p for p in acl.rule(prefix, cluster=True).split() if p != "+command"])
        if kind == "sync":
            with pytest.raises(redis.exceptions.NoPermissionError, match="'command'"):
                ratelimit.connect_sync(url)
        else:
            client = connect(kind, url)
            limiter = algorithms.SLIDING_LOG.build(kind, client, 60, 3, prefix)
            with pytest.raises(RateLimiterUnavailable, match="'command'"):
                await limiter.check("one")
            await close(client)
    finally:
        for port in cluster.ports:
            node = redis.Redis(port=port, socket_timeout=5)
            node.execute_command("ACL", "DELUSER", USER)
            stale = list(node.scan_iter(match=f"{prefix}:*"))
            if stale:
                for key in stale:
                    node.delete(key)  # one at a time: keys of one node, any slots
            node.close()

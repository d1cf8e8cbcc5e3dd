"""The least-privilege Redis ACL rule for a limiter, generated from what it sends.

    from ratelimit import acl
    acl.rule("rl")                  # 'resetkeys ~rl:* resetchannels -@all +evalsha ...'
    acl.rule("rl", user="limiter")  # 'ACL SETUSER limiter reset on ><password> resetkeys ...'

Scripts run with the permissions of the user who calls them, so the user needs the
commands every script calls (read here from the `redis.call` and `redis.pcall` lines of
`ratelimit/lua/*.lua`, so a new script command can never be left out) besides what the
client itself sends: EVALSHA for every check and peek, SCRIPT LOAD after NOSCRIPT (a
restart, a failover, SCRIPT FLUSH), EVAL when a second flush lands between that reload
and the retry (see `ratelimit.plan`), and UNLINK for `reset`. On connecting redis-py
sends AUTH or HELLO, which every user may run, and CLIENT SETINFO, whose refusal it
ignores (and which Redis 7.0 does not know: a rule naming it would not load there);
SELECT only for a database other than 0, and PING only with `health_check_interval`. A
Redis Cluster client also asks for CLUSTER SLOTS and COMMAND (`commands()` takes all
three as options). Every key a limiter writes is `<prefix>:<algorithm>:...`, hence the
key pattern `~<prefix>:*`.

`python -m ratelimit acl --prefix rl` prints the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache

from . import scripts, validation

# What the client sends itself, besides the scripts' own commands.
CLIENT_COMMANDS: tuple[str, ...] = ("evalsha", "eval", "script|load", "unlink")

# What redis-py's cluster clients send to learn the slot map and the commands' keys.
CLUSTER_COMMANDS: tuple[str, ...] = ("cluster|slots", "command")

PASSWORD_PLACEHOLDER = "<password>"

_CALL = re.compile(r"redis\.p?call\s*\(\s*(['\"]?)([A-Za-z|]*)\1?")
_PCALL = re.compile(r"redis\.pcall\s*\(\s*['\"]([A-Za-z|]+)['\"]")
_COMMENT = re.compile(r"--[^\n]*")
_USER = re.compile(r"[^\s\x00-\x1f\x7f]+")


def calls_in(source: str) -> list[str]:
    """The commands a Lua source runs through `redis.call` / `redis.pcall`, lower-cased,
    in order of first appearance. A call whose command is not a literal name raises
    RuntimeError: no rule could be generated for it."""
    found: dict[str, None] = {}
    for match in _CALL.finditer(_COMMENT.sub("", source)):
        quote, name = match.groups()
        if not quote or not name:
            raise RuntimeError(f"a script calls a command that is not a literal name: {match[0]!r}")
        found[name.lower()] = None
    return list(found)


@cache
def script_commands() -> tuple[str, ...]:
    """Every command the limiters' Lua scripts call, lower-cased, sorted."""
    names: set[str] = set()
    for text in scripts.files().values():
        names.update(calls_in(text))
    return tuple(sorted(names))


def commands(
    *, db: int = 0, wait_replicas: int = 0, health_check: bool = False, cluster: bool = False
) -> list[str]:
    """The commands a limiter's Redis user needs: the client's own (EVALSHA, EVAL,
    SCRIPT LOAD, UNLINK), SELECT when it connects to database `db` other than 0,
    WAIT when its limiters use `wait_replicas` > 0, PING when its client checks idle
    connections (`health_check_interval` in the URL), what a Redis Cluster client asks
    every node (`cluster`: CLUSTER SLOTS and COMMAND), then its scripts' commands."""
    for name, flag in (("health_check", health_check), ("cluster", cluster)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ValueError(f"db must be an integer >= 0, got {db!r}")
    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
        raise ValueError(f"wait_replicas must be an integer >= 0, got {wait_replicas!r}")
    extra = (["select"] if db else []) + (["wait"] if wait_replicas else [])
    extra += ["ping"] if health_check else []
    extra += list(CLUSTER_COMMANDS) if cluster else []
    return [*CLIENT_COMMANDS, *extra, *script_commands()]


def key_patterns(prefix: str | Iterable[str] = "rl") -> list[str]:
    """`~<prefix>:*` for each prefix: every key a limiter of that prefix writes."""
    prefixes = [prefix] if isinstance(prefix, str) else list(prefix)
    if not prefixes:
        raise ValueError("prefix must name at least one key prefix")
    return [f"~{validation.prefix(p)}:*" for p in prefixes]


def rule(
    prefix: str | Iterable[str] = "rl",
    *,
    user: str | None = None,
    db: int = 0,
    wait_replicas: int = 0,
    health_check: bool = False,
    cluster: bool = False,
) -> str:
    """The ACL rule a limiter with key prefix `prefix` (one, or several) needs: its key
    pattern, no Pub/Sub channels, and only the commands of `commands()`.

    With `user`, the whole command that creates or resets that user,
    `ACL SETUSER <user> reset on ><password> <rule>`, with `<password>` to replace (on
    a Redis Cluster, on every node: ACL users are not shared between nodes).
    """
    parts = ["resetkeys", *key_patterns(prefix), "resetchannels", "-@all"]
    needed = commands(
        db=db, wait_replicas=wait_replicas, health_check=health_check, cluster=cluster
    )
    parts += [f"+{name}" for name in needed]
    text = " ".join(parts)
    if user is None:
        return text
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise ValueError(f"user must be a non-empty Redis user name without spaces, got {user!r}")
    return f"ACL SETUSER {user} reset on >{PASSWORD_PLACEHOLDER} {text}"


# Redis 7.0 (7.2 names the command) refuses a command inside a script without naming
# it: "The user executing the script can't run this command or subcommand", followed
# by "script: <sha>, on @user_script:<line>." for a redis.call, and by nothing for a
# redis.pcall whose error the script returns as it is. The script's source names the
# command on that line.
_DENIED_IN_SCRIPT = "can't run this command or subcommand"
_KEY_DENIED = ("access one of the keys", "access at least one of the keys")
_LINE = re.compile(r"@user_script:(\d+)")


def denied_commands(message: str, script: str) -> list[str]:
    """The commands of `script` that an ACL refusal inside it (as Redis 7.0 words it,
    without the command) can be about: the ones called on the line it names, else
    (no line: an error a redis.pcall returned) the script's pcall'd commands."""
    line = _LINE.search(message)
    if line is None:
        return list(dict.fromkeys(m.lower() for m in _PCALL.findall(_COMMENT.sub("", script))))
    lines = script.splitlines()
    number = int(line[1])
    return calls_in(lines[number - 1]) if 0 < number <= len(lines) else []


def describe(exc: BaseException, script: str | bytes = "", prefix: str | None = None) -> str:
    """`<type>: <message>` for an error from a check, adding what Redis leaves out
    when an ACL refused it: the refused command of `script`, or the key pattern
    `prefix` needs."""
    text = f"{type(exc).__name__}: {exc}"
    message = str(exc)
    if _DENIED_IN_SCRIPT in message:
        if isinstance(script, bytes):
            script = script.decode("utf-8", "replace")
        named = denied_commands(message, script)
        if named:
            listed = " or ".join(f"'{name}'" for name in named)
            text += f" [ACL: the script's {listed} command is not allowed for this user]"
    elif prefix is not None and any(part in message for part in _KEY_DENIED):
        text += f" [ACL: the user's key pattern must allow ~{prefix}:*]"
    return text

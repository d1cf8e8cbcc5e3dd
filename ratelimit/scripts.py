"""The Lua scripts, kept as .lua files beside this module so people can read them, and
what each one needs from the client.

A limiter's options never change once it is built, so its script carries them as
constants: a few `local name = value` lines (`constants`) written in front of the shared
`prelude.lua` and the algorithm's own file. Each check then sends only what changes
from one check to the next (see prelude.lua): its time, its cost, and the text a key
that holds nothing would be set to (`opener`), worked out here rather than in Lua,
where formatting a number costs Redis as much as a command. Every distinct policy is
one script in Redis's script cache (a few kB each).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

from .backends import is_embedded

# A real Redis gets every script behind this line, which makes it a Redis 7 script with
# no flags: one that may write and so may not start while memory is over `maxmemory`.
# Redis then refuses the whole check before its first command, and the failure policy
# decides. Without it (a pre-7 "eval script") Redis checks memory at each command, and
# once a script has run any write allowed on a full server it lets the rest run, so as
# not to stop it half-way: the sliding log's trim (ZREMRANGEBYSCORE, whether it deletes
# anything or not) let its ZADD run on a full Redis, and the client saw a normal admit.
# The shebang needs Redis 7.0 or later (`ratelimit.doctor` checks the version); the
# embedded fakeredis cannot parse it and gets the plain source.
SHEBANG = "#!lua\n"

# The oldest Redis that runs a script with a shebang (and SET with both NX and GET).
MIN_REDIS_VERSION = (7, 0, 0)

# The compact log's 6-byte times are offset by 2^47 (lua/compact_log.lua).
COMPACT_OFFSET = 2**47

# 2^53: integers up to it are exact in a Lua number (a double).
EXACT = 9007199254740992

Constant = int | float | str
Opener = Callable[[int, int], bytes]


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def files() -> dict[str, str]:
    """Every `ratelimit/lua/*.lua` file's text (the prelude too), by file name."""
    folder = resources.files(__package__).joinpath("lua")
    return {p.name: p.read_text("utf-8") for p in folder.iterdir() if p.name.endswith(".lua")}


@cache
def source(name: str, *, shebang: bool = False) -> str:
    """The script `ratelimit/lua/<name>.lua` between the shared `prelude.lua` and
    `epilogue.lua`, without any limiter's constants (for reading); with
    `shebang=True` behind `#!lua` too."""
    body = _read("prelude") + _read(name).rstrip("\n") + "\n" + _read("epilogue")
    return SHEBANG + body if shebang else body


def _literal(value: Constant) -> str:
    if isinstance(value, str):
        if not value.isdigit():
            raise ValueError(f"a text constant must be digits, got {value!r}")
        return f"'{value}'"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same double
    return str(int(value))


def header(constants: dict[str, Constant]) -> str:
    """The `local name = value` lines that give a script its limiter's options."""
    return "".join(f"local {name} = {_literal(value)}\n" for name, value in constants.items())


def for_client(name: str, client: Any, constants: dict[str, Constant] | None = None) -> str:
    """The script `name` as `client` should load it: with the shebang on a real Redis
    (not on the embedded fakeredis), and `constants` written in front of the prelude."""
    text = header(constants or {}) + source(name)
    return text if is_embedded(client) else SHEBANG + text


def constants(policy: Any) -> dict[str, Constant]:
    """What the scripts read as constants for `policy` (see prelude.lua and each file)."""
    window, limit = policy.window_ms, policy.limit
    out: dict[str, Constant] = {
        "window": window,
        "limit": limit,
        "ttl_slack": policy.ttl_slack_ms,
        # Text: Redis would format a number argument with %.17g, costly per call.
        "ttl": str(policy.state_ttl_ms() + policy.ttl_slack_ms),
        "L1": policy.max_remaining() + 1,  # radixes of the one-integer reply
        "R": 2 * window + 1,
    }
    name = policy.algorithm.name
    if name == "fw":
        m = 2 * limit + 1
        out.update(M=m, P=EXACT // m)
    elif name == "gcra":
        interval = window / limit
        out.update(burst=policy.burst, interval=interval, tolerance=interval * policy.burst)
    return out


def opener(policy: Any) -> Opener | None:
    """`open(now_ms, cost)`: ARGV[3] of a check sent at `now_ms`, the state a key that
    holds nothing (or only state that has aged out) takes when the check is admitted.
    None for the sorted-set log, whose new entries are members, not one value."""
    window = policy.window_ms
    name = policy.algorithm.name
    if name == "fw":
        m = 2 * policy.limit + 1
        p = EXACT // m
        return lambda now, cost: b"%d" % (now // window % p * m + cost)
    if name == "swc":
        return lambda now, cost: b"%d:%d:0" % (now // window, cost)
    if name == "gcra":
        interval = window / policy.limit
        # The same double the script computes (tat + interval * cost, tat = now), as
        # text that reads back exactly; %.17g, as Redis writes a Lua number, so that a
        # whole TAT is stored as an integer (88 bytes a key, not 120).
        return lambda now, cost: b"%.17g" % (now + interval * cost)
    if name == "logc":
        # The header of a new log: s (entries ever written) = cost, b = 0, o = now.
        zero = (0).to_bytes(6, "big")

        def log_header(now: int, cost: int) -> bytes:
            if not 0 <= now + COMPACT_OFFSET < 2 * COMPACT_OFFSET:
                return b""  # out of the 6-byte range: the script works it out
            return cost.to_bytes(6, "big") + zero + (now + COMPACT_OFFSET).to_bytes(6, "big")

        return log_header
    return None

"""The Lua scripts, kept as .lua files beside this module so people can read them, and
the text a client loads.

A limiter's options never change once it is built, so its script carries them as
constants: a few `local name = value` lines (`header`, from its algorithm's
`Algorithm.constants`) written in front of the shared `prelude.lua` and the algorithm's
own file. Each check then sends only what changes from one check to the next (see
prelude.lua): its time, its cost, and the text a key that holds nothing would be set
to (the algorithm's `Algorithm.opener`), worked out in Python rather than in Lua, where
formatting a number costs Redis as much as a command. Every distinct policy is one
script in Redis's script cache (a few kB each).
"""

from __future__ import annotations

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

# A peek's script (the same text with the constant `dry` = 1, see prelude.lua) is
# declared read-only: Redis refuses any write it tried, runs it on a full server, and
# lets a read-only replica run it.
READ_ONLY_SHEBANG = "#!lua flags=no-writes\n"

# The oldest Redis that runs a script with a shebang (and SET with both NX and GET).
MIN_REDIS_VERSION = (7, 0, 0)

Constant = int | float | str


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
    (not on the embedded fakeredis), and `constants` written in front of the prelude.
    With the constant `dry` = 1 (a peek's script) the shebang declares it read-only."""
    constants = constants or {}
    text = header(constants) + source(name)
    if is_embedded(client):
        return text
    return (READ_ONLY_SHEBANG if constants.get("dry") == 1 else SHEBANG) + text


def tiered(tiers: list[tuple[str, dict[str, Constant]]], client: Any, *, dry: int = 0) -> str:
    """The script that decides several tiers at once (`lua/tiers.lua`): for each tier,
    its algorithm's file `name` with its `constants`, as a function of `dry` on KEYS[i]
    and ARGV[2 + i]; as `client` should load it (see `for_client`). `dry=1`: a peek's."""
    # Redis's clock, where a tier reads it (a time far ahead, see prelude.lua's `skew`),
    # is read once for every tier and both passes, so that they all judge alike.
    clock = (
        "local server_time\n"
        "local function read_time()\n"
        "  server_time = server_time or redis.call('TIME')\n"
        "  return server_time\n"
        "end\n"
    )
    parts = [header({"dry": dry}), _read("prelude"), clock, "local tiers = {}\n"]
    for i, (name, constants) in enumerate(tiers, start=1):
        own = {k: v for k, v in constants.items() if k != "dry"}  # the function's argument
        body = _read(name).rstrip("\n").replace("ARGV[3]", f"ARGV[{2 + i}]")
        body = body.replace("redis.call('TIME')", "read_time()")
        parts += [
            f"tiers[{i}] = function(dry)\n",
            header(own),
            f"local key = KEYS[{i}]\n",
            "local ok, left, retry_ms, reset_ms, decided_at\n",
            "repeat\n",
            body,
            "\nuntil true\n",
            "return ok, left, retry_ms, reset_ms, decided_at\n",
            "end\n",
        ]
    parts.append(_read("tiers"))
    text = "".join(parts)
    if is_embedded(client):
        return text
    return (READ_ONLY_SHEBANG if dry == 1 else SHEBANG) + text

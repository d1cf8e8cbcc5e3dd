"""The Lua scripts, kept as .lua files beside this module so people can read them."""

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

# The oldest Redis that runs a script with a shebang.
MIN_REDIS_VERSION = (7, 0, 0)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def files() -> dict[str, str]:
    """Every `ratelimit/lua/*.lua` file's text (the prelude too), by file name."""
    folder = resources.files(__package__).joinpath("lua")
    return {p.name: p.read_text("utf-8") for p in folder.iterdir() if p.name.endswith(".lua")}


@cache
def source(name: str, *, shebang: bool = False) -> str:
    """The script `ratelimit/lua/<name>.lua`, behind the shared `prelude.lua`; with
    `shebang=True` (for a real Redis) behind `#!lua` too, as the limiters load it."""
    body = _read("prelude") + "\n" + _read(name)
    return SHEBANG + body if shebang else body


def for_client(name: str, client: Any) -> str:
    """The source of script `name` that `client` should load: with the shebang on a
    real Redis, without it on the embedded fakeredis."""
    return source(name, shebang=not is_embedded(client))

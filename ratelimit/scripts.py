"""The Lua scripts, kept as .lua files beside this module so people can read them."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def source(name: str) -> str:
    """Text of `ratelimit/lua/<name>.lua`."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")

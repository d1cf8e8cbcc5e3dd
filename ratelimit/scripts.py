"""The Lua scripts, kept as .lua files beside this module so people can read them."""

from __future__ import annotations

from functools import cache
from importlib import resources


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def source(name: str) -> str:
    """The script `ratelimit/lua/<name>.lua`, behind the shared `prelude.lua`."""
    return _read("prelude") + "\n" + _read(name)

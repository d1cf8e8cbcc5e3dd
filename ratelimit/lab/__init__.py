"""The lab: the simulation engine that drives the limiters, and one module per chapter.

Data flows one way:

    traffic (`traffic`, a table of requests)
      -> a limiter (a Lua script through `ratelimit`, or a `reference` model)
      -> decisions (`simulation.replay`: the same table with `allowed`, ...)
      -> measures (`metrics`, `capacity`, `memory`)
      -> figures (`chapters.<chapter>`, drawn with `plotting`)

Nothing downstream changes what is upstream: a replay drives a copy of the limiter it
is given, and metrics only read decision tables. `classic` holds the classic recipe,
wrong on purpose, that the chapters and the benchmark measure ours against.

Needs the `lab` extra (numpy, pandas, matplotlib, tqdm); the library does not.
"""

from .simulation import replay, replay_async

__all__ = ["replay", "replay_async"]

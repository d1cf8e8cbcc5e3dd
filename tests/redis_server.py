"""The private redis-server helper now lives in the library (`ratelimit.server`), shared
by the tests and the notebooks; this module keeps the tests' old import path working."""

from ratelimit.server import RedisServer, free_port

__all__ = ["RedisServer", "free_port"]

"""Process helpers for the tests. The private redis-server itself lives in the library
(`ratelimit.server`, shared with the notebooks); this module keeps the tests' old
import path working and holds the checks that a stopped process really is gone."""

import os
import socket

from ratelimit.server import RedisServer, free_port

__all__ = ["RedisServer", "free_port", "pid_alive", "port_is_free"]


def port_is_free(port: int) -> bool:
    """True when nothing listens on 127.0.0.1:`port`."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def pid_alive(pid: int) -> bool:
    """True while a process `pid` exists (a stopped child that nobody reaped would
    still answer; Popen.wait reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

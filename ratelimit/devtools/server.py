"""A private, throw-away redis-server on a free loopback port.

For notebooks that need a real Redis (memory figures) when none is configured, and for
tests that restart, stop or break a server without touching anyone else's:

    from ratelimit.devtools.server import RedisServer

    if RedisServer.available():                   # redis-server on PATH?
        with RedisServer() as server:             # started on enter, stopped on exit
            client = server.client()              # or redis.Redis.from_url(server.url)
            client.ping()

The server keeps nothing on disk (`--save '' --appendonly no`), listens on 127.0.0.1
only, and runs in a working directory of its own: a new temporary one (removed by
`close()` and on leaving the `with` block) unless `workdir` is given. `stop()` ends
exactly the process this object started, by its PID, and `restart()` brings it back
on the same port, empty. A server still running when the Python process exits is
stopped then too.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from .process import LocalProcess, free_port

__all__ = ["RedisServer", "free_port"]

EXECUTABLE = "redis-server"
_START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it


class RedisServer(LocalProcess):
    """One redis-server process: start, wait until it answers, stop by PID, restart.

    - `workdir`: where the server runs and writes its log (`redis-<port>.log`); by
      default a temporary directory of its own, removed by `close()`.
    - `port`: default a free loopback port, chosen at the first `start()` and kept
      by `restart()` so that clients can reconnect to the same `url`.
    - `args`: extra `redis-server` options, e.g. `("--maxmemory", "10mb")`.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        port: int | None = None,
        *,
        args: tuple[str, ...] | list[str] = (),
        executable: str = EXECUTABLE,
    ) -> None:
        super().__init__(workdir, port if port is not None else free_port())
        self._fixed_port = port is not None
        self.args = tuple(args)
        self.executable = executable

    # Queries -----------------------------------------------------------------------

    @staticmethod
    def available(executable: str = EXECUTABLE) -> bool:
        """True when `redis-server` (or `executable`) is on PATH."""
        return shutil.which(executable) is not None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous client for this server (keyword arguments go to `from_url`)."""
        return redis.Redis.from_url(self.url, **kwargs)

    # Life cycle --------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers (a no-op if it runs).

        Raises `FileNotFoundError` when the executable is missing and `RuntimeError`
        (with the end of the server's log) when it exits or stays silent.
        """
        if self.running:
            return self
        if not self.available(self.executable):
            raise FileNotFoundError(f"{self.executable} is not on PATH")
        self._workdir("ratelimit-redis-")
        # Only a port this object picked itself, and only before it was ever used, may
        # be swapped for another when someone else grabbed it first.
        attempts = 1 if self._fixed_port else _START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                self._fixed_port = True  # from now on restarts keep this port and URL
                return self
            except _PortTaken:
                if attempt == attempts:
                    raise RuntimeError(self._failure("exited at start (port taken?)")) from None
                self.port = free_port()
        return self

    def _options(self) -> list[str]:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",  # no snapshots
            "appendonly": "no",  # no append-only file
            "dir": str(self.workdir),
            "enable-debug-command": "local",  # DEBUG SLEEP etc., from loopback only
        }
        return [part for name, value in options.items() for part in (f"--{name}", value)]

    def _start_once(self, timeout: float) -> None:
        process = self._spawn([self.executable, *self._options(), *self.args], self._log_path())
        deadline = time.monotonic() + timeout
        client = redis.Redis(  # no retries of its own: this loop is the retry
            host="127.0.0.1",
            port=self.port,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            while True:
                if process.poll() is not None:
                    self.process = self._box[0] = None
                    if "Address already in use" in self._log_tail():
                        raise _PortTaken
                    raise RuntimeError(self._failure("exited at start"))
                try:
                    # Our process, not another server already listening on the port,
                    # and done loading any data set (until then it answers LOADING).
                    info = client.info()
                    if info.get("process_id") == process.pid and not info.get("loading"):
                        return
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(self._failure(f"did not answer within {timeout} s"))
                time.sleep(0.02)
        finally:
            client.close()

    def restart(self) -> None:
        """Stop and start again on the same port: the data set is gone afterwards."""
        self.stop()
        self.start()

    # Diagnostics -------------------------------------------------------------------

    def _log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"redis-{self.port}.log"

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self._log_path().read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        where = f"{self.executable} on 127.0.0.1:{self.port}"
        return f"{where} {what}; its log ends:\n{self._log_tail()}"


class _PortTaken(Exception):
    pass

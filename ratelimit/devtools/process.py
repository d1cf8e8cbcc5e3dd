"""A child process on a free loopback port that only its owner stops, by PID.

The base of `server.RedisServer` and `demo_server.DemoServer`: both start
one process, wait until it answers, and must never leave it running, also when the
caller forgets to stop it (it is stopped when the object is collected or Python exits).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["LocalProcess", "Managed", "free_port", "pid_alive", "port_is_free"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class Managed:
    """A context manager for whatever has `start()` and `close()`: `with X() as x:`."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class LocalProcess(Managed):
    """One child process, its working directory and its log; stopped by its PID.

    Subclasses implement `start()` (spawn with `_spawn`, then wait until it answers).
    `workdir=None` makes a temporary directory of its own, removed by `close()`.
    """

    def __init__(self, workdir: str | Path | None = None, port: int | None = None) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        # Stops the process when this object is collected or the interpreter exits
        # (`weakref.finalize` runs at exit); it holds a one-element box, never `self`.
        self._box: list[subprocess.Popen[bytes] | None] = [None]
        self._finalizer = weakref.finalize(self, _terminate, self._box)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _workdir(self, prefix: str) -> Path:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir

    def _spawn(
        self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` with its output appended to `log_path`."""
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
            )  # fmt: skip
        self._box[0] = self.process
        return self.process

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Freeze the process for the block (SIGSTOP) and thaw it after (SIGCONT): it
        keeps its connections and answers nothing meanwhile, like a stuck host."""
        if not self.running or self.pid is None:
            raise RuntimeError(f"{self!r} is not running")
        os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the process this object started (SIGTERM, then SIGKILL); a no-op if none."""
        process, self.process = self.process, None
        self._box[0] = None
        if process is not None:
            _stop(process, timeout)

    def close(self) -> None:
        """Stop the process and remove the working directory if this object made it."""
        self.stop()
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"{type(self).__name__}(port={self.port}, {state})"


def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _terminate(box: list[subprocess.Popen[bytes] | None]) -> None:
    process = box[0]
    if process is not None:
        box[0] = None
        _stop(process, 5.0)

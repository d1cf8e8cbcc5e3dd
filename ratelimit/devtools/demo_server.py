"""The demo API (`ratelimit.demo`) under uvicorn in a subprocess, stopped by its PID."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Self

from .process import LocalProcess, free_port

__all__ = ["DemoServer"]


class DemoServer(LocalProcess):
    """`uvicorn ratelimit.demo:app` on a free loopback port, stopped by its PID.

        with DemoServer() as server:          # started on enter, answering /healthz
            httpx.get(server.url + "/within?lng=13.4&lat=52.5&radius=500")

    `redis_url=None` runs the server on the embedded backend (REDIS_URL removed from
    its environment); a URL points it at that Redis. The server's output goes to a log
    file of its own, quoted when it fails to start. A server still running when this
    Python process exits is stopped then.
    """

    def __init__(self, *, redis_url: str | None = None, args: Iterable[str] = ()) -> None:
        super().__init__()
        self.redis_url = redis_url
        self.args = tuple(args)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"http://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        return [
            sys.executable, "-m", "uvicorn", "ratelimit.demo:app",
            "--host", "127.0.0.1", "--port", str(port),
            "--no-proxy-headers", "--log-level", "warning", *self.args,
        ]  # fmt: skip

    def start(self, timeout: float = 30.0) -> Self:
        """Start the server and return once `/healthz` answers (RuntimeError if it won't)."""
        if self.running:
            return self
        import httpx

        env = dict(os.environ)
        env.pop("REDIS_URL", None)
        if self.redis_url is not None:
            env["REDIS_URL"] = self.redis_url
        workdir = self._workdir("ratelimit-demo-")
        for _attempt in range(3):  # a free port can be taken before uvicorn binds it
            self.port = free_port()
            log_path = workdir / f"uvicorn-{self.port}.log"
            process = self._spawn(self.command(self.port), log_path, env)
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)
            text = log_path.read_text(errors="replace")
            self.stop()
            if "address already in use" not in text.lower():
                tail = "\n".join(text.splitlines()[-15:])
                self.close()
                raise RuntimeError(
                    f"uvicorn did not start within {timeout} s; its log ends:\n{tail}"
                )
        self.close()
        raise RuntimeError("uvicorn could not bind a free port in 3 attempts")

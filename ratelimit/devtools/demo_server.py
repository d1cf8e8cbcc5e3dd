"""The demo API (`ratelimit.demo`) under uvicorn in a subprocess, stopped by its PID.

One process by default; `workers=N` runs uvicorn's `--workers N`: a supervisor and N
worker processes sharing one listening socket (and, given `redis_url`, one Redis).

With several workers, uvicorn (0.54 on Linux) binds that socket itself without naming
its protocol, so asyncio does not see a TCP socket and leaves Nagle's algorithm on for
every connection: a response written as headers then body waits for the client's
delayed ACK, about 40 ms per request after a connection's first. `tcp_nodelay=True`
(the default) starts uvicorn's own command line through `main()` here, which marks the
listening socket as TCP before the workers get it, so they answer as one process does;
`tcp_nodelay=False` runs uvicorn as shipped.

`app_options` builds the app with `ratelimit.demo.create_app(**app_options)` in each
worker instead of the default `ratelimit.demo:app`, through `app_from_environment`
(uvicorn's `--factory`; the options travel as JSON in `RATELIMIT_DEMO_OPTIONS`). That
app has two additions for measuring the limiter, both off the limited path:

- `/unlimited/tiles/{z}/{x}/{y}.png`: the tiles route without its limit (same
  validation, same tile), the baseline the limiter's added latency is measured against;
- with `"trace_headers": True`: every admitted request of a limited route carries the
  time its check was decided at, on the limiter's clock (`DECIDED_AT_HEADER`, ms; Redis's
  `TIME` with `"clock": "redis"`), and every response the PID of the worker that served
  it (`WORKER_HEADER`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Self

from .process import LocalProcess, free_port, pid_alive

__all__ = [
    "DECIDED_AT_HEADER",
    "OPTIONS_ENV",
    "UNLIMITED_TILES",
    "WORKER_HEADER",
    "DemoServer",
    "app_from_environment",
    "child_pids",
    "rss_bytes",
]

APP = "ratelimit.demo:app"
FACTORY = "ratelimit.devtools.demo_server:app_from_environment"
OPTIONS_ENV = "RATELIMIT_DEMO_OPTIONS"
DECIDED_AT_HEADER = "X-RateLimit-Decided-At-Ms"
WORKER_HEADER = "X-Worker-Pid"
UNLIMITED_TILES = "/unlimited/tiles/{z}/{x}/{y}.png"
MAX_WORKERS = 64


class DemoServer(LocalProcess):
    """`uvicorn ratelimit.demo:app` on a free loopback port, stopped by its PID.

        with DemoServer() as server:          # started on enter, answering /healthz
            httpx.get(server.url + "/within?lng=13.4&lat=52.5&radius=500")

    `redis_url=None` runs the server on the embedded backend (REDIS_URL removed from
    its environment); a URL points it at that Redis (every worker connects to it).
    `workers`: uvicorn worker processes (`--workers`; 1 runs the app in the server
    process itself). `app_options` and `tcp_nodelay`: see the module doc. The server's
    output goes to a log file of its own, quoted when it fails to start. A server still
    running when this Python process exits is stopped then.
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        args: Iterable[str] = (),
        workers: int = 1,
        app_options: Mapping[str, Any] | None = None,
        tcp_nodelay: bool = True,
    ) -> None:
        if (
            isinstance(workers, bool)
            or not isinstance(workers, int)
            or not (1 <= workers <= MAX_WORKERS)
        ):
            raise ValueError(f"workers must be an int from 1 to {MAX_WORKERS}, got {workers!r}")
        if app_options is not None:
            if not isinstance(app_options, Mapping):
                raise ValueError(f"app_options must be a mapping, got {app_options!r}")
            try:
                json.dumps(dict(app_options))
            except (TypeError, ValueError):
                raise ValueError(
                    f"app_options must be JSON-serialisable (they travel in ${OPTIONS_ENV}), "
                    f"got {app_options!r}"
                ) from None
        super().__init__()
        self.redis_url = redis_url
        self.args = tuple(args)
        self.workers = workers
        self.app_options = None if app_options is None else dict(app_options)
        self.tcp_nodelay = bool(tcp_nodelay)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"http://127.0.0.1:{self.port}"

    def command(self, port: int) -> list[str]:
        app = [APP] if self.app_options is None else [FACTORY, "--factory"]
        workers = ["--workers", str(self.workers)] if self.workers > 1 else []
        launcher = __name__ if workers and self.tcp_nodelay else "uvicorn"
        return [
            sys.executable, "-m", launcher, *app,
            "--host", "127.0.0.1", "--port", str(port),
            "--no-proxy-headers", "--log-level", "warning", *workers, *self.args,
        ]  # fmt: skip

    def worker_pids(self) -> list[int]:
        """The PIDs of the worker processes (the server's own PID with one worker)."""
        if not self.running or self.pid is None:
            return []
        if self.workers == 1:
            return [self.pid]
        # uvicorn's supervisor also runs multiprocessing's resource tracker: a worker is
        # a child that multiprocessing spawned to run a function.
        return [pid for pid in child_pids(self.pid) if b"spawn_main" in _cmdline(pid)]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its PID; uvicorn's supervisor stops its workers, and any
        worker still alive after it (the supervisor was killed first) is killed by its
        PID, noted before the supervisor went."""
        workers = self.worker_pids() if self.workers > 1 else []
        super().stop(timeout)
        for pid in workers:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def start(self, timeout: float = 30.0) -> Self:
        """Start the server and return once `/healthz` answers and every worker process
        is up (RuntimeError if it won't)."""
        if self.running:
            return self
        import httpx

        env = dict(os.environ)
        env.pop("REDIS_URL", None)
        env.pop(OPTIONS_ENV, None)
        if self.redis_url is not None:
            env["REDIS_URL"] = self.redis_url
        if self.app_options is not None:
            env[OPTIONS_ENV] = json.dumps(self.app_options)
        workdir = self._workdir("ratelimit-demo-")
        for _attempt in range(3):  # a free port can be taken before uvicorn binds it
            self.port = free_port()
            log_path = workdir / f"uvicorn-{self.port}.log"
            process = self._spawn(self.command(self.port), log_path, env)
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    answered = httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200
                except httpx.HTTPError:
                    answered = False
                if answered and len(self.worker_pids()) == self.workers:
                    return self
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


def child_pids(pid: int) -> list[int]:
    """The PIDs of the live processes whose parent is `pid` (from /proc; Linux)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.append(int(entry.name))
    return sorted(children)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def rss_bytes(pid: int) -> int | None:
    """The resident set size of process `pid` in bytes (VmRSS), None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def app_from_environment() -> Any:
    """`create_app(**options)` from `$RATELIMIT_DEMO_OPTIONS` (JSON), plus the unlimited
    tiles route and, with `"trace_headers": true`, the trace headers (module doc)."""
    from fastapi import Depends, Response

    from .. import demo

    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    trace = bool(options.pop("trace_headers", False))
    app = demo.create_app(**options)

    # No annotations: this module's are strings, which FastAPI would resolve in its globals.
    tile_dependency = Depends(demo.tile_params)

    @app.get(
        UNLIMITED_TILES,
        summary="A map tile, not rate limited (a baseline)",
        response_class=Response,
    )
    async def unlimited_tile(tile=tile_dependency):  # type: ignore[no-untyped-def]
        return Response(demo.tile_png(tile.z, tile.x, tile.y), media_type="image/png")

    if trace:
        app.add_middleware(_TraceHeaders)
    return app


class _TraceHeaders:
    """ASGI middleware: the decision time of an admitted check, and the worker's PID."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pid = str(os.getpid()).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((WORKER_HEADER.lower().encode(), self.pid))
                # The dependency leaves its RateLimitInfo in the request's state, which
                # Starlette keeps in the scope; only admitted requests get that far.
                info = scope.get("state", {}).get("rate_limit")
                decided = getattr(getattr(info, "decision", None), "decided_at_ms", None)
                if decided is not None:
                    headers.append((DECIDED_AT_HEADER.lower().encode(), str(decided).encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _as_tcp(sock: socket.socket) -> socket.socket:
    """The same listening socket, its protocol named (IPPROTO_TCP) so that asyncio sets
    TCP_NODELAY on each connection it accepts."""
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto == 0:
        return socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    return sock


def main() -> None:
    """`python -m ratelimit.devtools.demo_server ARGS` runs `uvicorn ARGS` with the
    listening socket marked as TCP (module doc)."""
    import uvicorn.config
    import uvicorn.main

    bind_socket = uvicorn.config.Config.bind_socket

    def bind_tcp_socket(config: uvicorn.config.Config) -> socket.socket:
        return _as_tcp(bind_socket(config))

    uvicorn.config.Config.bind_socket = bind_tcp_socket  # type: ignore[method-assign]
    uvicorn.main.main(prog_name="uvicorn")


if __name__ == "__main__":
    main()

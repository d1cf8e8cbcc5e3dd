"""`make lab` end to end: a headless Jupyter server on notebooks/, its REST API and a kernel.

Starts `jupyter lab` from the venv the way the Makefile does (loopback, no browser, root
dir notebooks/, --allow-root as root) on a free port with a token of this run's own,
lists the chapters through /api/contents, starts a kernel through /api/kernels and runs
`import ratelimit` in it over the kernel's websocket. The kernel is deleted and the
server stopped by its PID (kernels it left behind too) however the test ends.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
import websocket

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = ROOT / "notebooks"
CHAPTERS = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0  # seconds for the server to answer; it usually takes 2-4 s
EXEC_TIMEOUT = 30.0  # seconds for the kernel to run one cell and go idle
STOP_TIMEOUT = 10.0  # seconds for each step of shutting the server down


@dataclass
class Lab:
    base: str
    token: str
    proc: subprocess.Popen
    log: Path

    def url(self, path: str) -> str:
        return f"{self.base}{path}?token={self.token}"

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_answering(lab: Lab) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last = "no answer yet"
    while time.monotonic() < deadline:
        if lab.proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {lab.proc.returncode}:\n{lab.log_tail()}")
        try:
            status, _ = lab.request("GET", "/api/status")
            if status == 200:
                return
            last = f"HTTP {status}"
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    pytest.fail(f"jupyter lab did not answer within {START_TIMEOUT:.0f} s ({last}):\n"
                f"{lab.log_tail()}")


def _stop(lab: Lab) -> None:
    """SIGTERM the server (it shuts its kernels down), SIGKILL whatever of its tree is left."""
    try:
        tree = psutil.Process(lab.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    if lab.proc.poll() is None:
        lab.proc.send_signal(signal.SIGTERM)
        try:
            lab.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            lab.proc.kill()
            lab.proc.wait(STOP_TIMEOUT)
    _, alive = psutil.wait_procs(tree, timeout=STOP_TIMEOUT)
    for child in alive:  # kernels run in sessions of their own: not reached by the server's
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=STOP_TIMEOUT)


@contextmanager
def running_lab(root: Path, home: Path) -> Iterator[Lab]:
    """`jupyter lab` on `root` as `make lab` starts it (loopback, token, --allow-root
    as root), with its runtime, data and config under `home`; stopped by PID."""
    token = secrets.token_hex(16)
    port = _free_port()
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    # Connection files, config, the signing key and the server's own state stay in home.
    env["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")
    env["JUPYTER_DATA_DIR"] = str(home / "data")
    env["JUPYTER_CONFIG_DIR"] = str(home / "config")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(home / "workspaces")
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    cmd = [
        str(VENV_BIN / "jupyter"), "lab",
        f"--ServerApp.root_dir={root}",
        "--ip", "127.0.0.1", "--port", str(port), "--ServerApp.port_retries=0",
        "--no-browser", f"--IdentityProvider.token={token}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = home / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    server = Lab(f"http://127.0.0.1:{port}", token, proc, log)
    try:
        _wait_until_answering(server)
        yield server
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with running_lab(NOTEBOOK_DIR, tmp_path_factory.mktemp("jupyter")) as server:
        yield server


@pytest.fixture
def kernel_id(lab: Lab) -> Iterator[str]:
    status, kernel = lab.request("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    try:
        yield kernel["id"]
    finally:
        try:
            status, _ = lab.request("DELETE", f"/api/kernels/{kernel['id']}")
            assert status == 204
        except urllib.error.URLError:
            if lab.proc.poll() is None:
                raise


def _execute(lab: Lab, kernel_id: str, code: str) -> tuple[str, dict]:
    """Runs CODE over the kernel's websocket; returns its stdout and the execute_reply."""
    ws_url = lab.url(f"/api/kernels/{kernel_id}/channels").replace("http://", "ws://", 1)
    ws = websocket.create_connection(ws_url, timeout=EXEC_TIMEOUT)
    try:
        msg_id = uuid.uuid4().hex
        ws.send(json.dumps({
            "channel": "shell",
            "header": {
                "msg_id": msg_id, "msg_type": "execute_request", "session": uuid.uuid4().hex,
                "username": "test", "version": "5.3", "date": datetime.now(UTC).isoformat(),
            },
            "parent_header": {},
            "metadata": {},
            "content": {
                "code": code, "silent": False, "store_history": False,
                "user_expressions": {}, "allow_stdin": False, "stop_on_error": True,
            },
            "buffers": [],
        }))
        stdout: list[str] = []
        reply: dict | None = None
        idle = False
        deadline = time.monotonic() + EXEC_TIMEOUT
        while reply is None or not idle:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"no execute_reply and idle status within {EXEC_TIMEOUT:.0f} s; "
                            f"stdout so far {''.join(stdout)!r}")
            ws.settimeout(remaining)
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream" and msg["content"]["name"] == "stdout":
                stdout.append(msg["content"]["text"])
            elif kind == "error":
                pytest.fail("the kernel raised: " + "\n".join(msg["content"]["traceback"]))
            elif kind == "execute_reply":
                reply = msg["content"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return "".join(stdout), reply
    finally:
        ws.close()


def test_contents_lists_every_chapter(lab: Lab) -> None:
    assert CHAPTERS, "no notebooks/[0-9]*.ipynb to list"
    status, listing = lab.request("GET", "/api/contents")
    assert status == 200
    assert listing["type"] == "directory"
    notebooks = {item["name"] for item in listing["content"] if item["type"] == "notebook"}
    assert set(CHAPTERS) <= notebooks, f"missing: {sorted(set(CHAPTERS) - notebooks)}"


def test_kernel_imports_the_library(lab: Lab, kernel_id: str) -> None:
    status, kernels = lab.request("GET", "/api/kernels")
    assert status == 200
    assert kernel_id in {k["id"] for k in kernels}

    out, reply = _execute(lab, kernel_id, "import ratelimit; print(ratelimit.__name__)")
    assert reply["status"] == "ok", reply
    assert out == "ratelimit\n"
